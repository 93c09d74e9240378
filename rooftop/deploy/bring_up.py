"""Bring a deployment up, prove where it runs, hand it to the caller, take it down.

    with bring_up(spec, run_dir) as live:
        print(live.url, live.placement)   # bench it, profile it ...
    # every process group is gone here, also after Ctrl-C or SIGTERM

The run directory keeps launch.sh (what was started, runnable by hand), logs/, pids.json while up,
and inventory.json (the stack and each process's verified CPUs).

Processes on other hosts (roles naming a [deployment.hosts] entry) start there over SSH (launch/ssh.py):
before anything starts, each host is reached and checked (the engine's interpreter and module there,
every port free), so a bad host is one error and nothing runs; their placement is read from that
host's /proc; a launch-HOST.sh per host is kept beside launch.sh.
"""

import json
import os
import shlex
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rooftop.adapters.common import api_key, module_importable
from rooftop.adapters.inventory import stack_inventory
from rooftop.adapters.processes import (
    build_processes,
    entry_process,
    get_engine,
    require_installed,
)
from rooftop.auth import auth_headers
from rooftop.errors import RooftopError
from rooftop.hardware.pinning import cpus_allowed, verify_pinning
from rooftop.hardware.topology import discover, format_cpu_list, parse_cpu_list
from rooftop.launch.logs import logs_report
from rooftop.launch.scripts import host_scripts
from rooftop.launch.supervisor import ProcessSpec, RunningProcess, Supervisor, reap_leftovers
from rooftop.redact import redact_env
from rooftop.spec.deployment import DeploymentSpec


@dataclass(slots=True)
class LiveDeployment:
    """A deployment that is up: where clients go, what runs where, and the stack under it."""

    spec: DeploymentSpec
    run_dir: Path
    url: str
    processes: list[RunningProcess]
    placement: list[dict]  # [{"role", "name", "pid", "cpus_allowed", "expected_cpus", "tree"}]
    inventory: dict
    supervisor: Supervisor


def verify_remote_pinning(proc: RunningProcess, supervisor: Supervisor) -> dict[int, list[int]]:
    """Cpus_allowed_list of a remote process and its descendants, read from its host's /proc; RooftopError
    when one may run outside the CPUs the wrapper pinned it to."""
    tree = {pid: parse_cpu_list(cpus) for pid, cpus in
            supervisor.connections().placement(proc.spec.host, proc.pid).items()}
    if proc.pid not in tree:
        raise RooftopError(f"{proc.spec.name} (pid {proc.pid}){proc.where} is gone", "read its log in the run directory")
    expected = set(proc.remote_cpus or [])
    for pid, allowed in tree.items():
        if expected and not set(allowed) <= expected:
            raise RooftopError(
                f"process {proc.spec.name} (pid {pid}){proc.where} may run on CPUs {format_cpu_list(allowed)}, "
                f"outside its placement {format_cpu_list(sorted(expected))}",
                "something re-pinned it after start; align the spec's cpus/numa with it or turn that binding off")
    return tree


def verify_placement(processes: list[RunningProcess], supervisor: Supervisor | None = None) -> list[dict]:
    """Cpus_allowed_list of each process and its descendants, checked against its placement (RooftopError);
    a process on another host is read from that host's /proc."""
    placement = []
    for proc in processes:
        expected = proc.spec.cpus
        if proc.spec.host is not None and supervisor is not None:
            tree = verify_remote_pinning(proc, supervisor)
            expected = proc.remote_cpus
        elif expected:
            tree = verify_pinning(proc.pid, expected, proc.spec.name)
        else:
            tree = {proc.pid: cpus_allowed(proc.pid) or []}
        placement.append(
            {
                "role": proc.spec.role,
                "name": proc.spec.name,
                "host": proc.spec.host.name if proc.spec.host else None,
                "pid": proc.pid,
                "cpus_allowed": format_cpu_list(tree.get(proc.pid, [])),
                "expected_cpus": format_cpu_list(expected) if expected else None,
                "tree": {str(pid): format_cpu_list(cpus) for pid, cpus in tree.items()},
            }
        )
    return placement


def verify_serving(url: str, supervisor: Supervisor, timeout_s: float, key: str | None = None) -> None:
    """One greedy two-token completion through the entry point (with the deployment's API key `key`):
    healthy is not serving (vLLM on CPU passes /health with an MLA head size its kernels refuse, then
    fails every request). RooftopError with the answer and the workers' log otherwise."""
    if not url:
        return
    auth = auth_headers(key)
    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/v1/models", headers=auth), timeout=30) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 2, "temperature": 0.0}).encode()
        request = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json", **auth})
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            resp.read()
        return
    except urllib.error.HTTPError as exc:
        body = exc.read()
        answer = f"HTTP {exc.code}: {body[:300].decode(errors='replace')}"
        failed = _failed_role(body)
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
        answer = f"{type(exc).__name__}: {exc}"
        failed = None
    workers = [p for p in supervisor.processes if p.spec.role != "router"]
    named = [p for p in workers if p.spec.role == failed] or workers or list(supervisor.processes)
    raise RooftopError(f"{url} is healthy but a first completion failed ({answer}){workers_report(named)}",
                       "the engine cannot serve this model as configured; read the log")


