"""Runnable bash launch scripts for a set of processes: quoted argv, pinning, environment, secrets redacted.

What `rooftop deploy --dry-run` prints and what a report keeps, so a deployment can be rerun by hand.
"""

import shlex

from rooftop.hardware.pinning import numactl_argv, taskset_argv
from rooftop.hardware.topology import format_cpu_list
from rooftop.launch.supervisor import ProcessSpec
from rooftop.redact import is_secret, redact_argv


def _env_words(env: dict[str, str]) -> list[str]:
    words = []
    for name, value in env.items():
        if is_secret(name):
            # Never written down: the script takes it from the environment it runs in.
            words.append(f'{name}="${{{name}:?set {name} in the environment}}"')
        else:
            words.append(f"{name}={shlex.quote(value)}")
    return words


def pin_prefix(spec: ProcessSpec, pin: str = "taskset") -> list[str]:
    """The pinning command in front of a process: taskset/numactl for its CPUs, numactl for a bare NUMA node."""
    if spec.cpus:
        return taskset_argv(spec.cpus) if pin == "taskset" else numactl_argv(cpus=spec.cpus)
    if spec.numa is not None:
        return numactl_argv(numa=spec.numa)  # CPUs of a node on another host are unknown here
    return []


def command_line(spec: ProcessSpec, pin: str = "taskset") -> str:
    """One process as a shell command line (without redirection)."""
    words = []
    if spec.env:
        words += ["env", *_env_words(spec.env)]
    words += [shlex.quote(w) for w in pin_prefix(spec, pin)]
    words += [shlex.quote(w) for w in redact_argv(spec.argv)]
    return " ".join(words)


def host_scripts(specs: list[ProcessSpec], title: str = "", pin: str = "taskset") -> dict[str, str]:
    """{file name: script}: launch.sh for the processes on this machine, launch-HOST.sh for each other host
    (run there by hand, from any directory; start the hosts' scripts before launch.sh, whose router waits
    for their workers)."""
    hosts: dict[str, list[ProcessSpec]] = {}
    for spec in specs:
        if spec.host is not None:
            hosts.setdefault(spec.host.name, []).append(spec)
    scripts = {}
    local = [s for s in specs if s.host is None]
    if local or not hosts:
        waits = [s for s in specs if s.host is not None and s.health_url]
        scripts["launch.sh"] = launch_script(local, title, pin, wait_first=waits)
    for name, procs in hosts.items():
        host = procs[0].host
        scripts[f"launch-{name}.sh"] = launch_script(
            procs, f"{title} on host {name} ({host.target})", pin, log_dir=f"{procs[0].remote_dir}/logs",
            cd_home=True)
    return scripts


def launch_script(specs: list[ProcessSpec], title: str = "", pin: str = "taskset", log_dir: str = "logs",
                  cd_home: bool = False, wait_first: list[ProcessSpec] = ()) -> str:
    """A bash script that starts `specs` in order (routers after the workers answer), logs each, stops all on exit.
    `wait_first`: processes started elsewhere (other hosts) that must answer before a router starts."""
    out = [
        "#!/usr/bin/env bash",
        f"# {title or 'rooftop deployment'} — written by rooftop; rerun as is.",
        f"# Each process logs to {log_dir}/NAME.log; Ctrl-C or the first process to exit stops them all.",
        "set -euo pipefail",
        *(['cd "$HOME"  # rooftop runs these from the ssh login directory; relative paths start there']
          if cd_home else []),
        f"mkdir -p {shlex.quote(log_dir)}",
        "pids=()",
        "trap 'kill \"${pids[@]}\" 2>/dev/null || true; wait' EXIT",
        'wait_healthy() { until curl -sf -o /dev/null "$1"; do sleep 2; done; echo "ready: $1"; }',
        "",
    ]
    started: list[ProcessSpec] = list(wait_first)
    for spec in specs:
        if spec.role == "router" and started:
            out += [f"wait_healthy {shlex.quote(s.health_url)}" for s in started if s.health_url]
        place = []
        if spec.gpus:
            place.append("GPUs " + ",".join(map(str, spec.gpus)))
        if spec.cpus:
            place.append("CPUs " + format_cpu_list(spec.cpus))
        elif spec.numa is not None:
            place.append(f"NUMA node {spec.numa}")
        out.append(f"# {spec.name} (role {spec.role})" + (": " + "; ".join(place) if place else ""))
        out.append(f"{command_line(spec, pin)} > {shlex.quote(log_dir)}/{shlex.quote(spec.name)}.log 2>&1 &")
        out.append("pids+=($!)")
        out.append("")
        started.append(spec)
    last = specs[-1] if specs else None
    if last is not None and last.health_url:
        out.append(f"wait_healthy {shlex.quote(last.health_url)}")
    if last is not None and last.url:
        out.append(f"echo {shlex.quote('serving on ' + last.url)}")
    out.append('wait -n "${pids[@]}"')
    return "\n".join(out) + "\n"
