"""The stack under a deployment, written down: engine version and commit, torch/CUDA/driver, key packages,
GPUs, host CPUs, NUMA layout and the verified CPU list of every process. Secrets redacted. A plain dict.

Package versions are read from the interpreter that runs the engine (it may be another environment),
from metadata only: nothing heavy is imported.
"""

import inspect
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from rooftop.hardware.topology import Topology, discover, format_cpu_list
from rooftop.provenance import cpu_model
from rooftop.redact import redact_env

KEY_PACKAGES = (
    "sglang", "sglang-router", "sgl-kernel", "vllm", "torch", "triton", "flashinfer-python",
    "transformers", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "nixl", "mooncake-transfer-engine",
    "deep-gemm", "safetensors", "rooftop",
)  # fmt: skip
# Environment variables that change how an engine runs; the rest of rooftop's environment is not recorded.
ENV_PREFIXES = ("CUDA_", "NCCL_", "SGLANG_", "SGL_", "VLLM_", "TORCH", "PYTORCH_", "OMP_", "UCX_", "NIXL_",
                "MC_", "FLASHINFER_", "TRITON_", "HF_", "NVIDIA_")  # fmt: skip
ENGINE_PACKAGES = {"sglang": "sglang", "vllm": "vllm", "embedded": "rooftop"}


def collect_packages(names: list[str]) -> dict:
    """Versions of `names` in this interpreter, with the git commit of editable installs. Self-contained:
    its source is sent to another interpreter with `python -c`."""
    import importlib.metadata as md
    import importlib.util
    import json as _json
    import re
    import subprocess as _sp
    import sys as _sys
    from pathlib import Path as _Path
    from urllib.parse import unquote, urlparse

    out = {"python": _sys.version.split()[0], "executable": _sys.executable, "packages": {}}
    for name in names:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        info = {"version": dist.version}
        direct = dist.read_text("direct_url.json")
        if direct:
            try:
                url = _json.loads(direct)
            except ValueError:
                url = {}
            if url.get("dir_info", {}).get("editable") and url.get("url", "").startswith("file://"):
                src = unquote(urlparse(url["url"]).path)
                info["editable"] = src
                try:
                    head = _sp.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
                    dirty = _sp.run(["git", "-C", src, "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10)  # fmt: skip
                    if head.returncode == 0:
                        info["commit"] = head.stdout.strip()
                        info["dirty"] = bool(dirty.stdout.strip())
                except (OSError, _sp.SubprocessError):
                    pass
        if "commit" not in info:
            # Run from a source tree without install metadata (PYTHONPATH, egg-info): ask git there.
            try:
                mod = importlib.util.find_spec(name.replace("-", "_"))
            except (ImportError, ValueError):
                mod = None
            origin = mod.origin if mod else None
            if origin and "site-packages" not in origin and "dist-packages" not in origin:
                try:
                    head = _sp.run(["git", "-C", str(_Path(origin).parent), "rev-parse", "HEAD"],
                                   capture_output=True, text=True, timeout=10)  # fmt: skip
                    if head.returncode == 0:
                        info["commit"] = head.stdout.strip()
                        info["source"] = str(_Path(origin).parent)
                except (OSError, _sp.SubprocessError):
                    pass
        out["packages"][name] = info
    # torch's CUDA/cuDNN builds, read from torch/version.py without importing torch
    spec = importlib.util.find_spec("torch")
    if spec and spec.submodule_search_locations:
        version_py = _Path(list(spec.submodule_search_locations)[0]) / "version.py"
        try:
            text = version_py.read_text()
        except OSError:
            text = ""
        for key in ("cuda", "hip", "git_version"):
            m = re.search(rf"^{key}\s*(?::[^=]*)?=\s*'([^']*)'", text, re.M)
            if m:
                out[f"torch_{key}"] = m.group(1)
    return out


def packages_code(names: tuple[str, ...] = KEY_PACKAGES) -> str:
    """Python source that prints collect_packages(names) as JSON (run by another interpreter, maybe on another host)."""
    return inspect.getsource(collect_packages) + f"\nimport json; print(json.dumps(collect_packages({list(names)!r})))"


def packages_of(python: str | None = None, names: tuple[str, ...] = KEY_PACKAGES) -> dict:
    """collect_packages run in `python` (default: this interpreter); {"error": ...} if that fails."""
    if python is None or Path(python).absolute() == Path(sys.executable).absolute():
        return collect_packages(list(names))
    code = packages_code(names)
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        return json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return {"error": f"could not read packages of {python}"}


def nvidia_driver() -> dict:
    """Driver and CUDA versions from nvidia-smi; empty without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        banner = subprocess.run([exe], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    info = {"driver_version": out.splitlines()[0].strip() if out.strip() else None}
    for word in banner.split("CUDA Version:")[1:2]:
        info["cuda_driver_version"] = word.split()[0]
    return info


def stack_inventory(
    engine: str,
    python: str | None = None,
    processes: list[dict] | None = None,
    env: dict[str, str] | None = None,
    topology: Topology | None = None,
) -> dict:
    """Everything a reader needs to rebuild the stack. `processes`: [{"role", "pid", "cpus_allowed"}, ...];
    `env`: the deployment's own environment overlay, recorded with the engine-relevant part of ours."""
    relevant = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    topology = topology or discover()
    packages = packages_of(python)
    engine_pkg = packages.get("packages", {}).get(ENGINE_PACKAGES.get(engine, engine), {})
    return {
        "engine": {"name": engine, **engine_pkg},
        "python": {k: packages.get(k) for k in ("python", "executable")},
        "torch": {
            "version": packages.get("packages", {}).get("torch", {}).get("version"),
            "cuda": packages.get("torch_cuda"),
            "git_version": packages.get("torch_git_version"),
        },
        "driver": nvidia_driver(),
        "packages": packages.get("packages", {}),
        "gpus": [{"index": g.index, "name": g.name, "memory_total_mib": g.memory_total_mib,
                  "pci_bus_id": g.pci_bus_id, "numa_node": g.numa_node} for g in topology.gpus],  # fmt: skip
        "gpu_count": len(topology.gpus),
        "gpu_source": topology.gpu_source,
        "host": {
            "cpu_model": cpu_model(),
            "cpus_online": format_cpu_list(topology.online_cpus),
            "cpu_count": len(topology.online_cpus),
            "kernel": platform.release(),
        },
        "numa": [{"node": n.node, "cpus": format_cpu_list(n.cpus)} for n in topology.numa_nodes],
        "processes": processes or [],
        "env": redact_env({**relevant, **(env or {})}),
    }
