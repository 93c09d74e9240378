"""Real traces for the profile tests: the toy model profiled on CPU, and a handcrafted H200-style trace."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from toy_model import make_trace  # noqa: E402

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def gpu_trace_path() -> Path:
    return DATA / "gpu_sm90_small.json"


@pytest.fixture(scope="session")
def traces(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("traces")
    return {
        "capacity": make_trace(d / "capacity.json", capacity=8192, bound="capacity"),
        "actual": make_trace(d / "actual.json", capacity=8192, bound="actual"),
        "nostack": make_trace(d / "nostack.json", capacity=8192, with_stack=False),
        "gz": make_trace(d / "gz.json", capacity=8192, gzip=True),
    }


INDEXER_CORRELATIONS = {101, 102, 103, 104, 201, 202, 203, 204}


def scaled_gpu_trace(src: Path, dst: Path, indexer_factor: float, capacity_dim: int) -> Path:
    """The handcrafted H200 trace with the indexer's kernels scaled, as at another capacity."""
    top = json.loads(src.read_text())
    for e in top["traceEvents"]:
        args = e.get("args", {})
        if e.get("cat") == "kernel" and args.get("correlation") in INDEXER_CORRELATIONS:
            e["dur"] = e["dur"] * indexer_factor
        if e.get("cat") == "cpu_op" and "Input Dims" in args:
            args["Input Dims"] = [[capacity_dim if x == 262208 else x for x in d] for d in args["Input Dims"]]
    dst.write_text(json.dumps(top))
    return dst


@pytest.fixture(scope="session")
def gpu_small_cap_path(tmp_path_factory, gpu_trace_path) -> Path:
    """The same workload with a 4x smaller capacity: the indexer's kernels take a quarter of the time."""
    return scaled_gpu_trace(gpu_trace_path, tmp_path_factory.mktemp("gpu") / "small_cap.json", 0.25, 65600)
