"""The roofline of one model and layout as a JSON-ready dict (the `rooftop roofline --json` schema)."""

from collections.abc import Sequence
from dataclasses import dataclass, field

from rooftop.hardware.specs import GPUSpec
from rooftop.roofline.config import ModelShape
from rooftop.roofline.costs import component_dtypes, decode_costs, make_layout, prefill_costs
from rooftop.roofline.floors import StepFloor, floors
from rooftop.roofline.params import Params, count_params
from rooftop.roofline.speculative import SpecReport, Speculation, speculative_report


@dataclass(slots=True)
class Roofline:
    """Parameters, and the decode and prefill floors of one model on one GPU and layout."""

    params: Params
    decode: StepFloor
    prefill: StepFloor
    decode_actual_context: StepFloor | None  # the decode floor with the indexer over the actual context,
    # given when `decode` was costed over an allocated capacity
    dtypes: dict[str, str] = field(default_factory=dict)  # component -> dtype its weights are read in
    notes: list[str] = field(default_factory=list)  # assumptions made for this config, and warnings
    speculative: SpecReport | None = None  # speculative decoding against plain decode, when asked


def roofline(
    shape: ModelShape,
    gpu: GPUSpec,
    *,
    batch: int,
    context: int,
    input_len: int | None = None,
    context_capacity: int | None = None,
    weight_dtype: str = "auto",
    kv_dtype: str = "bf16",
    expert_dtype: str | None = None,
    tp: int = 1,
    ep: int = 1,
    speculation: Speculation | None = None,
    concurrencies: Sequence[int] = (),
) -> Roofline:
    """Decode (batch x context) and prefill (batch x input_len, default context) floors on `gpu`; with
    `speculation`, its gain over plain decode at each of `concurrencies` (default: `batch`)."""
    layout = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype, expert_dtype=expert_dtype, tp=tp, ep=ep)
    decode = floors(decode_costs(shape, batch, context, context_capacity=context_capacity, **layout), gpu)
    actual = None
    if context_capacity and context_capacity != context:
        actual = floors(decode_costs(shape, batch, context, **layout), gpu)
    prefill = floors(prefill_costs(shape, batch, input_len or context, **layout), gpu)
    dtypes = component_dtypes(shape, make_layout(shape, weight_dtype, expert_dtype, kv_dtype, tp, ep))
    notes = list(shape.notes)
    if weight_dtype != "auto" and shape.quant_skip:
        notes.append(
            f"--weight-dtype {weight_dtype} applies to the weights the checkpoint quantises; those its "
            f"quantization_config leaves alone ({', '.join(shape.quant_skip)}) stay {shape.base_dtype}"
        )
    spec = None
    if speculation is not None:
        spec = speculative_report(
            shape, gpu, concurrencies or [batch], speculation.k, speculation.acceptance, context=context,
            draft=speculation.draft, context_capacity=context_capacity, **layout,
        )  # fmt: skip
    return Roofline(count_params(shape), decode, prefill, actual, dtypes, notes, spec)


def step_json(step: StepFloor) -> dict:
    """{"bytes", "flops", "floor_ms", "components": {NAME: {"bytes", "flops", "floor_ms"}}}."""
    return {
        "bytes": round(step.bytes),
        "flops": round(step.flops),
        "floor_ms": step.floor_ms,
        "components": {
            name: {"bytes": round(c.bytes), "flops": round(c.flops), "floor_ms": c.floor_ms}
            for name, c in step.components.items()
        },
    }


def roofline_json(result: Roofline) -> dict:
    """The `--json` document: params_total, params_active, dtypes, notes, decode, prefill[, speculative]."""
    doc = {
        "params_total": result.params.total,
        "params_active": result.params.active,
        "dtypes": result.dtypes,
        "notes": result.notes,
        "decode": step_json(result.decode),
        "prefill": step_json(result.prefill),
    }
    if result.speculative is not None:
        doc["speculative"] = speculative_json(result.speculative)
    return doc


def speculative_json(report: SpecReport) -> dict:
    """{"k", "draft", "acceptance_per_pos", "expected_tokens", the crossover batches, "notes", "levels": [{
    "concurrency", step and per-token floors in ms, "gain", tok/s, "verify_bound"}]}."""
    cross = report.crossover
    return {
        "k": cross.k,
        "draft": report.draft,
        "acceptance_per_pos": list(report.acceptance),
        "expected_tokens": report.expected_tokens,
        "compute_bound_batch": cross.compute_bound_batch,
        "plain_compute_bound_batch": cross.plain_compute_bound_batch,
        "first_paying_batch": cross.first_paying_batch,
        "break_even_batch": cross.break_even_batch,
        "max_batch": cross.max_batch,
        "notes": report.notes,
        "levels": [
            {
                "concurrency": e.batch,
                "plain_step_ms": e.plain_step_ms,
                "verify_step_ms": e.verify_step_ms,
                "draft_ms": e.draft_ms,
                "plain_ms_per_token": e.plain_ms_per_token,
                "spec_ms_per_token": e.spec_ms_per_token,
                "gain": e.gain,
                "plain_tok_s": e.plain_tok_s,
                "spec_tok_s": e.spec_tok_s,
                "verify_bound": e.verify_bound,
            }
            for e in report.levels
        ],
    }
