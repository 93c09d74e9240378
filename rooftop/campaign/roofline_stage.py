"""The roofline of one variant: the analytic decode floor of its model on the campaign's hardware, at
the profile's batch and the workload's mean context, stored beside what the variant measures; for a variant that
speculates, also its verify and draft floors (campaign/speculative_floors.py)."""

from __future__ import annotations

from pathlib import Path

from rooftop.adapters.embedded import preset_config
from rooftop.bench.traces import read_trace, replay
from rooftop.campaign.collect import one_line
from rooftop.campaign.layout import serving_layout
from rooftop.campaign.plan import Block
from rooftop.campaign.speculative_floors import speculative_floors
from rooftop.campaign.stage_context import StageContext
from rooftop.errors import RooftopError
from rooftop.hardware.specs import gpu_spec
from rooftop.roofline.config import ModelShape, load_model_shape, shape_from_config
from rooftop.roofline.report import roofline
from rooftop.spec.campaign import CampaignSpec
from rooftop.spec.deployment import DeploymentSpec


def mean_context(spec: CampaignSpec) -> int:
    """A decode step's mean context under the workload: a request's prompt and half its answer (a trace's mean
    lengths over what a level replays; multi-turn: half a session's whole history)."""
    s = spec.bench_settings()
    if s.conversations:
        return s.turns * (s.turn_input_len + s.turn_output_len) // 2
    if s.trace:
        rep = replay(read_trace(s.dataset_path, s.dataset), speedup=s.trace_speedup, window_s=s.trace_window_s,
                     num_requests=s.num_requests, duration_s=s.duration_s)
        known = [r for r in rep.requests if r.input_len is not None] or rep.requests
        return round(sum((r.input_len or 0) + r.output_len / 2 for r in known) / len(known))
    return s.input_len + s.output_len // 2


def run_roofline(ctx: StageContext, block: Block, dep: DeploymentSpec, batch: int) -> None:
    """The decode floor of this variant's model at `batch` and the workload's mean context; where there is
    none, why (stored as roofline_missing)."""
    spec = ctx.spec
    try:
        context = mean_context(spec)
        shape = model_shape(spec, dep)
        if shape is None:
            raise RooftopError(f"no config.json for model {dep.model!r}",
                               "set [model] config, or serve a model directory that holds one")
        gpu = gpu_spec(spec.hardware.gpu or "cpu")
        layout = serving_layout(dep)  # per GPU: the deployment's TP/EP and KV cache dtype
        r = roofline(shape, gpu, batch=batch, context=context, tp=layout.tp, ep=layout.ep, kv_dtype=layout.kv_dtype)
    except RooftopError as exc:
        ctx.store.put_analysis(block.variant, "roofline_missing", {"reason": one_line(str(exc))})
        return
    ctx.store.put_analysis(block.variant, "roofline", {
        "hardware": gpu.name, "batch": batch, "context": context,
        "tp": layout.tp, "ep": layout.ep, "kv_dtype": layout.kv_dtype,
        "notes": list(r.notes),  # what the config forced the model to assume (float32 as bf16, ...)
        "context_capacity": context_capacity(dep),
        "floor_ms": r.decode.floor_ms,
        "components": {name: c.floor_ms for name, c in r.decode.components.items()},
    })
    if dep.speculative is not None:  # the verify and draft floors, priced at the acceptance measured later
        try:
            floors = speculative_floors(shape, gpu, context, dep.speculative, spec.bench_settings().concurrency,
                                        tp=layout.tp, ep=layout.ep, kv_dtype=layout.kv_dtype)
        except RooftopError as exc:
            ctx.store.put_analysis(block.variant, "speculative_roofline_missing", {"reason": one_line(str(exc))})
            return
        ctx.store.put_analysis(block.variant, "speculative_roofline", floors)


def model_shape(spec: CampaignSpec, dep: DeploymentSpec) -> ModelShape | None:
    """The roofline's model shape: [model] config, <path>/config.json, or an embedded preset's config."""
    if spec.model.config:
        return load_model_shape(spec.model.config)
    model = dep.model or spec.model.served
    if model and Path(model, "config.json").is_file():
        return load_model_shape(Path(model, "config.json"))
    if dep.engine == "embedded":
        config = preset_config(model or "tiny")  # the engine's own config, as HF keys
        if config is not None:
            return shape_from_config(config, f"preset {model}")
    return None


def context_capacity(dep: DeploymentSpec) -> int | None:
    """The context the deployment allocates for (SGLang's context-length, vLLM's max-model-len), if set."""
    return int_or_none(dep.args.get("context-length") or dep.args.get("max-model-len"))


def int_or_none(v) -> int | None:
    """A deployment arg as an int; None where it is unset or no whole number."""
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None
