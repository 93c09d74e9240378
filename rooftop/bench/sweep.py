"""A whole `rooftop bench` run: resolve the model, build prompts, warm up, sweep levels x repeats,
count tokens on the client, and write requests.jsonl and summary.json as it goes."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import aiohttp

from rooftop.auth import ENV, auth_headers, refused_hint
from rooftop.bench import datasets
from rooftop.bench.arrivals import ramp_mean_rate
from rooftop.bench.blocks import trace_prompts
from rooftop.bench.clocks import measure_local
from rooftop.bench.conversations import Session, sharegpt_sessions, synthetic_sessions
from rooftop.bench.engine_metrics import level_delta, scrape_totals, spec_decode_delta
from rooftop.bench.latency import join
from rooftop.bench.level import make_session, run_level
from rooftop.bench.loadgen import LevelPlan, LevelRun, Target, prompts_needed
from rooftop.bench.otlp_receiver import OtlpReceiver
from rooftop.bench.records import RequestRecord
from rooftop.bench.slo import Slo
from rooftop.bench.summary import build_summary
from rooftop.bench.telemetry import Readings, Sampler, open_sampler
from rooftop.bench.timeline import document, encode, level_events
from rooftop.bench.tokenizer import HFTokenizer, ServerTokenizer
from rooftop.bench.traces import Replay, expected_reuse, read_trace, replay
from rooftop.errors import RooftopError
from rooftop.provenance import provenance
from rooftop.redact import REDACTED
from rooftop.spec.bench import BenchSettings


@dataclass(slots=True, kw_only=True)
class BenchConfig(BenchSettings):
    """A bench run: the settings a user gave (spec/bench.py, checked by the front end that took them), and
    what the run needs besides: the server, how to talk to it, where results go, what to skip."""

    base_url: str
    model: str | None = None  # None: the first the server lists
    chat: bool = False  # /v1/chat/completions, else /v1/completions
    api_key: str | None = None  # sent as Authorization: Bearer (auth.py); never written out
    out_dir: Path | None = None  # requests.jsonl and summary.json, written as the sweep goes
    metrics_url: str | None = None  # the server's /metrics, read around each level (bench/engine_metrics.py)
    slo: Slo | None = None  # goodput and SLO capacity against it (bench/slo.py)
    grace_s: float | None = None  # past duration_s, requests in flight get this long (None: loadgen's default)
    # Closed-loop levels already measured (a resumed campaign): skipped, the others keep their prompts.
    skip_concurrency: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, settings: BenchSettings, **run) -> BenchConfig:
        """`settings` for a run: `run` gives base_url and the other run-time fields, and may override a setting."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(BenchSettings)} | run)

    def plans(self, trace: Replay | None = None) -> list[LevelPlan]:
        """The sweep's levels; a trace (`trace`: what of it a level replays) is one level on its own clock."""
        plans = self._plans(trace)
        for plan in plans:  # multi-turn: every level runs sessions
            plan.multi_turn, plan.think_time_s = self.conversations, self.think_time_s
        return plans

    def _plans(self, trace: Replay | None) -> list[LevelPlan]:
        if trace is not None:
            speed = f" x{self.trace_speedup:g}" if self.trace_speedup != 1.0 else ""
            return [LevelPlan(request_rate=trace.mean_rate, max_concurrency=self.max_concurrency,
                              num_requests=len(trace.offsets_ns), schedule_ns=trace.offsets_ns, grace_s=self.grace_s,
                              name=f"trace {self.dataset}{speed}")]
        if self.ramp_up_strategy:
            ramp = (self.ramp_up_strategy, self.ramp_up_start_rps, self.ramp_up_end_rps)
            return [LevelPlan(request_rate=ramp_mean_rate(*ramp, self.num_requests), ramp=ramp,
                              burstiness=self.burstiness, max_concurrency=self.max_concurrency,
                              num_requests=self.num_requests, duration_s=self.duration_s, grace_s=self.grace_s)]
        if self.request_rate:
            return [
                LevelPlan(request_rate=r, max_concurrency=self.max_concurrency, num_requests=self.num_requests,
                          duration_s=self.duration_s, grace_s=self.grace_s, burstiness=self.burstiness)
                for r in self.request_rate
            ]
        return [LevelPlan(concurrency=c, num_requests=self.num_requests, duration_s=self.duration_s,
                          grace_s=self.grace_s) for c in self.concurrency]


