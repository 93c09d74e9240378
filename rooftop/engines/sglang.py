"""SGLang: `python -m sglang.launch_server` per server, `python -m sglang_router.launch_router` for pd.

Flags checked against SGLang's own argument definitions (tests/data/engine_help/sglang.txt):
--model-path, --host, --port, --tp-size, --enable-metrics, --disaggregation-mode,
--disaggregation-bootstrap-port (default 8998); router: --pd-disaggregation, --prefill URL BOOTSTRAP_PORT,
--decode URL, --host, --port. GPUs are chosen with CUDA_VISIBLE_DEVICES (so --base-gpu-id stays 0).

A role over several hosts (`nodes`) runs one `launch_server` per node with --nnodes, --node-rank and
--dist-init-addr (rank 0's address, port 25000 unless given); --tp-size defaults to the GPUs of all nodes.
Only rank 0 serves HTTP.
"""

import sys
from pathlib import Path

from rooftop.engines import Endpoints
from rooftop.engines.common import (
    gpu_env,
    module_importable,
    node_processes,
    role_url,
    router_process,
    server_endpoints,
    trace_dir,
    worker_process,
)
from rooftop.launch.supervisor import ProcessSpec
from rooftop.spec.deployment import DeploymentSpec, args_to_argv

NAME = "sglang"
DEFAULT_PORTS = {"single": 30000, "router": 8000, "prefill": 30000, "decode": 30001}
DEFAULT_BOOTSTRAP_PORT = 8998  # sglang's default for --disaggregation-bootstrap-port
EAGER_PROFILE = None  # the map is another deployment: eager_variant
PROFILE_DIR_ENV = "SGLANG_TORCH_PROFILER_DIR"
TP_KEYS = ("tp-size", "tp", "tensor-parallel-size")
DIST_INIT_PORT = 25000  # SGLang has no default for --dist-init-addr; its help text gives 192.168.0.2:25000


def installed(python: str | None = None, topology: str = "single") -> bool:
    """Whether sglang (and for pd the sglang router) is importable by `python`."""
    if not module_importable("sglang", python):
        return False
    return topology != "pd" or module_importable("sglang_router", python)


def install_hint() -> str:
    return "pip install sglang sglang-router"


def bootstrap_port(spec: DeploymentSpec) -> int:
    """The prefill server's KV bootstrap port, which the router must be told."""
    return int(spec.role_args("prefill").get("disaggregation-bootstrap-port", DEFAULT_BOOTSTRAP_PORT))


def server_argv(spec: DeploymentSpec, name: str) -> list[str]:
    """argv of one `sglang.launch_server` for role `name`."""
    role = spec.roles()[name]
    args = spec.role_args(name)
    argv = [spec.python or sys.executable, "-m", "sglang.launch_server", "--model-path", str(spec.model),
            "--host", role.host, "--port", str(role.port)]  # fmt: skip
    if role.gpus and not any(k in args for k in TP_KEYS):
        argv += ["--tp-size", str(len(role.gpus) * max(1, len(role.nodes)))]
    if "enable-metrics" not in args:
        argv.append("--enable-metrics")  # /metrics answers only with it
    if name in ("prefill", "decode") and "disaggregation-mode" not in args:
        argv += ["--disaggregation-mode", name]
    return argv + args_to_argv(args)


def node_flags(spec: DeploymentSpec, name: str, rank: int) -> list[str]:
    """--nnodes, --node-rank and --dist-init-addr of node `rank` of a multi-node role (what args leave out)."""
    role, args = spec.roles()[name], spec.role_args(name)
    flags = [] if "nnodes" in args else ["--nnodes", str(len(role.nodes))]
    flags += ["--node-rank", str(rank)]
    if "dist-init-addr" not in args:
        flags += ["--dist-init-addr", f"{spec.address(role.nodes[0])}:{DIST_INIT_PORT}"]
    return flags


def process_specs(spec: DeploymentSpec, run_dir: Path) -> list[ProcessSpec]:
    """sglang servers for each worker role and the sglang router for pd. Ports must be resolved."""
    roles = spec.roles()
    procs = []
    for name, role in roles.items():
        if name == "router":
            continue
        env = {**gpu_env(role.gpus), PROFILE_DIR_ENV: trace_dir(run_dir, name), **spec.role_env(name)}
        proc = worker_process(name, role, server_argv(spec, name), env)
        if role.nodes:
            procs += node_processes(spec, name, proc, lambda rank, name=name: node_flags(spec, name, rank))
        else:
            procs.append(proc)
    if spec.topology == "pd":
        router = roles["router"]
        command = [spec.python or sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                   "--prefill", role_url(roles["prefill"]), str(bootstrap_port(spec)),
                   "--decode", role_url(roles["decode"])]
        procs.append(router_process(spec, router, command))
    return procs


def endpoints(url: str, role: str = "single") -> Endpoints:
    """SGLang's endpoints: /health (503 while starting), /metrics with --enable-metrics, torch profiler."""
    return server_endpoints(url, role, profile_dir_env=PROFILE_DIR_ENV)


def eager_variant(spec: DeploymentSpec) -> DeploymentSpec | None:
    """The same deployment without CUDA graphs or torch.compile (the profile map); None when it has neither."""
    if spec.args.get("disable-cuda-graph") is True and not spec.args.get("enable-torch-compile"):
        return None
    eager = spec.model_copy(deep=True)
    eager.args["disable-cuda-graph"] = True
    eager.args.pop("enable-torch-compile", None)
    return eager
