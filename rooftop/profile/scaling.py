"""Capacity scaling across two traces of one workload: which components grow with the allocated capacity."""

from dataclasses import dataclass

from rooftop.profile.summary import ProfileSummary, analyze
from rooftop.profile.trace import Trace


@dataclass(slots=True)
class ScalingFinding:
    """A component's time at a small and a large capacity (same workload)."""

    component: str
    path: str
    ms_per_step_small: float
    ms_per_step_large: float
    ratio: float
    scales: bool

    def sentence(self) -> str:
        verdict = (
            "scales with allocated capacity, not with actual context"
            if self.scales
            else "does not change with capacity"
        )
        return (
            f"{self.component} ({self.path}): {self.ms_per_step_small:.3f} -> {self.ms_per_step_large:.3f} ms "
            f"per step ({self.ratio:.2f}x) from the small to the large capacity: {verdict}"
        )



def capacity_scaling(trace_small_cap: Trace, trace_large_cap: Trace, *, min_ratio: float = 1.3,
                     min_share: float = 0.02) -> list[ScalingFinding]:
    """Components whose time per step grows from the small-capacity trace to the large one.

    A component scales when its time grows by `min_ratio` or more and the growth is at least
    `min_share` of the large trace's busy time per step. Both traces must run the same workload.
    """
    return scaling_of(analyze(trace_small_cap), analyze(trace_large_cap), min_ratio=min_ratio, min_share=min_share)


def scaling_of(small: ProfileSummary, large: ProfileSummary, *, min_ratio: float = 1.3, min_share: float = 0.02) -> list[ScalingFinding]:
    """`capacity_scaling` of two summaries (profile.summary.ProfileSummary) already made."""
    a = {c.name: c for c in small.components}
    b = {c.name: c for c in large.components}
    busy_ms = large.gpu_busy_ms_per_step or 1e-9
    out = []
    for name in set(a) | set(b):
        ms_small = a[name].ms_per_step if name in a else 0.0
        ms_large = b[name].ms_per_step if name in b else 0.0
        ratio = ms_large / ms_small if ms_small > 0 else float("inf") if ms_large > 0 else 1.0
        scales = ratio >= min_ratio and (ms_large - ms_small) >= min_share * busy_ms
        path = (b.get(name) or a[name]).path
        out.append(ScalingFinding(name, path, ms_small, ms_large, ratio, scales))
    out.sort(key=lambda f: f.ms_per_step_large - f.ms_per_step_small, reverse=True)
    return out
