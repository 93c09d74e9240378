"""The sweep of one block: warm up, then one repeat of every level not yet stored.

Each level and its requests go to the store as soon as the level ends, with the server's own figures
where its /metrics exports them and telemetry of the deployment's GPUs, so a killed sweep resumes at
the first level it had not finished. The store keys a level by an integer (`level_key`): a closed loop's
concurrency, an open loop's place in the sweep (a trace's replay is its one level).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from rooftop.adapters.common import api_key
from rooftop.adapters.processes import get_engine
from rooftop.bench.slo import Slo
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.campaign.collect import TELEMETRY_NOTE_SUBJECT, TRACE_REPLAY
from rooftop.campaign.gpu_scope import GpuScope, telemetry_scope
from rooftop.campaign.plan import Block
from rooftop.campaign.server_spans import receiver_for
from rooftop.campaign.stage_context import StageContext
from rooftop.deploy.bring_up import LiveDeployment
from rooftop.errors import RooftopError
from rooftop.spec.campaign import CampaignSpec
from rooftop.spec.deployment import DeploymentSpec


def run_sweep(ctx: StageContext, block: Block, dep: DeploymentSpec, live: LiveDeployment, block_dir: Path) -> None:
    """Warm `live` up, then sweep the levels of this block's repeat that the store does not hold yet;
    RooftopError where the sweep stopped (the server stopped answering, ...)."""
    b, store = ctx.spec.bench_settings(), ctx.store
    scope = gpu_scope(ctx.spec, dep, live)
    if b.telemetry and scope.off:
        telemetry_note(ctx, scope.note)
    elif b.telemetry and scope.note:
        ctx.say_once(f"scope: {scope.note}", f"GPU telemetry: {scope.note}")
    done = sorted({r.concurrency for r in store.levels(block.variant, series=block.series) if r.repeat == block.repeat})
    cfg = bench_config_for(ctx.spec, block, live.url, block_dir, metrics_url(live, dep.engine), scope,
                           api_key(dep), done, otlp_receiver=receiver_for(dep, b))
    warmup_key = block.key("warmup")
    running = {"label": ""}  # the level under way, as the bench names it

    def level_start(label: str, repeat: int, n: int | None) -> None:
        running["label"] = label
        ctx.stage(label)

    def level_done(concurrency: int, records: list, level: dict | None) -> None:
        warm = running["label"] == "warm-up"
        key = 0 if warm else level_key(cfg, running["label"])
        store.put_requests(block.series, block.variant, block.repeat, key, [r.to_json_dict() for r in records])
        if level is not None:
            store.put_level(block.series, block.variant, block.repeat, key, level, bool(level.get("valid")))
        elif warm:  # the warm-up ended: this bring-up is warm, or could not be warmed
            failed = [r for r in records if not r.ok]
            store.finish_unit(warmup_key, error=(f"every warm-up request failed ({failed[0].error})"
                                                 if records and len(failed) == len(records) else None))

    if b.warmup > 0:
        store.start_unit(warmup_key)
    def note(text: str) -> None:  # the trace's (a cut, rows left out; kept in its replay's record) or telemetry's
        if cfg.dataset_path and text.startswith(f"{cfg.dataset_path}: "):
            ctx.say_once(text, text)
        elif text.startswith("OTLP receiver on "):  # the server's spans: the campaign started it with the flag
            ctx.say_once("otlp receiver", f"server spans: received on {cfg.otlp_receiver}")
        else:
            telemetry_note(ctx, text)

    outcome = asyncio.run(run_bench(cfg, on_level_start=level_start, on_level_done=level_done, on_note=note))
    if outcome.summary.get("trace") and store.analysis(TELEMETRY_NOTE_SUBJECT, TRACE_REPLAY) is None:
        # the same replay for every variant: its requests, span, cut and the prefix reuse its hash ids promise
        store.put_analysis(TELEMETRY_NOTE_SUBJECT, TRACE_REPLAY, outcome.summary["trace"])
    if outcome.aborted:
        raise RooftopError(f"sweep of {block.variant} stopped: {outcome.aborted}",
                           "see the process logs under " + str(block_dir / "logs"))


def level_key(cfg: BenchConfig, label: str) -> int:
    """The store's key of the level the bench labels `label`: a closed loop's concurrency; an open loop's place
    in the sweep from 1 (request rates in the order given; a ramp's or a trace's one level is 1), as 0 keys the
    warm-up's requests."""
    if cfg.trace:
        return 1
    plans = cfg.plans()
    return next((p.concurrency or i + 1 for i, p in enumerate(plans) if p.label == label), len(plans) + 1)


def bench_config_for(spec: CampaignSpec, block: Block, url: str, block_dir: Path, metrics_url: str | None,
                     scope: GpuScope, api_key: str | None, done: list[int],
                     otlp_receiver: str | None = None) -> BenchConfig:
    """The bench's settings for one repeat of a block's sweep, from the campaign's [workload] and [bench]:
    every level but those `done`, /metrics read at `metrics_url`, telemetry of the GPUs in `scope`, the
    server's spans received at `otlp_receiver` (HOST:PORT; campaign/server_spans.py)."""
    slo = spec.slo
    return BenchConfig.of(
        spec.bench_settings(), base_url=url, repeats=1,
        # The same prompts for every variant in a repeat: A and B answer the same requests.
        seed=spec.campaign.seed + 7 * block.repeat, tokenizer=spec.model.tokenizer,
        telemetry=spec.bench.telemetry and not scope.off, gpus=scope.gpus,
        out_dir=block_dir / "bench", metrics_url=metrics_url, skip_concurrency=done,
        slo=Slo(**slo.model_dump()) if slo is not None else None, api_key=api_key, otlp_receiver=otlp_receiver)


def telemetry_note(ctx: StageContext, note: str) -> None:
    """GPU telemetry is off, and why: said once per campaign, and kept for the documents."""
    if ctx.store.analysis(TELEMETRY_NOTE_SUBJECT, "telemetry_note") is None:
        ctx.store.put_analysis(TELEMETRY_NOTE_SUBJECT, "telemetry_note", {"note": note})
    ctx.say_once("telemetry off", note)


def gpu_scope(spec: CampaignSpec, dep: DeploymentSpec, live: LiveDeployment) -> GpuScope:
    """The GPUs the sweep's telemetry samples: the deployment's, on this machine (campaign/gpu_scope.py)."""
    workers = [{"role": p.spec.role, "gpus": list(p.spec.gpus or []), "machine": p.spec.machine,
                "args": dep.role_args(p.spec.role) if p.spec.role in dep.roles() else dict(dep.args),
                "env": dict(p.spec.env or {})} for p in live.processes]
    return telemetry_scope(dep.engine, workers, spec.bench.dcgm_url, os.environ.get("CUDA_VISIBLE_DEVICES"),
                           on_cpu=(spec.hardware.gpu or "").lower() == "cpu")


def metrics_url(live: LiveDeployment, engine: str | None = None) -> str | None:
    """The /metrics read around each level: the server's; in pd the router's where it joins both workers'
    (vLLM's proxy: TTFT and queue from prefill, ITL from decode), else the decode worker's (decode runs
    the steps TPOT is made of)."""
    router = next((p for p in live.processes if p.spec.role == "router" and p.spec.url), None)
    if router is not None and engine is not None and getattr(get_engine(engine), "ROUTER_METRICS", False):
        return router.spec.url + "/metrics"
    for proc in live.processes:
        if proc.spec.role in ("single", "decode") and proc.spec.url:
            return proc.spec.url + "/metrics"
    return None
