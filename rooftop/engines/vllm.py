"""vLLM: `vllm serve MODEL` per server; for pd a NIXL KV connector on both and rooftop's proxy in front.

Flags checked against vLLM's own argument definitions (tests/data/engine_help/vllm.txt): positional
model_tag, --host, --port, --tensor-parallel-size, --kv-transfer-config. vLLM ships no pd proxy in its
package (its examples keep one under tests/), so `rooftop.engines.vllm_proxy` plays that part:
prefill with max_tokens=1, then decode with the prefill's kv_transfer_params.
"""

import json
import sys
from pathlib import Path

from rooftop.engines import Endpoints
from rooftop.engines.common import (
    gpu_env,
    module_importable,
    role_url,
    router_process,
    server_endpoints,
    trace_dir,
    worker_process,
)
from rooftop.launch.supervisor import ProcessSpec
from rooftop.spec.deployment import DeploymentSpec, args_to_argv

NAME = "vllm"
DEFAULT_PORTS = {"single": 8000, "router": 8000, "prefill": 8100, "decode": 8200}
PROFILE_DIR_ENV = "VLLM_TORCH_PROFILER_DIR"
NIXL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
DEFAULT_NIXL_PORTS = {"prefill": 5600, "decode": 5601}  # two workers on one host need two side channels
NIXL_KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
TP_KEYS = ("tensor-parallel-size", "tp")


def installed(python: str | None = None, topology: str = "single") -> bool:
    """Whether vllm is importable by `python` (the pd proxy is rooftop's own)."""
    return module_importable("vllm", python)


def install_hint() -> str:
    return "pip install vllm (and nixl for pd)"


def vllm_command(python: str | None) -> list[str]:
    """The `vllm` console script beside the engine's interpreter, else `vllm` from PATH."""
    candidate = Path(python or sys.executable).parent / "vllm"
    return [str(candidate)] if candidate.exists() else ["vllm"]


def server_argv(spec: DeploymentSpec, name: str) -> list[str]:
    """argv of one `vllm serve` for role `name`."""
    role = spec.roles()[name]
    args = spec.role_args(name)
    argv = [*vllm_command(spec.python), "serve", str(spec.model), "--host", role.host, "--port", str(role.port)]
    if role.gpus and not any(k in args for k in TP_KEYS):
        argv += ["--tensor-parallel-size", str(len(role.gpus))]
    if name in ("prefill", "decode") and "kv-transfer-config" not in args:
        argv += ["--kv-transfer-config", json.dumps(NIXL_KV_TRANSFER, separators=(",", ":"))]
    return argv + args_to_argv(args)


def process_specs(spec: DeploymentSpec, run_dir: Path) -> list[ProcessSpec]:
    """vllm servers for each worker role and rooftop's pd proxy. Ports must be resolved."""
    roles = spec.roles()
    procs = []
    for name, role in roles.items():
        if name == "router":
            continue
        env = {**gpu_env(role.gpus), PROFILE_DIR_ENV: trace_dir(run_dir, name)}
        if name in DEFAULT_NIXL_PORTS:
            env[NIXL_PORT_ENV] = str(DEFAULT_NIXL_PORTS[name])
        env.update(spec.role_env(name))
        procs.append(worker_process(name, role, server_argv(spec, name), env))
    if spec.topology == "pd":
        router = roles["router"]
        command = [sys.executable, "-m", "rooftop.engines.vllm_proxy",
                   "--prefill", role_url(roles["prefill"]), "--decode", role_url(roles["decode"])]
        procs.append(router_process(spec, router, command))
    return procs


def endpoints(url: str, role: str = "single") -> Endpoints:
    """vLLM's endpoints: /health, /metrics, and the torch profiler when VLLM_TORCH_PROFILER_DIR is set."""
    return server_endpoints(url, role, profile_dir_env=PROFILE_DIR_ENV, router_metrics=False)
