"""Grow a real Kineto trace to a given size by repeating its steps, shifted in time and in ids.

Each copy of the source's events is moved past the previous copy in time and gets fresh correlation
and External ids, so joins stay one-to-one. The file keeps Kineto's layout: all CPU ops and
annotations first, then all python_function events, then the runtime calls and GPU activity; each
section in time order. That layout is the hard case for a streaming reader: a step's kernels come a
whole file-section after its ops.

    .venv/bin/python benchmarks/grow_trace.py tests/profile/data/h200_capacity_ctx262144.json.gz \
        /tmp/big3.json --size-gb 3
"""

import argparse
import gzip
import json
from pathlib import Path

import msgspec

# file sections in Kineto's order; an event's section is that of its category
_SECTIONS = ({"user_annotation", "cpu_op"}, {"python_function"})


def _section(event: dict) -> int:
    cat = event.get("cat")
    for i, cats in enumerate(_SECTIONS):
        if cat in cats:
            return i
    return len(_SECTIONS)


def grow(src: Path, dst: Path, size_bytes: int = 0, copies: int = 0) -> int:
    """Write `dst`: the source's events repeated `copies` times, or until the file reaches `size_bytes`;
    returns the copies."""
    opener = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rb") as f:
        top = json.load(f)
    events = top.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    sections: list[list[dict]] = [[] for _ in range(len(_SECTIONS) + 1)]
    for e in events:
        if e.get("ph") != "M":
            sections[_section(e)].append(e)
    timed = [e for e in events if "ts" in e]
    span_us = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000.0
    ids = [e.get("args", {}).get(k) for e in events for k in ("correlation", "External id")]
    id_span = max(i for i in ids if isinstance(i, int)) + 1
    flow_span = max((e["id"] for e in events if isinstance(e.get("id"), int)), default=0) + 1
    per_copy = sum(len(msgspec.json.encode(s)) for s in sections)
    copies = copies or max(1, -(-size_bytes // per_copy))

    encoder = msgspec.json.Encoder()
    head = msgspec.json.encode(top)
    with open(dst, "wb") as out:
        out.write(head[:-1] + b', "traceEvents": [\n')
        out.write(b",\n".join(encoder.encode(e) for e in meta))
        for section in sections:
            for k in range(copies):
                for e in section:
                    out.write(b",\n")
                    out.write(encoder.encode(_shifted(e, k, span_us, id_span, flow_span)))
        out.write(b"\n]}\n")
    return copies


def _shifted(e: dict, k: int, span_us: float, id_span: int, flow_span: int) -> dict:
    if k == 0:
        return e
    e = dict(e)
    e["ts"] = e["ts"] + k * span_us
    if isinstance(e.get("id"), int):
        e["id"] = e["id"] + k * flow_span
    args = e.get("args")
    if args and ("correlation" in args or "External id" in args):
        args = dict(args)
        for key in ("correlation", "External id"):
            if isinstance(args.get(key), int) and args[key] > 0:
                args[key] += k * id_span
        e["args"] = args
    return e


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--size-gb", type=float, required=True)
    args = ap.parse_args()
    copies = grow(args.src, args.dst, int(args.size_gb * 1e9))
    print(f"{args.dst}: {copies} copies of {args.src}, {args.dst.stat().st_size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
