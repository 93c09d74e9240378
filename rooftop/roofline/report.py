"""The roofline of one model and layout as a JSON-ready dict (the `rooftop roofline --json` schema)."""

from dataclasses import dataclass

from rooftop.hardware.specs import GPUSpec
from rooftop.roofline.config import ModelShape
from rooftop.roofline.costs import decode_costs, prefill_costs
from rooftop.roofline.floors import StepFloor, floors
from rooftop.roofline.params import Params, count_params


@dataclass(slots=True)
class Roofline:
    """Parameters, and the decode and prefill floors of one model on one GPU and layout."""

    params: Params
    decode: StepFloor
    prefill: StepFloor
    decode_actual_context: StepFloor | None  # the decode floor with the indexer over the actual context,
    # given when `decode` was costed over an allocated capacity


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
) -> Roofline:
    """Decode (batch x context) and prefill (batch x input_len, default context) floors on `gpu`."""
    layout = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype, expert_dtype=expert_dtype, tp=tp, ep=ep)
    decode = floors(decode_costs(shape, batch, context, context_capacity=context_capacity, **layout), gpu)
    actual = None
    if context_capacity and context_capacity != context:
        actual = floors(decode_costs(shape, batch, context, **layout), gpu)
    prefill = floors(prefill_costs(shape, batch, input_len or context, **layout), gpu)
    return Roofline(count_params(shape), decode, prefill, actual)


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
    """The `--json` document: params_total, params_active, decode, prefill."""
    return {
        "params_total": result.params.total,
        "params_active": result.params.active,
        "decode": step_json(result.decode),
        "prefill": step_json(result.prefill),
    }
