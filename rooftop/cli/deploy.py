"""`rooftop deploy SPEC`: bring a deployment up, print where it serves and where each process runs, wait for Ctrl-C."""

import json
import sys
import time
from datetime import datetime
from pathlib import Path

import typer
from rich.console import Console

from rooftop.adapters.flags import unknown_args
from rooftop.adapters.processes import build_processes
from rooftop.deploy.bring_up import bring_up
from rooftop.errors import RooftopError
from rooftop.launch.scripts import host_scripts
from rooftop.spec.load import load_deployment


def command(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="deployment or campaign TOML"),
    lever: str = typer.Option(None, "--lever", help=r"apply the \[\[lever]] of this name (a campaign TOML's) to the deployment"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the launch script (one per host, also written to "
                                 "the run dir when the deployment spans hosts), start nothing"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON line once ready"),
    run_dir: Path = typer.Option(None, "--run-dir", help="logs, pid file, inventory (default runs/deploy-TIME)"),
    ready_timeout_s: float = typer.Option(900.0, "--ready-timeout", help="seconds to wait for health"),
    pin: str = typer.Option("taskset", "--pin", help="dry-run pinning tool: taskset or numactl"),
) -> None:
    """Bring a deployment up (or print its launch script), verify CPU placement, wait; Ctrl-C tears it down."""
    if pin not in ("taskset", "numactl"):
        raise RooftopError(f"--pin {pin!r} is not a pinning tool rooftop writes", "use --pin taskset or --pin numactl")
    spec = load_deployment(spec_path, lever)
    out = Console(highlight=False)
    err = Console(stderr=True, highlight=False)
    if run_dir is None:
        run_dir = Path("runs") / f"deploy-{spec_path.stem}-{datetime.now():%Y%m%d-%H%M%S}"
    for warning in unknown_args(spec):  # a misspelt flag would only fail on the host that runs it
        err.print(f"[yellow]warning:[/] {warning}")
    if dry_run:
        # The script may be for another host: NUMA nodes stay nodes, bound with numactl where it runs.
        processes = build_processes(spec, run_dir)
        title = f"{spec_path.name}{f' lever {lever}' if lever else ''}: {spec.engine} {spec.topology}"
        scripts = host_scripts(processes, title, pin)
        if list(scripts) == ["launch.sh"]:
            sys.stdout.write(scripts["launch.sh"])
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        for name, text in scripts.items():  # several hosts: one runnable file each, printed in turn
            (run_dir / name).write_text(text)
            (run_dir / name).chmod(0o755)
            host = name.removeprefix("launch-").removesuffix(".sh")
            where = "on this machine, after the hosts' scripts" if name == "launch.sh" else f"on host {host}"
            sys.stdout.write(f"# ===== {run_dir / name} (run {where}) =====\n{text}\n")
        return
    live = None
    try:
        with bring_up(spec, run_dir, ready_timeout_s) as live:
            processes = [{k: p[k] for k in ("role", "pid", "cpus_allowed")} | ({"host": p["host"]} if p.get("host") else {})
                         for p in live.placement]
            if as_json:
                print(json.dumps({"url": live.url, "processes": processes}), flush=True)
            else:
                out.print(f"[bold green]ready[/] {spec.engine} {spec.topology} on {live.url}")
                for p in live.placement:
                    host = f" on {p['host']}" if p.get("host") else ""
                    out.print(f"  {p['name']:<8} pid {p['pid']:<8} CPUs {p['cpus_allowed']}{host}")
                out.print(f"  run dir {run_dir} — Ctrl-C stops")
            while True:
                live.supervisor.check_alive()
                time.sleep(1.0)
    except KeyboardInterrupt:
        left = live.supervisor.leftovers if live is not None else []
        for line in left:  # a host unreachable at teardown: its wrapper ended the engine when the link dropped
            err.print(f"[yellow]warning:[/] could not check {line}")
        err.print("stopped: every process of the deployment was taken down" if not left else
                  "stopped: every process this machine could reach was taken down")
