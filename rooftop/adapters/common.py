"""Small pieces the three engine modules share: URLs of a role, GPU visibility, "is this module importable"."""

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rooftop.adapters.protocol import Endpoints
from rooftop.launch.supervisor import ProcessSpec
from rooftop.spec.deployment import WILDCARDS, DeploymentSpec, Role, args_to_argv


def role_url(role: Role) -> str:
    """The URL a client on this host uses for a role (a wildcard bind is reached over loopback)."""
    host = "127.0.0.1" if role.host in WILDCARDS else role.host
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{role.port}"


def gpu_env(gpus: list[int]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for a role's GPUs (nothing when it names none)."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)} if gpus else {}


def trace_dir(run_dir: Path, name: str) -> str:
    """Where the traces of process `name` go."""
    return str((run_dir / "traces" / name).absolute())


def module_importable(module: str, python: str | None = None) -> bool:
    """Whether `module` can be imported by `python` (default: this interpreter), without importing it here."""
    if python is None or Path(python).absolute() == Path(sys.executable).absolute():
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def worker_process(name: str, role: Role, argv: list[str], env: dict[str, str]) -> ProcessSpec:
    """A server process for a worker role (single, prefill or decode); health at /health."""
    url = role_url(role)
    return ProcessSpec(name=name, role=name, argv=argv, env=env, cpus=role.cpus, numa=role.numa,
                       gpus=list(role.gpus), health_url=url + "/health", url=url, machine=role.machine)


def api_key(spec: DeploymentSpec) -> str | None:
    """The key clients must send (vLLM's, SGLang's and the embedded engine's `--api-key`): the role
    clients reach has it (a single server; a pd router), or the workers behind a router that passes
    the client's header on (rooftop's vLLM proxy) or sends its own (`rooftop router`)."""
    roles = spec.roles()
    for name in ("single", "router", "decode", "prefill"):
        if name in roles and spec.role_args(name).get("api-key"):
            return str(spec.role_args(name)["api-key"])
    return None


def router_process(spec: DeploymentSpec, router: Role, command: list[str]) -> ProcessSpec:
    """The process in front of a PD pair: `command` (program and its --prefill/--decode URLs) plus
    the router role's host, port and extra args; health at /health."""
    url = role_url(router)
    argv = [*command, "--host", router.host, "--port", str(router.port), *args_to_argv(router.args)]
    return ProcessSpec(name="router", role="router", argv=argv, env={**spec.env, **router.env},
                       cpus=router.cpus, numa=router.numa, health_url=url + "/health", url=url,
                       machine=router.machine)


def node_processes(spec: DeploymentSpec, name: str, base: ProcessSpec,
                   node_flags: Callable[[int], list[str]]) -> list[ProcessSpec]:
    """A multi-node role's processes: `base` (rank 0, the one clients reach) with node_flags(0), and one
    process per further node, named NAME-nodeK, on that host: the same argv binding that host's address,
    with node_flags(K), and no health URL (those ranks serve no HTTP; rank 0 answers once all joined)."""
    role = spec.roles()[name]
    argv = base.argv
    base.argv = argv + node_flags(0)
    procs = [base]
    for rank, node in enumerate(role.nodes[1:], start=1):
        address = spec.address(node)
        node_argv = [address if i > 0 and argv[i - 1] == "--host" else a for i, a in enumerate(argv)]
        procs.append(ProcessSpec(name=f"{name}-node{rank}", role=name, argv=node_argv + node_flags(rank),
                                 env=dict(base.env), cpus=role.cpus, numa=role.numa, gpus=list(role.gpus),
                                 machine=node, fixes=list(base.fixes)))
    return procs


def server_endpoints(url: str, role: str, profile_dir_env: str | None) -> Endpoints:
    """/health, /metrics and the torch profiler's /start_profile and /stop_profile at `url`. A router has
    no profiler; `profile_dir_env` is the variable that names the trace directory, where the engine has one."""
    profiled = role != "router"
    return Endpoints(
        base_url=url,
        health_url=url + "/health",
        metrics_url=url + "/metrics",
        profile_start_url=url + "/start_profile" if profiled else None,
        profile_stop_url=url + "/stop_profile" if profiled else None,
        profile_dir_env=profile_dir_env if profiled else None,
    )


# The servers' span export, as vLLM and the embedded engine spell the flag (a campaign wires it:
# campaign/server_spans.py). An OTLP/HTTP URL, e.g. http://127.0.0.1:4318/v1/traces.
TRACES_ARG = "otlp-traces-endpoint"


def traces_endpoint(spec: DeploymentSpec) -> str | None:
    """Where the deployment's servers send their spans (its args' otlp-traces-endpoint); None: nowhere."""
    value = spec.args.get(TRACES_ARG)
    return value if isinstance(value, str) and value else None


def with_traces_arg(spec: DeploymentSpec, endpoint: str, env: dict[str, str] | None = None) -> DeploymentSpec:
    """A copy of `spec` whose every worker exports its spans to `endpoint` (and gets `env`)."""
    out = spec.model_copy(deep=True)
    out.args = {**out.args, TRACES_ARG: endpoint}
    out.env = {**(env or {}), **out.env}  # the deployment's own env wins
    return out
