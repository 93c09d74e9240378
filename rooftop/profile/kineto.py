"""Streaming parser of PyTorch profiler (Kineto) JSON traces, plain or gzip, in bounded memory.

The `traceEvents` array is read in chunks; each chunk is cut after the last complete top-level
event and decoded by msgspec into small structs that keep only the fields rooftop uses. The events
kept (kernels, launches, CPU ops, module ranges) go to the trace's table files on disk a block at a
time (profile/spill.py): memory is one chunk and one block per table, whatever the trace's size.
"""

import gzip
import json
import re
from pathlib import Path

import msgspec

from rooftop.errors import RooftopError
from rooftop.profile.trace import KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, Trace, TraceBuilder

CHUNK_BYTES = 8 << 20
HEADER_MAX_BYTES = 64 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_WS = b" \t\r\n"
_ARRAY_END = re.compile(rb"\s*\]")


_NO_DIMS = msgspec.Raw(b"null")


class _Args(msgspec.Struct, gc=False):
    external_id: int | None = msgspec.field(default=None, name="External id")
    correlation: int | None = None
    # kept raw: shapes repeat, so they are interned by their bytes and decoded once each
    input_dims: msgspec.Raw = msgspec.field(default=_NO_DIMS, name="Input Dims")
    device: int | None = None
    stream: int | None = None


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: _Args | None = None


_DECODER = msgspec.json.Decoder(list[_Event])

# Kineto category -> what rooftop keeps (old traces use the capitalised names).
_KERNEL, _MEMCPY, _MEMSET, _LAUNCH, _OP, _PYFUNC, _ANNOT = range(7)
_CATS = {
    "kernel": _KERNEL,
    "gpu_memcpy": _MEMCPY,
    "memcpy": _MEMCPY,
    "gpu_memset": _MEMSET,
    "memset": _MEMSET,
    "cuda_runtime": _LAUNCH,
    "cuda_driver": _LAUNCH,
    "runtime": _LAUNCH,
    "cpu_op": _OP,
    "operator": _OP,
    "python_function": _PYFUNC,
    "user_annotation": _ANNOT,
}


def load_kineto(path: str | Path) -> Trace:
    """Parse a Kineto trace (.json or .json.gz) into a compact `Trace`."""
    path = Path(path)
    if not path.is_file():
        raise RooftopError(f"trace {path} does not exist", "pass the path of a .json or .json.gz trace")
    builder = TraceBuilder(str(path), "kineto")
    with _open(path) as stream:
        reader = _Reader(stream, path)
        try:
            _parse(reader, builder)
        except (EOFError, gzip.BadGzipFile, OSError, UnicodeDecodeError) as exc:
            raise RooftopError(
                f"trace {path} is truncated or corrupt ({exc})", "capture it again; the file was cut short"
            ) from None
    trace = builder.build()
    if not trace.has_kernels and trace.count("ops") == 0:
        raise RooftopError(
            f"trace {path} has no kernels and no CPU ops ({builder.events_read} events)",
            "profile while the engine serves requests, with activities CPU and CUDA",
        )
    return trace


