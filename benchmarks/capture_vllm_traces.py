"""Capture real vLLM (CPU) worker traces of tiny models, compiled and eager, for the profile tests.

For each architecture a model directory is written (`rooftop model init`), deployed with rooftop
(`.venv-vllm`, random weights, compiled and then --enforce-eager), loaded at `--concurrency`
streams, and `rooftop.profile.capture` keeps the worker's trace around `--steps` decode steps.
Written as `<out>/vllm_<arch>_<mode>.json.gz`, with `capture.json` saying what ran.

    .venv/bin/python benchmarks/capture_vllm_traces.py --out tests/profile/data/vllm
"""

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

from rooftop.adapters.common import trace_dir
from rooftop.deploy.bring_up import bring_up
from rooftop.models import init_model_dir
from rooftop.profile.capture import capture
from rooftop.provenance import provenance
from rooftop.spec.deployment import DeploymentSpec

ROOT = Path(__file__).resolve().parents[1]
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


def deployment(model: Path, python: str, eager: bool) -> DeploymentSpec:
    """One vLLM server on CPUs 0-1 with random weights; `eager` adds --enforce-eager."""
    args = {"max-model-len": 512, "load-format": "dummy", "served-model-name": "tiny"}
    if eager:
        args["enforce-eager"] = True
    return DeploymentSpec.model_validate({"engine": "vllm", "model": str(model), "python": python, "args": args,
                                          "env": CPU_ENV, "single": {"port": 0}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--archs", default="llama,qwen3_moe,deepseek_v2")
    ap.add_argument("--modes", default="compiled,eager")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"python": args.python, "steps": args.steps, "concurrency": args.concurrency, "traces": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.archs.split(","):
            model = Path(tmp) / arch
            init_model_dir(model, arch, "tiny")
            for mode in args.modes.split(","):
                run_dir = Path(tmp) / f"run-{arch}-{mode}"
                t0 = time.monotonic()
                with bring_up(deployment(model, args.python, mode == "eager"), run_dir, ready_timeout_s=900) as live:
                    ready_s = time.monotonic() - t0
                    trace = asyncio.run(capture(live.url, run_dir / "copied", engine="vllm", steps=args.steps,
                                                concurrency=args.concurrency, trace_dir=trace_dir(run_dir, "single")))
                dst = out / f"vllm_{arch}_{mode}.json.gz"
                shutil.copyfile(trace, dst)
                record["traces"][dst.name] = {"arch": arch, "mode": mode, "source": trace.name,
                                              "ready_s": round(ready_s, 1), "bytes": dst.stat().st_size,
                                              "vllm": live.inventory["engine"].get("version")}
                print(f"{dst}: {dst.stat().st_size / 1e6:.2f} MB (ready after {ready_s:.0f} s)", flush=True)
    (out / "capture.json").write_text(json.dumps({"provenance": provenance(), **record}, indent=1) + "\n")


if __name__ == "__main__":
    main()
