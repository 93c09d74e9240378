"""Where a result came from: the command as run, the commit and whether the tree was dirty, the machine, when.

Every benchmark JSON and `rooftop bench --out`'s summary.json carry this under "provenance", so a figure can
be traced to the code that produced it. Git is read from the checkout that holds this file; where there is
none (a copy on a GPU machine without .git), the commit is null with a note, or the one named by ROOFTOP_COMMIT.
"""

import os
import platform
import shlex
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from rooftop.redact import redact_argv

COMMIT_ENV = "ROOFTOP_COMMIT"  # a caller that copied the tree without .git names the commit it copied
HERE = Path(__file__).resolve().parent


def provenance(argv: list[str] | None = None, repo: Path | None = None) -> dict:
    """The record for a result: `argv` (default: this process's, interpreter included) and the git state of `repo`."""
    argv = list(sys.orig_argv if argv is None else argv)
    commit, dirty, note = git_state(repo or HERE)
    out = {
        "command": shlex.join(redact_argv(argv)),
        "commit": commit,
        "dirty": dirty,
        "machine": machine(),
        "python": platform.python_version(),
        "time_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if note:
        out["note"] = note
    return out


def git_state(repo: Path) -> tuple[str | None, bool | None, str | None]:
    """(HEAD sha, whether tracked files have uncommitted changes, a note) for the checkout holding `repo`.

    Where git cannot say, the sha is ROOFTOP_COMMIT's value or None, dirty is None, and the note says why."""
    head, why = _git(repo, "rev-parse", "--verify", "HEAD")
    if head is not None:
        # --no-optional-locks: reading the state must not take index.lock from someone committing in this tree.
        status, why = _git(repo, "--no-optional-locks", "status", "--porcelain", "--untracked-files=no")
        if status is not None:
            return head, bool(status), None
        return head, None, f"tree state unknown: {why}"
    known = os.environ.get(COMMIT_ENV, "").strip()
    if known:
        return known, None, f"commit from {COMMIT_ENV} ({why}); whether the tree was dirty is unknown"
    return None, None, f"no commit: {why}; set {COMMIT_ENV} to the commit the tree was copied from"


def _git(repo: Path, *args: str) -> tuple[str | None, str]:
    """git's stripped stdout run in `repo`, or (None, why it gave none)."""
    if not repo.is_dir():
        return None, f"{repo} is not a folder"
    try:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return None, "git is not installed"
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"git {args[-1]} failed: {e}"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        return None, f"git in {repo}: {said}"
    return done.stdout.strip(), ""


def machine() -> dict:
    """Hostname, CPU model and count, and the GPU's name where torch is already loaded and sees CUDA."""
    out = {"hostname": socket.gethostname(), "cpu_model": cpu_model(), "cpu_count": os.cpu_count()}
    torch = sys.modules.get("torch")  # never imported here: a CPU benchmark must not pay for torch
    if torch is not None and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def cpu_model() -> str:
    """The host CPU's model name from /proc/cpuinfo (platform's guess elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