def _open(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


class _Reader:
    """Reads chunks and remembers the byte offset for error messages."""

    def __init__(self, stream, path: Path):
        self.stream, self.path, self.offset = stream, path, 0

    def read(self) -> bytes:
        data = self.stream.read(CHUNK_BYTES)
        self.offset += len(data)
        return data

    def malformed(self, detail: str, at: int) -> RooftopError:
        return RooftopError(
            f"trace {self.path} is not valid trace JSON near byte {at} ({detail})",
            "check that the file is a PyTorch profiler trace and was written completely",
        )

    def truncated(self) -> RooftopError:
        return RooftopError(
            f"trace {self.path} is truncated after {self.offset} bytes: the traceEvents array never closes",
            "capture it again and wait for the profiler to finish writing",
        )


def _parse(reader: _Reader, builder: TraceBuilder) -> None:
    buf = reader.read()
    if not buf.strip(_WS):
        raise RooftopError(f"trace {reader.path} is empty", "capture it again; the profiler wrote nothing")
    first = buf.lstrip(_WS)[:1]
    if first == b"[":  # a bare chrome-trace array
        header, buf = b"", buf[buf.index(b"[") + 1 :]
    elif first == b"{":
        while True:
            match = _EVENTS_KEY.search(buf)
            if match:
                break
            more = reader.read()
            if not more or len(buf) > HEADER_MAX_BYTES:
                raise RooftopError(
                    f"trace {reader.path} has no traceEvents array",
                    "pass a PyTorch profiler (Kineto) trace: export_chrome_trace or tensorboard_trace_handler",
                )
            buf += more
        header, buf = buf[: match.start()], buf[match.end() :]
    else:
        raise reader.malformed("it does not start with '{' or '['", reader.offset - len(buf))

    tail = _read_events(reader, builder, buf)
    if header:
        try:
            top = json.loads(header + b'"traceEvents": []' + tail)
        except ValueError as exc:
            raise reader.malformed(f"top-level object: {exc}", 0) from None
        props = top.get("deviceProperties") if isinstance(top, dict) else None
        builder.device_properties = [p for p in props or [] if isinstance(p, dict)]


def _read_events(reader: _Reader, builder: TraceBuilder, buf: bytes) -> bytes:
    """Decode events chunk by chunk; returns the bytes after the array's closing bracket."""
    while True:
        cut = _decode_prefix(reader, buf)
        if cut is not None:
            events, rest, closed = cut
            _keep(events, builder)
            builder.spill()
            buf = rest
            if closed:  # the top-level keys after the array are small; keep the tail bounded anyway
                more = reader.read()
                while more and len(buf) < HEADER_MAX_BYTES:
                    buf += more
                    more = reader.read()
                return buf
        more = reader.read()
        if not more:
            raise reader.truncated()
        buf += more


def _boundaries(buf: bytes):
    """Candidate event ends, last first: (end, index of the ',' or ']' after it)."""
    pos = len(buf)
    while True:
        pos = buf.rfind(b"}", 0, pos)
        if pos < 0:
            return
        nxt = pos + 1
        while nxt < len(buf) and buf[nxt] in _WS:
            nxt += 1
        if nxt < len(buf) and buf[nxt] in b",]":
            yield pos + 1, nxt


_BYTE_AT = re.compile(r"\(byte (\d+)\)")


def _decode_prefix(reader: _Reader, buf: bytes):
    """Decode the longest prefix of whole events: (events, bytes after, array closed?) or None."""
    closing = _ARRAY_END.match(buf)
    if closing:
        return [], buf[closing.end() :], True
    start = reader.offset - len(buf)
    for tries, (end, sep) in enumerate(_boundaries(buf)):
        if tries == 64:
            raise reader.malformed("no event boundary decodes", start)
        body = b"[" + buf[:end] + b"]"
        try:
            events = _DECODER.decode(body)
        except msgspec.ValidationError as exc:
            raise reader.malformed(str(exc), start) from None
        except msgspec.DecodeError as exc:
            at = _BYTE_AT.search(str(exc))
            if at and "trailing characters" in str(exc):
                # the events array closed inside `buf`, and the '}' found is in a top-level key after it
                # (SGLang's merged traces put deviceProperties, a list of objects, last)
                closed = _closed_array(body, int(at.group(1)))
                if closed is not None:
                    return closed[0], buf[closed[1]:], True
            # A cut inside an event fails at its very end; an error before that is in the data itself.
            if at and int(at.group(1)) < len(body) - 1:
                raise reader.malformed(str(exc), start + int(at.group(1)) - 1) from None
            continue
        return events, buf[sep + 1 :], buf[sep] == ord("]")
    return None


def _closed_array(body: bytes, trailing_at: int):
    """(events, offset in the buffer just past the array's ']') where `body` ("[" + buffer + "]") holds the
    whole events array followed by more: msgspec names the first trailing byte (1-based)."""
    value = body[: trailing_at - 1].rstrip(_WS)
    if not value.endswith(b"]"):
        return None
    try:
        return _DECODER.decode(value), len(value) - 1
    except msgspec.DecodeError:
        return None


def _keep(events: list[_Event], b: TraceBuilder) -> None:
    """Keep the events analysis needs as compact rows; drop the rest (the hot loop: locals only)."""
    b.events_read += len(events)
    cats, thread_id, shape_id, name_id = _CATS, b.thread_id, b.raw_shape_id, b.name_id
    o_name, o_ts, o_dur, o_ext, o_thread, o_dims = (b.o[c].append for c in b.o)
    m_name, m_ts, m_dur, m_thread = (b.m[c].append for c in b.m)
    no_dims = _NO_DIMS
    for e in events:
        kind = cats.get(e.cat)
        if kind is None:
            if not e.cat:
                continue
            kind = cats.get(e.cat.lower())
            if kind is None:
                continue
        if e.ph != "X":
            continue
        a = e.args
        if kind == _PYFUNC:
            if e.name.startswith("nn.Module: "):
                m_name(name_id(e.name[11:]))
                m_ts(int(e.ts * 1000.0 + 0.5))
                m_dur(int(e.dur * 1000.0 + 0.5))
                m_thread(thread_id(e.pid, e.tid))
        elif kind == _OP:
            o_name(name_id(e.name))
            o_ts(int(e.ts * 1000.0 + 0.5))
            o_dur(int(e.dur * 1000.0 + 0.5))
            if a is None:
                o_ext(-1)
                o_dims(-1)
            else:
                o_ext(-1 if a.external_id is None else a.external_id)
                o_dims(-1 if a.input_dims is no_dims else shape_id(a.input_dims))
            o_thread(thread_id(e.pid, e.tid))
        elif kind == _LAUNCH:
            if a is not None and a.correlation is not None:
                ext = a.external_id if a.external_id is not None else -1
                b.add_launch(e.name, round(e.ts * 1000.0), round(e.dur * 1000.0), a.correlation, ext,
                             thread_id(e.pid, e.tid))
        elif kind == _ANNOT:
            b.add_range("annotation", e.name, round(e.ts * 1000.0), round(e.dur * 1000.0), thread_id(e.pid, e.tid))
        else:
            corr = a.correlation if a is not None and a.correlation is not None else -1
            device = a.device if a is not None and a.device is not None else (e.pid if isinstance(e.pid, int) else 0)
            stream = a.stream if a is not None and a.stream is not None else (e.tid if isinstance(e.tid, int) else 0)
            k = KIND_KERNEL if kind == _KERNEL else KIND_MEMCPY if kind == _MEMCPY else KIND_MEMSET
            b.add_kernel(e.name, round(e.ts * 1000.0), round(e.dur * 1000.0), corr, device, stream, k)
