"""CPU placement: resolve a role's NUMA node or CPU list, pin a process, and check from /proc that it stayed there."""

import os
from pathlib import Path

from rooftop.errors import RooftopError
from rooftop.hardware.topology import Topology, format_cpu_list, parse_cpu_list


def resolve_cpus(numa: int | None, cpus: list[int] | None, topology: Topology) -> list[int] | None:
    """The CPU ids a role runs on: its `cpus`, else the CPUs of its NUMA node, else None (unpinned)."""
    if cpus is not None:
        online = set(topology.online_cpus)
        missing = [c for c in cpus if online and c not in online]
        if missing:
            raise RooftopError(
                f"CPU(s) {format_cpu_list(missing)} are not online on this host "
                f"(online: {format_cpu_list(topology.online_cpus)})",
                "pick CPUs from the online list",
            )
        return sorted(set(cpus))
    if numa is not None:
        return topology.cpus_of_node(numa)
    return None


def pin_current_process(cpus: list[int]) -> None:
    """Restrict the calling process (and what it later starts) to `cpus`."""
    os.sched_setaffinity(0, cpus)


def taskset_argv(cpus: list[int]) -> list[str]:
    """The `taskset -c LIST` prefix that starts a command on `cpus`."""
    return ["taskset", "-c", format_cpu_list(cpus)]


def numactl_argv(cpus: list[int] | None = None, numa: int | None = None) -> list[str]:
    """The `numactl` prefix: --physcpubind for a CPU list, or --cpunodebind/--membind for a whole node."""
    if cpus is not None:
        return ["numactl", f"--physcpubind={format_cpu_list(cpus)}"]
    if numa is not None:
        return ["numactl", f"--cpunodebind={numa}", f"--membind={numa}"]
    return []


def _status_field(pid: int, key: str, proc_root: Path, tid: int | None = None) -> str | None:
    path = proc_root / str(pid) / ("status" if tid is None else f"task/{tid}/status")
    try:
        text = path.read_text()
    except OSError:
        return None  # the process is gone, or not ours to read
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return None


def cpus_allowed(pid: int, proc_root: str | Path = "/proc") -> list[int] | None:
    """`Cpus_allowed_list` of process `pid` from /proc/PID/status; None if the process is gone."""
    value = _status_field(pid, "Cpus_allowed_list", Path(proc_root))
    return parse_cpu_list(value) if value is not None else None


def child_pids(pid: int, proc_root: str | Path = "/proc") -> list[int]:
    """Direct children of `pid`, read from /proc/PID/task/*/children (every thread can have children)."""
    children: list[int] = []
    for path in (Path(proc_root) / str(pid) / "task").glob("*/children"):
        try:
            children.extend(int(c) for c in path.read_text().split())
        except OSError:
            continue
    return sorted(set(children))


def process_tree(pid: int, proc_root: str | Path = "/proc") -> list[int]:
    """`pid` and all of its descendants, parents before children."""
    tree, frontier = [], [pid]
    while frontier:
        current = frontier.pop(0)
        if current in tree:
            continue
        tree.append(current)
        frontier.extend(child_pids(current, proc_root))
    return tree


def verify_pinning(
    pid: int, expected_cpus: list[int], name: str = "", proc_root: str | Path = "/proc"
) -> dict[int, list[int]]:
    """Cpus_allowed_list of `pid` and every descendant; RooftopError if any may run outside `expected_cpus`.

    A process narrower than its role (an engine binding one worker per core) is still placed correctly;
    only a CPU outside the role's set is a mismatch.
    """
    expected = set(expected_cpus)
    seen: dict[int, list[int]] = {}
    for p in process_tree(pid, proc_root):
        allowed = cpus_allowed(p, proc_root)
        if allowed is None:
            continue  # exited between listing and reading
        seen[p] = allowed
        if not set(allowed) <= expected:
            who = f"{name} " if name else ""
            raise RooftopError(
                f"process {who}(pid {p}{'' if p == pid else f', child of {pid}'}) may run on CPUs "
                f"{format_cpu_list(allowed)}, outside its placement {format_cpu_list(expected_cpus)}",
                "something re-pinned it after start (engine NUMA binding? taskset in a wrapper?); "
                "align the spec's cpus/numa with it or turn that binding off",
            )
    if pid not in seen:
        raise RooftopError(f"process {name or pid} (pid {pid}) is gone", "read its log in the run directory")
    return seen
