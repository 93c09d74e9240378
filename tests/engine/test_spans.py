"""Request spans of a running engine (tiny preset, float32 on CPU) whose cache is too small for its requests:
preemptions and resumptions are in them, and every completion token is sampled once, by a prompt chunk that
completes a (re)computation or by a decode step; without tracing the steps list no batch."""

import os
import queue
import time

import torch

from rooftop.engine.engine import Engine, StepRecord
from rooftop.engine.kv.cache import KVCache
from rooftop.engine.model.config import PRESETS
from rooftop.engine.model.weights import random_model
from rooftop.engine.sequence import SamplingParams
from rooftop.engine.spans import RequestTrace, SpanBuilder, parse_traceparent

PAGE = 16


def attrs(items) -> dict:
    out = {}
    for kv in items:
        kind = kv.value.WhichOneof("value")
        v = getattr(kv.value, kind)
        out[kv.key] = [getattr(x, x.WhichOneof("value")) for x in v.values] if kind == "array_value" else v
    return out


def run(trace_steps: bool, prompts: list[list[int]], max_tokens: int):
    """Serve the prompts together on a 12-page cache; the step records and each request's front-end trace."""
    cache = KVCache(PRESETS["tiny"], num_blocks=12, block_size=PAGE, dtype=torch.float32, device=torch.device("cpu"))
    engine = Engine(random_model(PRESETS["tiny"], seed=0), cache, context_length=128, chunked_prefill_size=32,
                    cuda_graphs=False, enable_prefix_caching=False)
    engine.trace_steps = trace_steps
    records: list[StepRecord] = []
    engine.step_listeners.append(records.append)
    traces, sinks = [], []
    engine.start()
    try:
        for i, prompt in enumerate(prompts):
            sinks.append(queue.Queue())
            t = RequestTrace(f"req-{i}", time.time_ns(), os.urandom(16), num_prompt_tokens=len(prompt))
            t.seq_id = engine.submit(prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                                     [], sinks[-1].put)
            traces.append(t)
        for t, sink in zip(traces, sinks, strict=True):
            while (ev := sink.get(timeout=120)).finish_reason is None:
                t.first_token_ns = t.first_token_ns or time.time_ns()
            assert ev.error is None, ev.error
            t.finish_ns, t.finish_reason, t.num_completion_tokens = time.time_ns(), ev.finish_reason, ev.num_completion_tokens
            t.end_ns = t.finish_ns
    finally:
        engine.stop()
    return records, traces


def test_preempted_requests_show_it_and_sample_each_token_once():
    # four 40-token prompts growing to 100 tokens each in 12 pages of 16: some are preempted and recompute
    prompts = [[256] + [(7 * i + j) % 256 for j in range(39)] for i in range(4)]
    records, traces = run(True, prompts, 60)
    builder = SpanBuilder()
    steps = {r.step_id: builder.add_step(r) for r in records}
    assert [r.step_id for r in records] == list(range(len(records)))
    for t in traces:
        builder.add_request(t, time.monotonic())
    spans = builder.ready(time.monotonic(), flush=True)
    requests = {attrs(s.attributes)["gen_ai.request.id"]: s for s in spans if s.name == "llm_request"}
    assert set(requests) == {t.request_id for t in traces}
    num_preempted = 0
    for t in traces:
        span = requests[t.request_id]
        a = attrs(span.attributes)
        children = [s for s in spans if s.parent_span_id == span.span_id]
        chunks = [attrs(c.attributes) for c in children if c.name == "prefill_chunk"]
        decode = [attrs(c.attributes) for c in children if c.name == "decode"]
        events = [(e.name, e.time_unix_nano) for e in span.events]
        preempted = [ns for name, ns in events if name == "preempted"]
        resumed = [ns for name, ns in events if name == "resumed"]
        assert a["rooftop.num_preemptions"] == len(preempted) == len(resumed)
        assert all(p < r for p, r in zip(preempted, resumed, strict=True))
        num_preempted += len(preempted)
        # a chunk goes on where the last ended, or from 0 after a preemption (no prefix cache here)
        at = 0
        for c in chunks:
            assert c["rooftop.chunk.cached_tokens"] in (at, 0)
            at = c["rooftop.chunk.cached_tokens"] + c["rooftop.chunk.tokens"]
        # in step order, a chunk that completes the tokens so far samples the next one, as does each decode step
        num_tokens = t.num_prompt_tokens
        decode_steps = [i for d in decode for i in range(d["rooftop.decode.first_step_id"],
                                                         d["rooftop.decode.last_step_id"] + 1)]
        assert a["rooftop.decode.num_steps"] == len(decode_steps) == sum(d["rooftop.decode.num_steps"] for d in decode)
        entries = [(c["rooftop.step.id"], c) for c in chunks] + [(i, None) for i in decode_steps]
        for _, c in sorted(entries, key=lambda e: e[0]):
            if c is None or c["rooftop.chunk.cached_tokens"] + c["rooftop.chunk.tokens"] == num_tokens:
                num_tokens += 1
        assert num_tokens - t.num_prompt_tokens == t.num_completion_tokens == 60
        assert a["rooftop.prefill.computed_tokens"] == sum(c["rooftop.chunk.tokens"] for c in chunks)
        # its chunks' steps list it; each of its decode steps decodes someone
        for c in chunks:
            assert a["rooftop.engine.seq_id"] in attrs(steps[c["rooftop.step.id"]].attributes)[
                "rooftop.step.prefill_seq_ids"]
        assert all(attrs(steps[i].attributes)["rooftop.step.decode_seqs"] >= 1 for i in decode_steps)
    assert num_preempted > 0
    assert num_preempted == sum(r.num_preemptions for r in records)


def test_without_tracing_the_steps_list_no_batch():
    records, _ = run(False, [[256, 1, 2, 3]], 3)
    assert records and all(r.batch is None and r.preempted is None and r.queued is None for r in records)
    assert [r.step_id for r in records] == list(range(len(records)))
    assert all(0 < r.start_ns <= r.end_ns for r in records)


def test_traceparent_is_read_as_w3c_writes_it():
    assert parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") == (
        bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736"), bytes.fromhex("00f067aa0ba902b7"))
    for bad in (None, "", "00-xyz-00f067aa0ba902b7-01", "00-" + "0" * 32 + "-00f067aa0ba902b7-01"):
        assert parse_traceparent(bad) is None
