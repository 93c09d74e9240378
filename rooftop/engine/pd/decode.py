"""The decode role: take prefilled sequences off the KV port, decode them on, stream them to the router.

A prefill worker connects to the KV port and sends one frame per request (see transport.py); the sequence
gets fresh pages, its rows are written in on the engine thread, its first token is delivered, and it decodes
from there without recomputing the prompt. The router then posts `/pd/stream {"request_id"}` and gets the
OpenAI reply (SSE or JSON, as the client asked) from the first token on. A sequence nobody claims within
CLAIM_TIMEOUT_S is aborted. `/pd/drop {"request_id"}` (the router, when its client left before it claimed the
stream) aborts the sequence now, or refuses its frame if it has not come yet.
"""

import asyncio
import base64
import contextlib
import json
import socket
import time
from dataclasses import dataclass

import torch
from fastapi import FastAPI, Request

from rooftop.engine.api_schemas import ApiError
from rooftop.engine.engine import Engine
from rooftop.engine.openai_format import Reply
from rooftop.engine.pd.metrics import PDMetrics
from rooftop.engine.pd.transport import (
    TransferError,
    check_rows_fit,
    payload_size,
    read_frame,
    rows_from_payload,
    write_frame,
    write_rows,
)
from rooftop.engine.sampler import make_generator
from rooftop.engine.sequence import SamplingParams, Sequence
from rooftop.engine.serving import Prepared, ServerState, respond

CLAIM_TIMEOUT_S = 60.0


@dataclass(slots=True)
class _Handed:
    """A sequence handed over by a prefill worker, decoding, waiting for the router to stream it."""

    prep: Prepared
    seq_id: int
    inbox: asyncio.Queue
    claim_timer: asyncio.TimerHandle | None = None


