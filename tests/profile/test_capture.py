"""Capture through the embedded engine's /start_profile and /stop_profile, on CPU, on 127.0.0.1."""

import asyncio
import os
import re
import subprocess
import sys

import pytest

from rooftop.errors import RooftopError
from rooftop.profile import analyze, capture, load_trace


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("engine-traces")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rooftop.engine", "--preset", "tiny", "--port", "0", "--device", "cpu",
         "--indexer-bound", "capacity", "--context-length", "4096", "--max-running-requests", "4",
         "--profile-dir", str(trace_dir), "--parent-pid", str(os.getpid())],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"http://\S+", line)
        if not match:
            pytest.fail(f"engine did not start: {line!r}")
        yield match.group(0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_capture_from_embedded_engine(engine_url, tmp_path):
    path = asyncio.run(capture(engine_url, tmp_path / "run", engine="embedded", steps=2, concurrency=2,
                               timeout_s=240))
    assert path.parent == tmp_path / "run" and path.name.endswith(".json.gz")
    s = analyze(load_trace(path), context_length=4096, page_size=64)
    assert s.basis == "cpu_ops" and s.granularity == "module" and s.steps >= 2
    names = {c.name for c in s.components}
    assert {"indexer", "attention", "moe", "sampler"} <= names
    # capacity-bound indexer: its scores span ceil(4096/64)*64 (+ one page) positions, not the ~40 actual
    f = next(f for f in s.capacity_findings if f.component == "indexer")
    assert f.dim in (4096, 4160) and f.path.endswith("Indexer")


def test_capture_errors(tmp_path):
    with pytest.raises(RooftopError, match="cannot reach"):
        asyncio.run(capture("http://127.0.0.1:9", tmp_path, engine="embedded", steps=1))
    with pytest.raises(RooftopError, match="profiler directory"):
        asyncio.run(capture("http://127.0.0.1:9", tmp_path, engine="vllm", steps=1))
    with pytest.raises(RooftopError, match="unknown engine"):
        asyncio.run(capture("http://127.0.0.1:9", tmp_path, engine="trt", steps=1))
