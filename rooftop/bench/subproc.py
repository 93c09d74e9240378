"""Start a helper server as a child process and wait for its ready line (calibration, tests)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

from rooftop.errors import RooftopError

_URL = re.compile(r"(http://[0-9.:a-z]+)")


class ChildServer:
    """A child server in its own process group; `stop()` ends the whole group."""

    def __init__(self, argv: list[str], ready_marker: str, timeout_s: float = 60.0, env: dict | None = None):
        self.argv = argv
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True, env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self._ready: queue.Queue[str | None] = queue.Queue()
        # One thread reads the child's output for its whole life: the wait below can time out
        # even when the child prints nothing, and the child never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()
        self.url = self._wait(ready_marker, timeout_s)

    def _wait(self, marker: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        why = f"was not ready within {timeout_s:.0f} s"
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._ready.get(timeout=left)
            except queue.Empty:
                break
            if line is None:  # the child closed its output: it exited
                why = f"exited with code {self.proc.wait()} before it was ready"
                break
            if marker in line and (m := _URL.search(line)):
                return m.group(1)
        self.stop()
        tail = "\n".join(self.lines[-20:])
        raise RooftopError(f"{' '.join(self.argv[:4])} {why}; its last output:\n{tail}",
                           "fix what the output says, or raise the timeout")

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            del self.lines[:-200]
            self._ready.put(line)
        self._ready.put(None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()

    def __enter__(self) -> ChildServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def python_module(module: str, *args: str) -> list[str]:
    """argv for `python -m module args` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def die_with_parent(parent_pid: int) -> None:
    """In a child: be killed (SIGKILL) when the parent dies, however it dies (Linux's PR_SET_PDEATHSIG);
    exit now if it already has. Elsewhere only the check is made."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        os._exit(1)
