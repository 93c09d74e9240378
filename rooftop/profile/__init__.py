"""Profiles: capture traces from engines, parse them, attribute GPU time to components, find capacity scaling.

`load_trace(path)` reads a Kineto JSON (.json/.json.gz) or an Nsight Systems SQLite export;
`analyze(trace)` gives a per-step `ProfileSummary`; `capacity_scaling` and `diff` compare two traces.
"""

from pathlib import Path

from rooftop.errors import RooftopError
from rooftop.profile.capacity import CapacityFinding
from rooftop.profile.capture import capture
from rooftop.profile.diff import TraceDiff, diff
from rooftop.profile.kineto import load_kineto
from rooftop.profile.nsys import load_nsys
from rooftop.profile.scaling import ScalingFinding, capacity_scaling
from rooftop.profile.summary import ProfileSummary, analyze, hides_modules
from rooftop.profile.trace import Trace


def load_trace(path: str | Path) -> Trace:
    """Parse a trace file: Nsight Systems SQLite (by its header) or Kineto JSON, plain or gzip."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p.name for p in path.iterdir() if p.name.endswith((".json", ".json.gz", ".sqlite")))
        raise RooftopError(f"{path} is a directory ({len(files)} trace files)",
                           "pass one trace file, one rank: " + (", ".join(files[:3]) or "none found here"))
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(16) == b"SQLite format 3\x00":
                return load_nsys(path)
    return load_kineto(path)


__all__ = [
    "CapacityFinding", "ProfileSummary", "ScalingFinding", "Trace", "TraceDiff",
    "analyze", "capacity_scaling", "capture", "diff", "hides_modules", "load_trace",
]
