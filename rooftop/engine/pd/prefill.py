"""The prefill role: prefill a request, sample its first token, send its KV and that token to a decode worker.

The router posts `/pd/prefill` with `{"request_id", "decode_kv": "HOST:PORT", "chat", "request": {...}, "trace":
{"request_id", "trace_id", "traceparent"}}` (trace: the ids its spans and the decode worker's carry); the
reply is `{"request_id", "transfer_bytes", "transfer_seconds"}` once the decode worker holds the sequence, or
an OpenAI-style error (400 for a bad request, 502 naming the decode worker when the transfer fails).
"""

import base64
import dataclasses
import json
import time

from fastapi import FastAPI, Request

from rooftop.engine.api_schemas import ApiError, ChatRequest, CompletionRequest, parse_body
from rooftop.engine.disconnect import until_disconnected
from rooftop.engine.pd.metrics import PDMetrics
from rooftop.engine.pd.transport import KVRows, TransferError, read_rows, send_kv
from rooftop.engine.sequence import Sequence
from rooftop.engine.serving import Prepared, ServerState

TRANSFER_TIMEOUT_S = 120.0


def parse_host_port(text: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); ApiError(400) when it is neither."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ApiError(400, f"decode_kv {text!r} is not HOST:PORT", param="decode_kv")
    return host.strip("[]"), int(port)


def kv_header(request_id: str, prep: Prepared, first, rows: KVRows, generator_state: bytes | None,
              page_size: int, trace: dict | None = None) -> dict:
    """What the decode worker needs to go on as if it had prefilled the request itself."""
    r = prep.reply
    return {
        "request_id": request_id,
        "prompt_token_ids": prep.prompt_ids,
        "first": {"token_id": first.token_id, "logprob": first.logprob, "top": first.top},
        "params": dataclasses.asdict(prep.params),
        "stops": prep.stops, "stream": prep.stream, "include_usage": prep.include_usage,
        "reply": {"model": r.model, "chat": r.chat, "num_prompt_tokens": r.num_prompt_tokens,
                  "prompt_token_ids": r.prompt_token_ids, "num_logprobs": r.num_logprobs,
                  "request_id": r.request_id, "created": r.created, "echo": r.echo},
        "generator_state": base64.b64encode(generator_state).decode() if generator_state is not None else None,
        "page_size": page_size,
        "trace": trace,
        **rows.describe(),
    }


def add_prefill_role(app: FastAPI, state: ServerState) -> PDMetrics:
    """Add `/pd/prefill` and the transfer metrics to a server's app."""
    metrics = PDMetrics(state.metrics.registry, state.model_name, "prefill")

    @app.post("/pd/prefill")
    async def pd_prefill(request: Request):
        arrival_ns = time.time_ns()
        try:
            outer = json.loads(await request.body())
        except ValueError as exc:
            raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
        if not isinstance(outer, dict) or not isinstance(outer.get("request"), dict):
            raise ApiError(400, "expected {request_id, decode_kv, chat, request: {...}}", code="invalid_value")
        # the router closes its connection when its client leaves: the prefill (and the hand-off) stop too,
        # so the decode worker is never handed a request nobody reads
        return await until_disconnected(request, _traced(outer, arrival_ns))

    async def _traced(outer: dict, arrival_ns: int) -> dict:
        request_id, chat = str(outer.get("request_id", "")), bool(outer.get("chat"))
        req = parse_body(ChatRequest if chat else CompletionRequest, json.dumps(outer["request"]).encode())
        prep = state.prepare(req, chat)
        trace = outer.get("trace") if isinstance(outer.get("trace"), dict) else {}
        state.trace(prep, str(trace.get("request_id") or request_id), trace.get("traceparent"), arrival_ns,
                    trace.get("trace_id"))
        try:
            return await _prefill(outer, request_id, prep, trace)
        finally:
            if prep.trace is not None:
                prep.trace.close()

    async def _prefill(outer: dict, request_id: str, prep: Prepared, trace: dict) -> dict:
        host, port = parse_host_port(str(outer.get("decode_kv", "")))
        engine = state.ready_engine()
        # max_tokens=1: the prompt and its first token only; min_tokens still bars <eos> from that token
        first_only = dataclasses.replace(prep, params=dataclasses.replace(prep.params, max_tokens=1))
        out: dict = {}

        def export(seq: Sequence) -> None:  # on the engine thread, before the pages go back
            try:
                out["rows"] = read_rows(engine.runner.cache, seq.block_table, seq.num_prompt_tokens)
                gen = seq.generator
                # a seeded sampler goes on from the same state (a CPU generator's state moves between hosts)
                on_cpu = gen is not None and gen.device.type == "cpu"
                out["generator"] = gen.get_state().numpy().tobytes() if on_cpu else None
            except Exception as exc:  # noqa: BLE001 - becomes this request's error, not the engine's
                out["error"] = f"{type(exc).__name__}: {exc}"

        events = [ev async for ev in state.events(first_only, export_kv=export)]
        last = events[-1]
        if last.finish_reason == "error":
            raise ApiError(500, last.error or "engine error", code="engine_error")
        if "rows" not in out:
            raise ApiError(500, f"could not read the prompt's KV out of the cache: {out.get('error')}",
                           code="engine_error")
        header = kv_header(request_id, prep, last, out["rows"], out.get("generator"), engine.runner.cache.block_size,
                           trace or None)
        start, start_ns = time.perf_counter(), time.time_ns()
        try:
            sent = await send_kv(host, port, header, out["rows"], TRANSFER_TIMEOUT_S)
        except TransferError as exc:
            metrics.failed(exc.reason)
            raise ApiError(502, str(exc), code="kv_transfer_failed") from None
        seconds = time.perf_counter() - start
        metrics.transferred(sent, seconds)
        if prep.trace is not None:
            prep.trace.kv = ("sent", sent, start_ns, time.time_ns())
        return {"request_id": request_id, "transfer_bytes": sent, "transfer_seconds": seconds}

    return metrics
