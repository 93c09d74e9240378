"""How a deployment lays the model out, as the roofline needs it (pure): tensor and expert parallel
sizes and the KV cache's dtype, read from the serving worker's engine args.

The floor is per GPU: a deployment at TP 8 moves an eighth of the weights through each GPU's memory
a step. Costing it at TP 1 would put the floor ~8x too high and the measured step below it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rooftop.spec.deployment import DeploymentSpec

TP_KEYS = ("tensor-parallel-size", "tp", "tp-size")
PP_KEYS = ("pipeline-parallel-size", "pp", "pp-size")
DP_KEYS = ("data-parallel-size", "dp", "dp-size")
EP_KEYS = ("ep-size", "expert-parallel-size", "ep")
KV_KEYS = ("kv-cache-dtype",)


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    ep: int = 1
    kv_dtype: str = "bf16"


def serving_layout(dep: DeploymentSpec) -> Layout:
    """TP, EP and KV dtype of the worker that runs decode (single, or decode in pd). vLLM's
    enable-expert-parallel spreads the experts over TP x DP GPUs; SGLang's ep-size names it; the
    embedded engine runs on one GPU."""
    if dep.engine == "embedded":
        return Layout()
    args = dep.role_args("decode" if dep.topology == "pd" else "single")
    tp = size_arg(args, TP_KEYS)
    ep = size_arg(args, EP_KEYS, default=0)
    if not ep and args.get("enable-expert-parallel") is True:
        ep = tp * size_arg(args, DP_KEYS)
    return Layout(tp=tp, ep=max(1, ep), kv_dtype=kv_dtype(args.get("kv-cache-dtype")))


def kv_dtype(value) -> str:
    """An engine's kv-cache-dtype as the roofline names it: auto (the model's, 16-bit) -> bf16, fp8_* -> fp8."""
    v = str(value or "auto").lower()
    if v.startswith("fp8") or v in ("e4m3", "e5m2", "float8"):
        return "fp8"
    if v in ("fp16", "float16", "half"):
        return "fp16"
    return "bf16"


def size_arg(args: dict, keys: tuple[str, ...], default: int = 1) -> int:
    """The first of `keys` in an engine's args as a parallel size (at least 1); `default` when absent or not a number."""
    for key in keys:
        if key in args:
            try:
                return max(1, int(args[key]))
            except (TypeError, ValueError):
                return default
    return default
