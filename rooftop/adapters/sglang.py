"""SGLang: `python -m sglang.launch_server` per server, `python -m sglang_router.launch_router` for pd.

Flags checked against SGLang's own argument definitions (tests/data/engine_help/sglang.txt):
--model-path, --host, --port, --tp-size, --enable-metrics, --disaggregation-mode,
--disaggregation-bootstrap-port (default 8998); router: --pd-disaggregation, --prefill URL BOOTSTRAP_PORT,
--decode URL, --host, --port. GPUs are chosen with CUDA_VISIBLE_DEVICES (so --base-gpu-id stays 0).

A role over several hosts (`nodes`) runs one `launch_server` per node with --nnodes, --node-rank and
--dist-init-addr (rank 0's address, [bracketed] when IPv6, port 25000 for single and prefill, 25100 for
decode unless given: SGLang takes that port and the few above it); --tp-size defaults to the GPUs of all
nodes over the pipeline stages (pp-size). Only rank 0 serves HTTP.

A flag set to false becomes --no-KEY where SGLang has that form, else it is left out (rooftop/adapters/flags.py).

Server spans: no `with_traces`, so a campaign runs no OTLP receiver for SGLang. Its tracing (`--enable-trace
--otlp-traces-endpoint`, gRPC unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf) exports spans of its
own request stages, not the `llm_request` span with gen_ai.request.id = the client's X-Request-Id and the
gen_ai.latency.* attributes that rooftop's join reads (bench/latency.py): that mapping is what is missing.
"""

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
    worker_process,
)
from rooftop.adapters.flags import check_role_flags, engine_argv, prefix_caching_argv, speculative_argv
from rooftop.adapters.protocol import Endpoints
from rooftop.errors import RooftopError
from rooftop.launch.supervisor import ProcessSpec
from rooftop.spec.deployment import DeploymentSpec
from rooftop.spec.speculative import Speculative

NAME = "sglang"
DEFAULT_PORTS = {"single": 30000, "router": 8000, "prefill": 30000, "decode": 30001}
DEFAULT_BOOTSTRAP_PORT = 8998  # sglang's default for --disaggregation-bootstrap-port
EAGER_PROFILE = None  # the map is another deployment: eager_variant
PROFILE_DIR_ENV = "SGLANG_TORCH_PROFILER_DIR"
TP_KEYS = ("tp-size", "tp", "tensor-parallel-size")
PP_KEYS = ("pp-size", "pipeline-parallel-size")
DIST_INIT_PORT = 25000  # SGLang has no default for --dist-init-addr; its help text gives 192.168.0.2:25000
# SGLang over nodes also listens on the ports just above --dist-init-addr's (PortArgs: +1 .. +6, and one a
# DP rank): two roles whose rank 0 share a host need rendezvous ports apart.
ROLE_PORT_OFFSET = {"single": 0, "prefill": 0, "decode": 100}
# The deployment's prefix_caching: SGLang's radix cache is on unless --disable-radix-cache (no flag turns it on)
PREFIX_CACHING = {True: [], False: ["--disable-radix-cache"]}
# The deployment's speculative as SGLang's --speculative-algorithm. Read in SGLang's ServerArgs
# (python/sglang/srt/server_args.py @ 001067ff, the commit tests/data/engine_help/sglang.txt records): its builtins
# are "EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DFLASH, DSPARK"; NEXTN is its name for a model's own MTP layers.
SGLANG_ALGORITHM = {"ngram": "NGRAM", "mtp": "NEXTN", "eagle": "EAGLE", "eagle3": "EAGLE3"}
# A pd pair gets the same flags on both workers, as SGLang's disaggregated speculative serving is launched (NVIDIA
# Dynamo's "Speculative Decoding with SGLang": "Pass the same speculative decoding flags to the prefill and decode
# workers").
# Every flag speculative_flags may set (an alias too): one of them in args as well is refused (flags.speculative_argv).
SPECULATIVE_FLAGS = ("speculative-algorithm", "speculative-num-steps", "speculative-eagle-topk",
                     "speculative-num-draft-tokens", "speculative-draft-model-path", "speculative-draft-model",
                     "speculative-ngram-max-bfs-breadth")


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
        argv += ["--tp-size", str(default_tp(spec, name))]
    if "enable-metrics" not in args:
        argv.append("--enable-metrics")  # /metrics answers only with it
    if name in ("prefill", "decode") and "disaggregation-mode" not in args:
        argv += ["--disaggregation-mode", name]
    return (argv + engine_argv(NAME, args) + prefix_caching_argv(spec, name, PREFIX_CACHING)
            + speculative_argv(spec, name, SPECULATIVE_FLAGS, speculative_flags))