@dataclass(slots=True)
class BenchOutcome:
    summary: dict
    records: list[RequestRecord]
    level_runs: list[LevelRun]
    aborted: str | None


async def resolve_model(session: aiohttp.ClientSession, base_url: str) -> str:
    """The first model the server lists; a clear error when nothing answers there."""
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            if resp.status != 200:
                raise RooftopError(f"{url} answered HTTP {resp.status}",
                                   refused_hint(resp.status, f"--api-key (or set {ENV})")
                                   or "check --base-url, or pass --model")
            data = await resp.json()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise RooftopError(
            f"no OpenAI-compatible server answers at {base_url} ({type(exc).__name__})",
            "start the server first, or fix --base-url",
        ) from exc
    models = data.get("data") or []
    if not models:
        raise RooftopError(f"{url} lists no models", "pass --model NAME")
    return models[0]["id"]


async def server_context(session: aiohttp.ClientSession, base_url: str, model: str) -> int | None:
    """The served model's context length as its /v1/models card gives it (vLLM's and SGLang's
    max_model_len), else None."""
    try:
        async with session.get(base_url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=30)) as resp:
            data = await resp.json() if resp.status == 200 else {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    cards = data.get("data") if isinstance(data, dict) else None
    for card in cards if isinstance(cards, list) else []:
        if isinstance(card, dict) and card.get("id") == model and isinstance(card.get("max_model_len"), int):
            return card["max_model_len"]
    return None


async def build_prompts(cfg: BenchConfig, tok, n: int, seed: int, max_model_len: int | None = None,
                        dropped: dict | None = None) -> list[datasets.Prompt]:
    """A level's prompts; ShareGPT's that would not fit `max_model_len` are dropped, counted in `dropped`."""
    cfg.check_dataset()  # a caller that skipped the front ends' checks meets the same rules here
    if cfg.dataset == "random" or cfg.trace:  # a trace's warm-up: random prompts of --input-len
        return await datasets.random_prompts(tok, n, cfg.input_len, cfg.output_len, seed)
    if cfg.dataset == "conversation":  # its warm-up: single turns
        return await datasets.random_prompts(tok, n, cfg.turn_input_len, cfg.turn_output_len, seed)
        return await datasets.random_prompts(tok, n, cfg.input_len, cfg.output_len, seed)
    if cfg.dataset == "prefix":
        return await datasets.prefix_prompts(tok, n, cfg.prefix_len, cfg.input_len, cfg.output_len, seed)
    counts: dict = {}  # sharegpt, the one dataset left
    out = await datasets.sharegpt_prompts(tok, cfg.dataset_path, n, seed, cfg.output_len or None,
                                          max_model_len=max_model_len, dropped=counts)
    if dropped is not None:
        for k, v in counts.items():
            dropped[k] = dropped.get(k, 0) + v
    return out


def level_seed(cfg: BenchConfig, repeat: int, li: int) -> int:
    """The seed of a level's open-loop arrivals: its own per level and repeat, so the levels of a sweep
    do not share one draw scaled to their rates."""
    return cfg.seed + 1000 * repeat + li


class RecordWriter:
    """Appends records to requests.jsonl as each level ends (or is interrupted): nothing sent is lost."""

    def __init__(self, out_dir: Path | None):
        self.path = out_dir / "requests.jsonl" if out_dir else None
        if self.path:
            out_dir.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    def write(self, recs: list[RequestRecord]) -> None:
        if not self.path or not recs:
            return
        with self.path.open("a") as f:
            for r in recs:
                f.write(json.dumps(r.to_json_dict()) + "\n")


async def count_client_tokens(tok, recs: list[RequestRecord]) -> None:
    """The client tokenizer's count of each answer (no special tokens), beside the server's usage."""
    for r in recs:
        if r.ok:
            try:
                r.completion_tokens_client = await tok.count(r.output_text, False)
            except RooftopError:
                return  # the server went away: leave client counts empty rather than fail the run


# (concurrency: 0 for the warm-up, the records, the level's summary over its repeats so far or None
# when there is none: the warm-up, an interrupted level)
LevelDone = Callable[[int, list[RequestRecord], dict | None], None]


@contextlib.asynccontextmanager
async def open_telemetry(cfg: BenchConfig, on_note: Callable[[str], None] | None
                         ) -> AsyncIterator[tuple[Sampler | None, str | None]]:
    """(the bench's GPU sampler, None), or (None, why there is none), which `on_note` hears once unless
    telemetry was turned off; the sampler is closed on the way out."""
    if not cfg.telemetry:
        yield None, "GPU telemetry off: not asked for (--no-telemetry)"
        return
    sampler, why = await asyncio.to_thread(open_sampler, cfg.gpus, cfg.dcgm_url)
    note = None if sampler else f"GPU telemetry off: {why}"
    if note and on_note:
        on_note(note)
    try:
        yield sampler, note
    finally:
        if sampler:
            sampler.close()


def run_meta(cfg: BenchConfig, model: str) -> dict:
    """summary.json's `meta`: the server, the model, when, and the whole config (its API key redacted)."""
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    if cfg.api_key:
        config["api_key"] = REDACTED
    return {
        "base_url": cfg.base_url, "model": model,
        "endpoint": "/v1/chat/completions" if cfg.chat else "/v1/completions",
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "tokenizer": f"hf:{cfg.tokenizer}" if cfg.tokenizer else "server /tokenize",
        "config": config,
    }


def skipped(cfg: BenchConfig, plan: LevelPlan) -> bool:
    """A closed-loop level a resumed campaign measured already."""
    return plan.concurrency in cfg.skip_concurrency and plan.request_rate is None


async def build_sessions(cfg: BenchConfig, tok, seed: int, dropped: dict) -> list[Session]:
    """A level's multi-turn sessions: synthetic, or ShareGPT's conversations of two exchanges or more."""
    if cfg.dataset == "conversation":
        return await synthetic_sessions(tok, cfg.sessions, cfg.turns, cfg.turn_input_len, cfg.turn_output_len, seed)
    return await sharegpt_sessions(tok, cfg.dataset_path, cfg.sessions, seed, cfg.output_len or None, dropped)


def load_replay(cfg: BenchConfig, on_note: Callable[[str], None] | None) -> Replay | None:
    """The trace a level replays, read and checked before anything is sent (None without one); a cut to the
    level's budget is said on `on_note`."""
    if not cfg.trace:
        return None
    trace = read_trace(cfg.dataset_path, cfg.dataset)
    out = replay(trace, speedup=cfg.trace_speedup, window_s=cfg.trace_window_s, num_requests=cfg.num_requests,
                 duration_s=cfg.duration_s)
    if out.cut and on_note:
        on_note(f"{cfg.dataset_path}: {out.cut}")
    for why, n in trace.skipped.items():
        if on_note:
            on_note(f"{cfg.dataset_path}: {n} row(s) left out ({why.replace('_', ' ')})")
    return out


def trace_meta(cfg: BenchConfig, rep: Replay) -> dict:
    """summary.json's `trace`: what was replayed and what was cut."""
    return {"path": cfg.dataset_path, "format": cfg.dataset, "speedup": cfg.trace_speedup,
            "window_s": list(cfg.trace_window_s) if cfg.trace_window_s else None, "requests": len(rep.requests),
            "span_s": round(rep.offsets_ns[-1] / 1e9, 6), "mean_rate": round(rep.mean_rate, 6), "cut": rep.cut,
            "expected_prefix_reuse": expected_reuse(rep)}


async def build_all_prompts(cfg: BenchConfig, plans: list[LevelPlan], tok, http: aiohttp.ClientSession, model: str,
                            meta: dict, trace: Replay | None = None
                            ) -> tuple[list[datasets.Prompt], dict[tuple[int, int], list[datasets.Prompt]]]:
    """The warm-up's prompts, and each level's by (repeat, level index): every prompt is built before the first
    request, so tokenizer traffic never overlaps a level. ShareGPT's filter counts go into `meta`. A trace's
    blocks are salted per repeat, so that a repeat does not hit the blocks a cache kept from the one before."""
    context = await server_context(http, cfg.base_url, model) if cfg.dataset == "sharegpt" else None
    if cfg.dataset == "sharegpt" and context is None and isinstance(tok, ServerTokenizer):
        await tok.count("a", True)  # vLLM's /tokenize answers with the context too
        context = tok.max_model_len
    dropped: dict = {}
    if cfg.dataset == "sharegpt":  # how many conversations the filters dropped, over every level's draw
        meta["dataset_filter"] = {"max_model_len": context, "dropped": dropped}
    warm = await build_prompts(cfg, tok, cfg.warmup, cfg.seed + 7919, context, dropped) if cfg.warmup > 0 else []
    levels = {}
    for repeat in range(cfg.repeats):
        for li, plan in enumerate(plans):
            if skipped(cfg, plan):
                continue  # seeded by its index: the levels that run get the prompts they always had
            if trace is not None:
                levels[repeat, li] = await trace_prompts(tok, trace.requests, cfg.seed + 1000 * repeat,
                                                         cfg.dataset_path)
                continue
            if cfg.conversations:
                levels[repeat, li] = await build_sessions(cfg, tok, cfg.seed + 1000 * repeat + li, dropped)
                continue
            levels[repeat, li] = await build_prompts(
                cfg, tok, prompts_needed(plan, level_seed(cfg, repeat, li)), cfg.seed + 1000 * repeat + li,
                context, dropped)
    return warm, levels


@dataclass(slots=True)
class Callbacks:
    """Who hears of a sweep's progress (run_bench's arguments of the same names)."""

    on_level_start: Callable[[str, int, int | None], None] | None = None
    on_request_done: Callable[[RequestRecord], None] | None = None
    on_level_done: LevelDone | None = None
    on_note: Callable[[str], None] | None = None

    def level_start(self, label: str, repeat: int, n: int | None) -> None:
        if self.on_level_start:
            self.on_level_start(label, repeat, n)

    def level_done(self, concurrency: int, records: list[RequestRecord], level: dict | None) -> None:
        if self.on_level_done:
            self.on_level_done(concurrency, records, level)


@dataclass(slots=True)
class Sweep:
    """What one run_bench has gathered so far: its records (kept on disk as each level ends), its level runs
    and their GPU readings, and why it stopped if it did. Its summary is rewritten after every level."""

    cfg: BenchConfig
    writer: RecordWriter
    meta: dict = field(default_factory=dict)
    records: list[RequestRecord] = field(default_factory=list)
    level_runs: list[LevelRun] = field(default_factory=list)
    readings: dict[tuple[str, int], Readings] = field(default_factory=dict)  # by (level label, repeat)
    telemetry_note: str | None = None
    aborted: str | None = None
    receiver: OtlpReceiver | None = None  # --otlp-receiver: the server's spans of each level
    timeline: list[dict] = field(default_factory=list)  # their events on one axis (timeline.py), level by level
    clocks: list[dict] = field(default_factory=list)

    def keep(self, recs: list[RequestRecord]) -> None:
        self.writer.write(recs)
        self.records.extend(recs)

    def write_summary(self) -> dict:
        cfg = self.cfg
        summary = build_summary(
            self.level_runs, meta=self.meta, confidence=cfg.confidence, seed=cfg.seed,
            forced_length=cfg.force_length, planned_repeats=cfg.repeats, aborted=self.aborted, slo=cfg.slo,
            readings=self.readings, telemetry_note=self.telemetry_note,
        )
        if cfg.out_dir:
            # the file names the command, commit and tree it came from; the returned summary does not
            (cfg.out_dir / "summary.json").write_text(json.dumps({"provenance": provenance(), **summary}, indent=2) + "\n")
        return summary


async def warm_up(sweep: Sweep, session, target: Target, limit: int, prompts: list[datasets.Prompt],
                  calls: Callbacks) -> None:
    """The warm-up requests, kept but left out of every statistic; a clear error when every one failed."""
    n = sweep.cfg.warmup
    calls.level_start("warm-up", 0, n)
    warm: list[RequestRecord] = []
    try:
        await run_level(session, target, LevelPlan(concurrency=min(n, limit), num_requests=n), prompts, warmup=True,
                        records=warm, on_done=calls.on_request_done)
    finally:
        sweep.keep(warm)
        calls.level_done(0, warm, None)
    failed = [r for r in warm if not r.ok]
    if len(failed) == len(warm):
        raise RooftopError(f"every warm-up request to {target.url} failed ({failed[0].error})",
                           "check that the server is up and serves this endpoint and model")


async def measure_level(sweep: Sweep, session, http: aiohttp.ClientSession, target: Target, tok,
                        sampler: Sampler | None, plan: LevelPlan, li: int, repeat: int, prompts: list[datasets.Prompt],
                        calls: Callbacks) -> None:
    """One level of one repeat, with the server's /metrics and the GPUs read around it; its records and the
    summary so far are written when it ends, whether it ends well or not."""
    cfg = sweep.cfg
    calls.level_start(plan.label, repeat, plan.num_requests)
    recs: list[RequestRecord] = []
    try:
        before = await scrape_totals(http, cfg.metrics_url) if cfg.metrics_url else None
        if sampler:  # its first reading is taken before the level starts, its last after it ends
            await asyncio.to_thread(sampler.start)
        run = await run_level(session, target, plan, prompts, repeat=repeat, seed=level_seed(cfg, repeat, li),
                              records=recs, on_done=calls.on_request_done)
        if sampler:
            sweep.readings[plan.label, repeat] = Readings(sampler.source, await asyncio.to_thread(sampler.stop),
                                                          sampler.note, sampler.interval_s)
        if before is not None:
            after = await scrape_totals(http, cfg.metrics_url)
            run.engine_steps, run.engine_server = level_delta(before, after)
            run.spec_decode = spec_decode_delta(before, after)
    except (asyncio.CancelledError, RooftopError) as exc:  # RooftopError: a client worker failed
        why = "interrupted" if isinstance(exc, asyncio.CancelledError) else exc.problem
        sweep.aborted = f"{why} during {plan.label} repeat {repeat + 1}"
        sweep.keep(recs)
        sweep.write_summary()
        calls.level_done(plan.concurrency or 0, recs, None)
        raise
    if not cfg.chat and not cfg.conversations:  # a chat template adds tokens the client cannot count
        for r in recs:
            r.prompt_tokens_client = prompts[r.index % len(prompts)].input_len
    if not run.aborted:
        await count_client_tokens(tok, recs)
    if sweep.receiver is not None:
        run.server_spans, spans = await join_spans(sweep.receiver, recs)
        if cfg.out_dir and run.server_spans["joined"]:  # timeline.json.gz beside requests.jsonl
            clock = run.server_spans["clock"]
            sweep.timeline += level_events(recs, spans, clock["offset_ns"], len(sweep.clocks) + 1,
                                           f"{plan.label} repeat {repeat + 1}")
            sweep.clocks.append({"level": plan.label, "repeat": repeat, **clock})
            data = await asyncio.to_thread(encode, document(sweep.timeline, sweep.clocks))
            (cfg.out_dir / "timeline.json.gz").write_bytes(data)
    sweep.keep(recs)
    sweep.level_runs.append(run)
    if run.aborted:
        sweep.aborted = (f"the server at {cfg.base_url} stopped answering during {plan.label} "
                         f"repeat {repeat + 1} ({run.aborted})")
    summary = sweep.write_summary()
    calls.level_done(plan.concurrency or 0, recs, next(lv for lv in summary["levels"] if lv["label"] == plan.label))


SPANS_WAIT_S = 5.0  # a level's spans may come this long after it ends (the engine sends every 0.2 s)
SPANS_QUIET_S = 1.5  # ... and once nothing has come for this long, none are on their way


async def join_spans(receiver: OtlpReceiver, recs: list[RequestRecord]) -> tuple[dict, list]:
    """Wait for the server's spans of a level's requests (all of them, or until none come), take them, and
    join them to the records (latency.join: each record's ttft_breakdown and itl_outliers); the join and the spans."""
    want = {r.request_id for r in recs if r.ok}
    start = time.monotonic()
    while time.monotonic() - start < SPANS_WAIT_S and not want <= receiver.collected.request_ids:
        last, now = receiver.collected.last_post_s, time.monotonic()
        if now - start >= SPANS_QUIET_S and (not last or now - last >= SPANS_QUIET_S):
            break
        await asyncio.sleep(0.05)
    got = receiver.take()
    out = await asyncio.to_thread(join, recs, got.spans, measure_local())
    if got.bad_posts:
        out["bad_posts"] = got.bad_posts
    return out, got.spans


async def run_bench(
    cfg: BenchConfig,
    on_level_start: Callable[[str, int, int | None], None] | None = None,
    on_request_done: Callable[[RequestRecord], None] | None = None,
    on_level_done: LevelDone | None = None,
    on_note: Callable[[str], None] | None = None,
) -> BenchOutcome:
    """Run the whole sweep; return (and write, with --out) the records and summary. `on_level_done`
    gets each level's records and summary as soon as it ends, so a caller keeps them even if the
    sweep is killed later; `on_note` a line for the user (once: GPU telemetry is off, and why)."""
    calls = Callbacks(on_level_start, on_request_done, on_level_done, on_note)
    trace = load_replay(cfg, on_note)  # a bad trace ends the run here, before anything is sent
    plans = cfg.plans(trace)
    limit = max([p.concurrency or p.max_concurrency or 64 for p in plans] + [cfg.warmup])
    sweep = Sweep(cfg, RecordWriter(cfg.out_dir))
    headers = auth_headers(cfg.api_key)
    async with (aiohttp.ClientSession(headers=headers) as http, make_session(limit, cfg.client_procs) as session,
                open_telemetry(cfg, on_note) as (sampler, sweep.telemetry_note), contextlib.AsyncExitStack() as stack):
        if cfg.otlp_receiver:
            host, _, port = cfg.otlp_receiver.rpartition(":")
            sweep.receiver = OtlpReceiver(host, int(port))
            await stack.enter_async_context(sweep.receiver)
            if on_note:
                on_note(f"OTLP receiver on {sweep.receiver.endpoint}: start the engine with --otlp-traces-endpoint "
                        f"{sweep.receiver.endpoint}")
        model = cfg.model or await resolve_model(http, cfg.base_url)
        tok = HFTokenizer(cfg.tokenizer) if cfg.tokenizer else ServerTokenizer(http, cfg.base_url, model)
        target = Target(cfg.base_url, model, chat=cfg.chat, stream=cfg.stream, force_length=cfg.force_length,
                        timeout_s=cfg.timeout_s, headers=headers)
        sweep.meta = run_meta(cfg, model)
        if trace is not None:
            sweep.meta["trace"] = trace_meta(cfg, trace)
        calls.level_start("building prompts", 0, None)
        warm_prompts, level_prompts = await build_all_prompts(cfg, plans, tok, http, model, sweep.meta, trace)
        if cfg.warmup > 0:
            await warm_up(sweep, session, target, limit, warm_prompts, calls)
        for (repeat, li), prompts in level_prompts.items():  # repeat by repeat, each level in its order
            await measure_level(sweep, session, http, target, tok, sampler, plans[li], li, repeat, prompts, calls)
            if sweep.aborted:
                break
    return BenchOutcome(sweep.write_summary(), sweep.records, sweep.level_runs, sweep.aborted)
