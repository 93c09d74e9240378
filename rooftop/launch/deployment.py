"""Bring a deployment up, prove where it runs, hand it to the caller, take it down.

    with bring_up(spec, run_dir) as live:
        print(live.url, live.placement)   # bench it, profile it ...
    # every process group is gone here, also after Ctrl-C or SIGTERM

The run directory keeps launch.sh (what was started, runnable by hand), logs/, pids.json while up,
and inventory.json (the stack and each process's verified CPUs).
"""

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rooftop.engines import build_processes, entry_process, get_engine, require_installed
from rooftop.engines.inventory import stack_inventory
from rooftop.errors import RooftopError
from rooftop.hardware.pinning import cpus_allowed, verify_pinning
from rooftop.hardware.topology import discover, format_cpu_list
from rooftop.launch.redact import redact_env
from rooftop.launch.scripts import launch_script
from rooftop.launch.supervisor import RunningProcess, Supervisor, log_report, reap_leftovers
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


def verify_placement(processes: list[RunningProcess]) -> list[dict]:
    """Cpus_allowed_list of each process and its descendants, checked against its placement (RooftopError)."""
    placement = []
    for proc in processes:
        expected = proc.spec.cpus
        if expected:
            tree = verify_pinning(proc.pid, expected, proc.spec.name)
        else:
            tree = {proc.pid: cpus_allowed(proc.pid) or []}
        placement.append(
            {
                "role": proc.spec.role,
                "name": proc.spec.name,
                "pid": proc.pid,
                "cpus_allowed": format_cpu_list(tree.get(proc.pid, [])),
                "expected_cpus": format_cpu_list(expected) if expected else None,
                "tree": {str(pid): format_cpu_list(cpus) for pid, cpus in tree.items()},
            }
        )
    return placement


def verify_serving(url: str, supervisor: Supervisor, timeout_s: float) -> None:
    """One greedy two-token completion through the entry point: healthy is not serving (vLLM on CPU passes
    /health with an MLA head size its kernels refuse, then fails every request). RooftopError with the
    answer and the workers' log otherwise."""
    if not url:
        return
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 2, "temperature": 0.0}).encode()
        request = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            resp.read()
        return
    except urllib.error.HTTPError as exc:
        answer = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
        answer = f"{type(exc).__name__}: {exc}"
    worker = next((p for p in supervisor.processes if p.spec.role in ("single", "decode")), supervisor.processes[0])
    raise RooftopError(f"{url} is healthy but a first completion failed ({answer}){log_report(worker.log_path)}",
                       "the engine cannot serve this model as configured; read the log")


@contextmanager
def bring_up(
    spec: DeploymentSpec, run_dir: str | Path, ready_timeout_s: float = 900.0, grace_s: float = 10.0
) -> Iterator[LiveDeployment]:
    """Start workers, wait for health, start the router, verify placement, write the inventory; tear down on exit."""
    run_dir = Path(run_dir)
    topology = discover()
    engine = get_engine(spec.engine)
    require_installed(engine, spec.python, spec.topology)
    specs = build_processes(spec, run_dir, topology)
    run_dir.mkdir(parents=True, exist_ok=True)
    reap_leftovers(run_dir)
    (run_dir / "launch.sh").write_text(launch_script(specs, f"{spec.engine} {spec.topology}"))
    with Supervisor(run_dir, grace_s=grace_s) as supervisor:
        supervisor.start_and_wait([s for s in specs if s.role != "router"], ready_timeout_s)
        supervisor.start_and_wait([s for s in specs if s.role == "router"], ready_timeout_s)
        url = entry_process(specs).url or ""
        verify_serving(url, supervisor, ready_timeout_s)
        placement = verify_placement(supervisor.processes)
        by_name = {s.name: s for s in specs}
        inventory = stack_inventory(
            spec.engine,
            python=spec.python,
            processes=[
                {"role": p["role"], "pid": p["pid"], "cpus_allowed": p["cpus_allowed"], "name": p["name"],
                 "expected_cpus": p["expected_cpus"], "gpus": by_name[p["name"]].gpus,
                 "tree": p["tree"], "env": redact_env(by_name[p["name"]].env)}
                for p in placement
            ],  # fmt: skip
            env=spec.env,
            topology=topology,
        )
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