def speculative_flags(s: Speculative) -> list[str]:
    """A deployment's `speculative` in SGLang's flags, a chain of k = num_speculative_tokens drafts a step as vLLM's:
    EAGLE, EAGLE3 and NEXTN (mtp) draft k steps of one token each (--speculative-num-steps k,
    --speculative-eagle-topk 1) and verify them with the token before (--speculative-num-draft-tokens k + 1: SGLang
    counts that token among the draft tokens, and with topk 1 sets num_draft_tokens to num_steps + 1 itself). NGRAM
    drafts up to k + 1 tree nodes, the root included, and its topk is its BFS breadth, held at 1 for a chain."""
    k = s.num_speculative_tokens
    argv = ["--speculative-algorithm", SGLANG_ALGORITHM[s.method], "--speculative-num-draft-tokens", str(k + 1)]
    if s.method == "ngram":
        if s.prompt_lookup_min is not None or s.prompt_lookup_max is not None:
            raise RooftopError("sglang: speculative prompt_lookup_min/max have no SGLang flag: its NGRAM drafter "
                               "matches recent tokens in a trie (speculative-ngram-max-trie-depth), not in a "
                               "prompt-lookup window",
                               "drop prompt_lookup_min/max from speculative, or give SGLang's speculative-ngram-* "
                               "flags in args")
        return argv + ["--speculative-ngram-max-bfs-breadth", "1"]
    argv += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
    return argv + (["--speculative-draft-model-path", s.model] if s.model else [])


def default_tp(spec: DeploymentSpec, name: str) -> int:
    """--tp-size when args do not set it: the GPUs of all the role's nodes over its pipeline stages."""
    role, args = spec.roles()[name], spec.role_args(name)
    stages = int(next((args[k] for k in PP_KEYS if k in args), 1))
    gpus = len(role.gpus) * max(1, len(role.nodes))
    tp, rest = divmod(gpus, stages)
    if rest or tp == 0:
        raise RooftopError(f"{name}: {gpus} GPU(s) do not split into {stages} pipeline stage(s) of equal tp-size",
                           "set tp-size in args, or give the role a GPU count the stages divide")
    return tp


def dist_init_addr(spec: DeploymentSpec, name: str) -> str:
    """--dist-init-addr of a multi-node role: rank 0's address (IPv6 in brackets) and the role's port."""
    address = spec.address(spec.roles()[name].nodes[0])
    if ":" in address:
        address = f"[{address}]"
    return f"{address}:{DIST_INIT_PORT + ROLE_PORT_OFFSET[name]}"


def node_flags(spec: DeploymentSpec, name: str, rank: int) -> list[str]:
    """--nnodes, --node-rank and --dist-init-addr of node `rank` of a multi-node role (what args leave out)."""
    role, args = spec.roles()[name], spec.role_args(name)
    flags = [] if "nnodes" in args else ["--nnodes", str(len(role.nodes))]
    flags += ["--node-rank", str(rank)]
    if "dist-init-addr" not in args:
        flags += ["--dist-init-addr", dist_init_addr(spec, name)]
    return flags


def rendezvous_ports(spec: DeploymentSpec) -> list[tuple[str, str | None, int]]:
    """(role, host entry, port) of the ports a multi-node role's rank 0 listens on besides HTTP: the
    --dist-init-addr port and the six above it (SGLang's PortArgs), for a preflight to check free."""
    out = []
    for name, role in spec.roles().items():
        if role.nodes and name != "router":
            given = spec.role_args(name).get("dist-init-addr")
            port = int(str(given).rsplit(":", 1)[1]) if given else DIST_INIT_PORT + ROLE_PORT_OFFSET[name]
            out += [(name, role.nodes[0], p) for p in range(port, port + 7)]
    return out


def process_specs(spec: DeploymentSpec, run_dir: Path) -> list[ProcessSpec]:
    """sglang servers for each worker role and the sglang router for pd. Ports must be resolved."""
    check_role_flags(spec)
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
