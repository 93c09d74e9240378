"""A deployment's processes: the adapter of its engine, ports resolved, CPUs placed, other hosts reached
over SSH. `build_processes` is the one entry point the rest of rooftop needs."""

import hashlib
import socket
from pathlib import Path, PosixPath

from rooftop.adapters.protocol import Engine
from rooftop.errors import RooftopError
from rooftop.hardware.pinning import resolve_cpus
from rooftop.hardware.topology import Topology
from rooftop.launch.ssh import SSHHost
from rooftop.launch.supervisor import ProcessSpec
from rooftop.spec.deployment import DeploymentSpec, home_relative


def get_engine(name: str) -> Engine:
    """The engine module called `name`; RooftopError for an unknown one."""
    from rooftop.adapters import embedded, sglang, vllm  # noqa: I001 - the adapters, loaded when named

    engines = {"embedded": embedded, "sglang": sglang, "vllm": vllm}
    if name not in engines:
        raise RooftopError(f"unknown engine {name!r}", f"use one of: {', '.join(engines)}")
    return engines[name]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def resolve_ports(spec: DeploymentSpec, default_ports: dict[str, int]) -> DeploymentSpec:
    """A copy of `spec` where every role has a concrete port: unset -> the engine's default, 0 -> a free one."""
    spec = spec.model_copy(deep=True)
    for name, role in spec.roles().items():
        if role.port is None:
            role.port = default_ports[name]
        elif role.port == 0:
            role.port = free_port(role.host)
    return spec


def require_installed(engine: Engine, python: str | None, topology: str = "single") -> None:
    """RooftopError when `engine` cannot be imported by the interpreter that would run it."""
    if not engine.installed(python, topology):
        where = f" for {python}" if python else ""
        raise RooftopError(
            f"{engine.NAME} is not installed{where} ({engine.install_hint()})",
            "install it, point `deployment.python` at an environment that has it, or use --dry-run",
        )


def build_processes(
    spec: DeploymentSpec, run_dir: str | Path, topology: Topology | None = None
) -> list[ProcessSpec]:
    """The processes of a deployment with ports resolved and, given this host's topology, NUMA nodes
    turned into CPU lists (RooftopError for a node or CPU this host lacks).

    Without a topology (a dry run, maybe for another host) placement is left as written: a NUMA node
    stays a node and the launch script binds it with numactl there. A process on another host is built
    by the engine for its run directory there (`remote_run_dir`, passed as a `RemoteDir`) and gets `host`
    (how to reach it); its NUMA node is resolved there, by the wrapper.
    """
    engine = get_engine(spec.engine)
    if not spec.model and spec.engine != "embedded":
        raise RooftopError("deployment.model is not set", "set it to the model's path (or [model] path in a campaign)")
    run_dir = Path(run_dir)
    spec = resolve_ports(spec, engine.DEFAULT_PORTS).placed()
    processes = engine.process_specs(spec, run_dir)
    machines = {p.machine for p in processes if p.machine is not None}
    for name in sorted(machines):  # each host's processes from a spec built for it: its run directory, its python
        host = spec.hosts[name]
        there = spec.model_copy(update={"python": host.python}) if host.python else spec
        remote_dir = remote_run_dir(host.workdir, run_dir, name)
        alt = {p.name: p for p in engine.process_specs(there, RemoteDir(remote_dir)) if p.machine == name}
        processes = [alt.get(p.name, p) if p.machine == name else p for p in processes]
    for proc in processes:
        if proc.machine is not None:
            _place_remote(proc, spec, run_dir)
        elif topology is not None:
            proc.cpus = resolve_cpus(proc.numa, proc.cpus, topology)
    return processes


class RemoteDir(PosixPath):
    """A run directory on another host, as that host reads it: paths under it stay as written (a relative
    one is under the ssh user's home there), never made absolute against this machine's working directory."""

    def absolute(self) -> "RemoteDir":
        return self

    def resolve(self, strict: bool = False) -> "RemoteDir":
        return self


def remote_run_dir(workdir: str, run_dir: Path, machine: str | None = None) -> str:
    """The run directory on host `machine`: under its workdir, named after the local one and unique to it,
    one subdirectory per host (hosts that share a home directory over NFS write apart)."""
    digest = hashlib.sha1(str(run_dir.absolute()).encode()).hexdigest()[:10]
    base = f"{home_relative(workdir).rstrip('/') or '/'}/{run_dir.name}-{digest}".replace("//", "/")
    return f"{base}/{machine}" if machine else base


def _place_remote(proc: ProcessSpec, spec: DeploymentSpec, run_dir: Path) -> None:
    host = spec.hosts[proc.machine]
    proc.host = SSHHost(name=proc.machine, address=spec.address(proc.machine), user=host.user, port=host.ssh_port,
                        identity_file=host.identity_file, options=list(host.ssh_options),
                        workdir=home_relative(host.workdir), python=host.python)
    proc.remote_dir = remote_run_dir(host.workdir, run_dir, proc.machine)


def entry_process(processes: list[ProcessSpec]) -> ProcessSpec:
    """The process clients talk to: the router of a pd deployment, else the single server."""
    for proc in processes:
        if proc.role == "router":
            return proc
    return processes[0]
