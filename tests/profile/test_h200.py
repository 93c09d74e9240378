"""Must-show 2 on real H200 traces of the embedded engine, shipped in tests/profile/data.

They are named h200_<bound>_ctx<N>.json.gz (bound: capacity or actual, N: the --context-length of the
capture); a missing one fails here.
"""

import re
from pathlib import Path

import pytest

from rooftop.profile import analyze, load_trace

DATA = Path(__file__).parent / "data"
TRACES = [DATA / "h200_capacity_ctx262144.json.gz", DATA / "h200_actual_ctx262144.json.gz"]


def _params(path: Path) -> tuple[str, int]:
    m = re.match(r"h200_(capacity|actual)_ctx(\d+)\.json\.gz$", path.name)
    assert m, f"name {path.name} as h200_<capacity|actual>_ctx<N>.json.gz"
    return m.group(1), int(m.group(2))


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_h200_indexer_capacity(path):
    bound, ctx = _params(path)
    s = analyze(load_trace(path), context_length=ctx)
    assert s.basis == "kernels" and s.arch == "sm_90" and s.granularity == "module"
    if bound == "capacity":
        assert s.components[0].name == "indexer"
        f = next(f for f in s.capacity_findings if f.component == "indexer")
        assert f.ops and f.ms_per_step > 0
    else:
        assert s.components[0].name != "indexer"
        assert not any(f.component == "indexer" for f in s.capacity_findings)