def _failed_role(body: bytes) -> str | None:
    """The worker a pd proxy's error names ({"error": {"type": "prefill_failed"}} -> "prefill"; a worker's own
    4xx comes as "prefill_refused"), else None."""
    try:
        kind = json.loads(body)["error"]["type"]
    except (ValueError, KeyError, TypeError):
        return None
    role, _, outcome = str(kind).partition("_")
    return role if role in ("prefill", "decode") and outcome in ("failed", "refused") else None


def workers_report(procs: list) -> str:
    """What the logs of `procs` say (`logs_report`)."""
    return logs_report([(getattr(p.spec, "name", p.spec.role), p.log_path) for p in procs])


def remote_inventory(specs: list[ProcessSpec], supervisor: Supervisor, python: str | None = None) -> dict:
    """{host name: {"address", "python", "packages", "kernel"}} of the hosts the processes run on, read
    there through the engine's own interpreter: the one its argv runs (`PYTHON -m ...`), else the host's
    `python`, else `python` (deployment.python), else python3 (`{"error": ...}` where it could not be read)."""
    from rooftop.adapters.inventory import packages_code

    out: dict[str, dict] = {}
    for spec in specs:
        host = spec.host
        if host is None or host.name in out:
            continue
        python_there = (spec.argv[0] if len(spec.argv) > 2 and spec.argv[1] == "-m"
                        else host.python or python or "python3")
        entry: dict = {"address": host.address}
        try:
            done = supervisor.connections().run(host, shlex.join([python_there, "-c", packages_code()]) + "; uname -r")
            lines = done.stdout.decode(errors="replace").strip().splitlines()
            entry.update(json.loads(lines[0]) if done.returncode == 0 and lines else {"error": "unreadable"})
            entry["kernel"] = lines[-1] if len(lines) > 1 else None
        except (RooftopError, ValueError) as exc:
            entry["error"] = str(exc)
        out[host.name] = entry
    return out


def check_local_program(proc: ProcessSpec, engine) -> None:
    """RooftopError when a process on this machine (the pd router) cannot start: its program is missing, or
    its interpreter cannot import its module (`PYTHON -m MODULE ...`)."""
    exe = proc.argv[0]
    if not (shutil.which(exe) or (os.path.isfile(exe) and os.access(exe, os.X_OK))):
        raise RooftopError(f"the {proc.name} runs on this machine with {exe!r}, which is not there",
                           "point deployment.python at an interpreter of this machine that has the engine")
    if len(proc.argv) > 2 and proc.argv[1] == "-m" and not module_importable(proc.argv[2], exe):
        raise RooftopError(f"the {proc.name} runs on this machine with {exe}, which cannot import {proc.argv[2]} "
                           f"({engine.install_hint()})",
                           "install it for that interpreter, or point deployment.python at one that has it")


def check_hosts(specs: list[ProcessSpec], supervisor: Supervisor, engine_name: str,
                rendezvous: list[tuple[str, str | None, int]] = ()) -> None:
    """Reach every host the processes need and check, before anything starts, that the engine's program
    (and its Python module) is there and every port is free: the HTTP ports and the `rendezvous` ports
    ((role, hosts entry, port): a multi-node role's rank 0, NIXL's side channels; engine.rendezvous_ports);
    RooftopError naming the first problem."""
    by_host: dict[str, list[ProcessSpec]] = {}
    for spec in specs:
        if spec.host is not None:
            by_host.setdefault(spec.host.name, []).append(spec)
    for procs in by_host.values():
        host = procs[0].host
        executables = sorted({p.argv[0] for p in procs})
        modules = sorted({(p.argv[0], p.argv[2]) for p in procs if len(p.argv) > 2 and p.argv[1] == "-m"})
        ports = [(p.url.rsplit("://", 1)[1].rsplit(":", 1)[0].strip("[]"), int(p.url.rsplit(":", 1)[1]))
                 for p in procs if p.url]
        owners = {port: p.name for (_, port), p in zip(ports, [p for p in procs if p.url], strict=True)}
        for role, machine, port in rendezvous:  # bound on the host's address, like its HTTP ports
            if machine == host.name and port not in owners:
                address = next((a for a, _ in ports), None) or host.name
                ports.append((address, port))
                owners[port] = f"{role} (its rendezvous or KV side channel)"
        found = supervisor.connections().preflight(host, executables, modules, ports)
        where = f"[deployment.hosts.{host.name}] python" if host.python else "deployment.python"
        if found["missing"]:
            raise RooftopError(f"{host.describe()} has no {found['missing'][0]!r} (the {engine_name} engine's program)",
                               f"install the engine there, or point {where} at its interpreter on that host")
        if found["no_module"]:
            exe, module = found["no_module"][0]
            raise RooftopError(f"{exe} on {host.describe()} cannot import {module} ({engine_name} is not installed "
                               "for it)", f"install it there, or point {where} at an interpreter that has it")
        if found["ports"]:
            address, port, kind, why = found["ports"][0]
            owner = owners.get(port, "a process")
            table = f"[deployment.hosts.{host.name}] address"
            raise {
                "in_use": RooftopError(f"port {port} on {host.describe()} is not free for {owner} ({address}:{port}: "
                                       f"{why})", f"stop what listens there, or give {owner} another `port` in the spec"),
                "not_here": RooftopError(f"{owner} would listen on {address}, which is not an address of "
                                         f"{host.describe()} ({address}:{port}: {why})",
                                         f"set {table} to one of that host's own addresses that the other machines "
                                         "reach (`ip -brief addr` there); ssh may still reach it by another"),
                "unresolved": RooftopError(f"{address!r}, the address {owner} would listen on, does not resolve on "
                                           f"{host.describe()} ({why})",
                                           f"set {table} to the host's IP address: without one the table's name is "
                                           "the address, and an alias from ~/.ssh/config is known to ssh alone"),
            }.get(kind, RooftopError(f"{owner} cannot listen on {address}:{port} on {host.describe()} ({why})",
                                     f"give {owner} another `port` in the spec (under 1024 needs root)"))


