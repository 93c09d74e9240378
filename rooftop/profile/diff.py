"""Difference of two traces: time per step by component and by kernel, A against B."""

import math
from dataclasses import dataclass

from rooftop.profile.summary import ProfileSummary, analyze
from rooftop.profile.trace import Trace


@dataclass(slots=True)
class DiffRow:
    """One component or kernel: ms per step in A and B, the change and the ratio B/A."""

    name: str
    a_ms_per_step: float
    b_ms_per_step: float
    delta_ms: float
    ratio: float


@dataclass(slots=True)
class TraceDiff:
    """Per-component and per-kernel changes, largest absolute change first."""

    a: ProfileSummary
    b: ProfileSummary
    components: list[DiffRow]
    kernels: list[DiffRow]

    def to_json_dict(self) -> dict:
        rows = lambda rs: [  # noqa: E731
            {"name": r.name, "a_ms_per_step": r.a_ms_per_step, "b_ms_per_step": r.b_ms_per_step,
             "delta_ms": r.delta_ms, "ratio": r.ratio if math.isfinite(r.ratio) else None}
            for r in rs
        ]
        return {
            "a": self.a.trace,
            "b": self.b.trace,
            "busy_ms_per_step": [self.a.gpu_busy_ms_per_step, self.b.gpu_busy_ms_per_step],
            "components": rows(self.components),
            "kernels": rows(self.kernels),
        }


def diff(trace_a: Trace, trace_b: Trace, *, top: int = 50) -> TraceDiff:
    """Compare two traces of the same workload: what got faster, what got slower."""
    return diff_summaries(analyze(trace_a, top=top), analyze(trace_b, top=top))


def diff_summaries(a: ProfileSummary, b: ProfileSummary) -> TraceDiff:
    """`diff` of two summaries already made (with whatever eager map and kernel code each was read with)."""
    comps = _rows({c.name: c.ms_per_step for c in a.components}, {c.name: c.ms_per_step for c in b.components})
    kerns = _rows({k.name: k.ms_per_step for k in a.top_kernels}, {k.name: k.ms_per_step for k in b.top_kernels})
    return TraceDiff(a, b, comps, kerns)


def _rows(a: dict[str, float], b: dict[str, float]) -> list[DiffRow]:
    out = []
    for name in set(a) | set(b):
        x, y = a.get(name, 0.0), b.get(name, 0.0)
        ratio = y / x if x > 0 else float("inf") if y > 0 else 1.0
        out.append(DiffRow(name, x, y, y - x, ratio))
    out.sort(key=lambda r: -abs(r.delta_ms))
    return out
