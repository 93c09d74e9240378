"""Process groups on this host, read from /proc: who is in one, whether it is still the one we started."""

import os
from pathlib import Path


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(process group id, start time in clock ticks) of `pid` from /proc/PID/stat; None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # fields[0] is field 3 (state) of proc(5)
    return int(fields[2]), int(fields[19])


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_is_ours(pgid: int, start_ticks: int | None) -> bool:
    """Whether process group `pgid` is still the one whose leader started at `start_ticks`.

    A live leader with another start time reused the id; with the leader gone, the kernel keeps the
    id reserved while any member lives, so the members are ours.
    """
    leader = _proc_stat(pgid)
    if leader is not None and leader[0] == pgid and start_ticks is not None and leader[1] != start_ticks:
        return False
    return True