def rendezvous_ports(spec: DeploymentSpec, engine) -> list[tuple[str, str | None, int]]:
    """The engine's ports besides HTTP (engine.rendezvous_ports) of the placed spec; [] where it has none."""
    from rooftop.adapters.processes import resolve_ports

    listed = getattr(engine, "rendezvous_ports", None)
    return listed(resolve_ports(spec, engine.DEFAULT_PORTS).placed()) if listed else []


@contextmanager
def bring_up(
    spec: DeploymentSpec, run_dir: str | Path, ready_timeout_s: float = 900.0, grace_s: float = 10.0
) -> Iterator[LiveDeployment]:
    """Start workers, wait for health, start the router, verify placement, write the inventory; tear down on exit."""
    run_dir = Path(run_dir)
    topology = discover()
    engine = get_engine(spec.engine)
    specs = build_processes(spec, run_dir, topology)
    if any(s.host is None and s.role != "router" for s in specs):  # remote hosts are checked by check_hosts
        require_installed(engine, spec.python, spec.topology)
    for router in (s for s in specs if s.host is None and s.role == "router"):  # before any host starts a worker
        check_local_program(router, engine)
    run_dir.mkdir(parents=True, exist_ok=True)
    reap_leftovers(run_dir)
    for name, text in host_scripts(specs, f"{spec.engine} {spec.topology}").items():
        (run_dir / name).write_text(text)
    supervisor = Supervisor(run_dir, grace_s=grace_s)
    try:
        with supervisor:
            check_hosts(specs, supervisor, spec.engine, rendezvous_ports(spec, engine))
            supervisor.start_and_wait([s for s in specs if s.role != "router"], ready_timeout_s)
            supervisor.start_and_wait([s for s in specs if s.role == "router"], ready_timeout_s)
            url = entry_process(specs).url or ""
            verify_serving(url, supervisor, ready_timeout_s, api_key(spec))
            placement = verify_placement(supervisor.processes, supervisor)
            by_name = {s.name: s for s in specs}
            inventory = stack_inventory(
                spec.engine,
                python=spec.python,
                processes=[
                    {"role": p["role"], "pid": p["pid"], "cpus_allowed": p["cpus_allowed"], "name": p["name"],
                     "host": p["host"],
                     "expected_cpus": p["expected_cpus"], "gpus": by_name[p["name"]].gpus,
                     "tree": p["tree"], "env": redact_env(by_name[p["name"]].env)}
                    for p in placement
                ],  # fmt: skip
                env=spec.env,
                topology=topology,
            )
            hosts = remote_inventory(specs, supervisor, spec.python)
            if hosts:
                inventory["hosts"] = hosts  # the stack on each other host: its engine interpreter's packages
                inventory["hardware_of"] = ("this machine (where rooftop ran): the top-level engine, python, torch, "
                                            "driver, packages, gpus, host and numa; each other host's stack is under "
                                            "`hosts`")
            (run_dir / "inventory.json").write_text(json.dumps(inventory, indent=1))
            yield LiveDeployment(
                spec=spec,
                run_dir=run_dir,
                url=url,
                processes=list(supervisor.processes),
                placement=placement,
                inventory=inventory,
                supervisor=supervisor,
            )
    except RooftopError as exc:  # a failed start or a death while serving: say what teardown could not check
        if supervisor.leftovers:
            exc.problem += "; teardown could not check " + "; ".join(supervisor.leftovers)
            exc.args = (exc.problem,)
        raise
