"""Floors on a GPU: max(bytes / bandwidth, FLOPs / peak) per component, the step, tok/s, and the gap."""

from collections.abc import Iterable
from dataclasses import dataclass, field

from rooftop.errors import RooftopError
from rooftop.hardware.specs import GPUSpec, gpu_spec
from rooftop.roofline.config import ModelShape
from rooftop.roofline.costs import StepCost, decode_costs


@dataclass(slots=True)
class ComponentFloor:
    """The least time one component can take on one GPU, and what bounds it."""

    bytes: float
    flops: float
    memory_ms: float  # bytes over device-memory (or link) bandwidth
    compute_ms: float  # FLOPs over the dense peak of its dtype
    floor_ms: float
    bound: str  # "memory" | "compute" | "link" | "-" (no work)


@dataclass(slots=True)
class StepFloor:
    """A step's floor on one GPU: components run one after another, so their floors add up."""

    phase: str
    gpu: str
    batch: int
    components: dict[str, ComponentFloor] = field(default_factory=dict)

    @property
    def floor_ms(self) -> float:
        """Sum of the component floors, in ms."""
        return sum(c.floor_ms for c in self.components.values())

    @property
    def bytes(self) -> float:
        """Bytes over all components."""
        return sum(c.bytes for c in self.components.values())

    @property
    def flops(self) -> float:
        """FLOPs over all components."""
        return sum(c.flops for c in self.components.values())


def floors(cost: StepCost, gpu: GPUSpec | str) -> StepFloor:
    """Floor of every component of `cost` on `gpu` (a GPUSpec or a name for gpu_spec)."""
    gpu = gpu_spec(gpu) if isinstance(gpu, str) else gpu
    out = StepFloor(cost.phase, gpu.name, cost.batch)
    for name, comp in cost.components.items():
        bandwidth = gpu.link_bytes_s if comp.medium == "link" else gpu.bandwidth_bytes_s
        memory_ms = comp.bytes / bandwidth * 1e3 if comp.bytes else 0.0
        compute_ms = comp.flops / gpu.peak_flops(comp.compute_dtype) * 1e3 if comp.flops else 0.0
        if not (memory_ms or compute_ms):
            bound = "-"
        elif memory_ms >= compute_ms:
            bound = "link" if comp.medium == "link" else "memory"
        else:
            bound = "compute"
        out.components[name] = ComponentFloor(
            comp.bytes, comp.flops, memory_ms, compute_ms, max(memory_ms, compute_ms), bound
        )
    return out


@dataclass(slots=True)
class TokRate:
    """Predicted ceiling at one concurrency: the decode step floor and the tokens/s it allows."""

    concurrency: int
    step_floor_ms: float
    tok_s: float


def predict_tok_s(
    shape: ModelShape,
    gpu: GPUSpec | str,
    concurrencies: Iterable[int],
    context: int,
    *,
    weight_dtype: str = "auto",
    kv_dtype: str = "bf16",
    tp: int = 1,
    ep: int = 1,
    context_capacity: int | None = None,
    expert_dtype: str | None = None,
) -> list[TokRate]:
    """Decode tok/s ceiling of the whole TP group at each concurrency (one token per sequence per step)."""
    rates = []
    for concurrency in concurrencies:
        cost = decode_costs(
            shape,
            concurrency,
            context,
            weight_dtype=weight_dtype,
            kv_dtype=kv_dtype,
            tp=tp,
            ep=ep,
            context_capacity=context_capacity,
            expert_dtype=expert_dtype,
        )
        step_ms = floors(cost, gpu).floor_ms
        rates.append(TokRate(concurrency, step_ms, concurrency / step_ms * 1e3))
    return rates


@dataclass(slots=True)
class Gap:
    """How far a measured step sits above its floor, and the component the excess most likely sits in."""

    measured_ms: float
    floor_ms: float
    ratio: float  # measured / floor
    component: str
    basis: str  # "measured components" or "proportional to floors" (no component timings given)
    excess_ms: dict[str, float] = field(default_factory=dict)  # per component, largest first


# Roofline components grouped under the names a profile's attribution uses (rooftop.profile).
FAMILIES = {
    "attn_proj": "attention", "attn_core": "attention", "indexer": "indexer", "routed_experts": "moe",
    "shared_experts": "moe", "dense_mlp": "mlp", "norms": "norm", "embedding": "embedding",
    "lm_head": "lm_head", "comm_tp": "communication", "comm_ep": "communication",
}  # fmt: skip


def family_floor_ms(step_floor: StepFloor) -> dict[str, float]:
    """Floors summed by profile family (attention, indexer, moe, mlp, norm, embedding, lm_head, communication)."""
    out: dict[str, float] = {}
    for name, c in step_floor.components.items():
        fam = FAMILIES.get(name, name)
        out[fam] = out.get(fam, 0.0) + c.floor_ms
    return out


def gap(
    step_floor: StepFloor, measured_ms: float, measured_component_ms: dict[str, float] | None = None
) -> Gap:
    """Ratio of `measured_ms` to the floor and where the difference most likely is.

    With per-component timings (e.g. from a profile's attribution) the component with the largest
    excess over its floor; a timing may be named by roofline component (attn_core) or by profile
    family (attention: the floors of its components summed); other names (such as "other") count
    with a floor of 0. Without timings, every component is assumed equally far from its floor, so
    the largest floor holds the most.
    """
    if measured_ms <= 0:
        raise RooftopError(f"measured step time must be positive, got {measured_ms}", "pass a time in ms")
    floor_ms = step_floor.floor_ms
    ratio = measured_ms / floor_ms if floor_ms else float("inf")
    if measured_component_ms:
        families = family_floor_ms(step_floor)

        def floor_of(name: str) -> float:
            if name in step_floor.components:
                return step_floor.components[name].floor_ms
            return families.get(name, 0.0)

        excess = {name: ms - floor_of(name) for name, ms in measured_component_ms.items()}
        basis = "measured components"
    else:
        excess = {name: c.floor_ms * (ratio - 1) for name, c in step_floor.components.items() if c.floor_ms}
        basis = "proportional to floors"
    excess = dict(sorted(excess.items(), key=lambda kv: kv[1], reverse=True))
    component = next(iter(excess), "-")
    return Gap(measured_ms, floor_ms, ratio, component, basis, excess)