class DecodeSide:
    """The KV listener and the handed-over sequences of one decode worker."""

    def __init__(self, state: ServerState, sock: socket.socket):
        self.state = state
        self.sock = sock
        self.metrics = PDMetrics(state.metrics.registry, state.model_name, "decode")
        self.handed: dict[str, _Handed] = {}
        self.dropped: dict[str, float] = {}  # request id -> until when (monotonic s) its frame is refused
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._on_connection, sock=self.sock)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        start, start_ns = time.perf_counter(), time.time_ns()
        try:
            try:
                header, payload, frame_bytes = await read_frame(reader)
            except (asyncio.IncompleteReadError, OSError):
                self.metrics.failed("disconnected")
                return
            except TransferError as exc:
                self.metrics.failed(exc.reason)
                await write_frame(writer, {"ok": False, "error": str(exc)})
                return
            try:
                await self._take_over(header, payload, (frame_bytes, start_ns))
            except TransferError as exc:
                self.metrics.failed(exc.reason)
                await write_frame(writer, {"ok": False, "error": str(exc)})
                return
            except Exception as exc:  # noqa: BLE001 - e.g. rows that do not fit: that request fails, not us
                self.metrics.failed("refused")
                await write_frame(writer, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                return
            await write_frame(writer, {"ok": True})
            self.metrics.transferred(frame_bytes, time.perf_counter() - start)
        except OSError:  # the prefill worker went away while we answered: its request fails there
            self.metrics.failed("disconnected")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _take_over(self, header: dict, payload: bytearray, received: tuple[int, int]) -> None:
        """Give the sequence pages, write its rows, deliver its first token; TransferError('refused') if not.
        received: the frame's bytes and when it began to arrive (time.time_ns()), for its trace."""
        engine = self.state.engine
        if engine is None:
            raise TransferError("this decode worker is still loading", "refused")
        cache = engine.runner.cache
        try:
            request_id = str(header["request_id"])
            why = check_rows_fit(header, cache)
            if why is None and payload_size(header) != len(payload):
                why = f"payload of {len(payload)} bytes, the header describes {payload_size(header)}"
            if why is None and header["num_tokens"] != len(header["prompt_token_ids"]):
                why = f"{header['num_tokens']} rows for a {len(header['prompt_token_ids'])}-token prompt"
            if why is None and request_id in self.handed:
                why = f"request {request_id} is already here"
            if why is not None:
                raise TransferError(f"bad frame: {why}", "bad_frame")
            if self.dropped.pop(request_id, None) is not None:
                raise TransferError(f"request {request_id} was dropped: its client left", "refused")
            params = SamplingParams(**header["params"])
            r = header["reply"]
            reply = Reply(r["model"], r["chat"], r["num_prompt_tokens"], r["prompt_token_ids"], r["num_logprobs"])
            reply.request_id, reply.created = r["request_id"], r["created"]
            reply.echo = str(r.get("echo") or "")  # completions with echo: the prompt's text goes first
            prep = Prepared(header["prompt_token_ids"], params, header["stops"], header["stream"],
                            header["include_usage"], reply)
            first = header["first"]
            first_token = (int(first["token_id"]), float(first["logprob"]), [(int(i), float(lp)) for i, lp in first["top"]])
        except (KeyError, TypeError, ValueError) as exc:
            raise TransferError(f"bad frame: header field {exc}", "bad_frame") from None
        rows = rows_from_payload(header, payload)
        seq = Sequence(prep.prompt_ids, params, arrival_ns=time.perf_counter_ns())
        _restore_generator(seq, header.get("generator_state"), cache.device)
        inbox, sink = self.state.inbox()
        try:
            await asyncio.wrap_future(engine.adopt(seq, prep.stops, sink, lambda s: write_rows(cache, s.block_table, rows),
                                                   first_token))
        except RuntimeError as exc:
            raise TransferError(f"cannot take the sequence over: {exc}", "refused") from None
        if self.state.tracer is not None:
            trace = header.get("trace") if isinstance(header.get("trace"), dict) else {}
            self.state.trace(prep, str(trace.get("request_id") or request_id), trace.get("traceparent"), received[1],
                             trace.get("trace_id"))
            prep.trace.seq_id, prep.trace.first_token_ns = seq.seq_id, time.time_ns()  # adopt delivered it
            prep.trace.kv = ("received", received[0], received[1], prep.trace.first_token_ns)
        handed = _Handed(prep, seq.seq_id, inbox)
        handed.claim_timer = asyncio.get_running_loop().call_later(CLAIM_TIMEOUT_S, self._expire, request_id)
        self.handed[request_id] = handed
        if self.dropped.pop(request_id, None) is not None:  # dropped while the engine adopted it
            self.drop(request_id)

    def _expire(self, request_id: str) -> None:
        handed = self.handed.pop(request_id, None)
        if handed is not None:  # the router never came for it: free its pages
            self.state.ready_engine().abort(handed.seq_id)
            self.state.metrics.finished("abort")
            if handed.prep.trace is not None:
                handed.prep.trace.finish_ns, handed.prep.trace.finish_reason = time.time_ns(), "abort"
                handed.prep.trace.close()

    def drop(self, request_id: str) -> bool:
        """Abort an unclaimed sequence (True), or refuse its frame should it come within CLAIM_TIMEOUT_S (False):
        its client left while the router waited on the prefill worker, so nobody will claim it."""
        now = time.monotonic()
        self.dropped = {r: t for r, t in self.dropped.items() if t > now}
        handed = self.handed.get(request_id)
        if handed is None:
            self.dropped[request_id] = now + CLAIM_TIMEOUT_S
            return False
        if handed.claim_timer is not None:
            handed.claim_timer.cancel()
        self._expire(request_id)
        return True

    def claim(self, request_id: str) -> _Handed:
        handed = self.handed.pop(request_id, None)
        if handed is None:
            raise ApiError(404, f"request {request_id!r} is not on this decode worker (never arrived, or expired "
                           f"after {CLAIM_TIMEOUT_S:.0f} s)", param="request_id", code="not_found")
        if handed.claim_timer is not None:
            handed.claim_timer.cancel()
        return handed


def _restore_generator(seq: Sequence, state_b64: str | None, device: torch.device) -> None:
    """Seeded sampling goes on from the prefill worker's generator state (CPU only; on CUDA it restarts)."""
    if state_b64 is None or seq.params.seed is None or device.type != "cpu":
        return
    seq.generator = make_generator(seq.params.seed, device)
    seq.generator.set_state(torch.frombuffer(bytearray(base64.b64decode(state_b64)), dtype=torch.uint8))


async def _request_id(request: Request) -> str:
    """The `request_id` of a router's `{"request_id": ...}` body; a 400 that says so if there is none."""
    try:
        return str(json.loads(await request.body())["request_id"])
    except (ValueError, KeyError, TypeError):
        raise ApiError(400, 'expected {"request_id": ...}', param="request_id") from None


def add_decode_role(app: FastAPI, state: ServerState, kv_sock: socket.socket) -> str:
    """Add the KV listener (on the server's event loop), `/pd/stream` and the PD metrics; returns the ready-line note."""
    side = DecodeSide(state, kv_sock)
    state.kv_port = kv_sock.getsockname()[1]

    def attach(engine: Engine) -> None:
        engine.step_listeners.append(side.metrics.on_step)

    state.on_engine.append(attach)
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a):
        await side.start()
        try:
            async with inner(a) as value:
                yield value
        finally:
            await side.stop()

    app.router.lifespan_context = lifespan

    @app.post("/pd/stream")
    async def pd_stream(request: Request):
        handed = side.claim(await _request_id(request))
        return await respond(handed.prep, state.drain(handed.seq_id, handed.inbox, handed.prep.trace), request)

    @app.post("/pd/drop")
    async def pd_drop(request: Request):
        request_id = await _request_id(request)
        return {"request_id": request_id, "aborted": side.drop(request_id)}

    return f" (kv port {state.kv_port})"
