"""Start server processes, wait until they answer, and take every one of them down again.

Each process gets its own session and process group (so teardown reaches its children), one log file
in the run directory, and PR_SET_PDEATHSIG=SIGKILL (so it dies with rooftop even when rooftop is
SIGKILLed). A pid file in the run directory lets a later run reap whatever a crash left behind.
Teardown (SIGTERM to every group, a grace period, then SIGKILL) runs on normal exit, Ctrl-C and SIGTERM.

A process whose spec names a host runs there under ssh (`ssh.py`): the local child is the ssh client,
whose session runs `remote_wrapper.py` around the engine. The wrapper gives the engine the same process
group, pinning and pid file there, streams its output into the local log, and takes the group down
when the session ends, so closing the client's stdin is teardown and a dropped connection (or rooftop
killed, and its ssh clients with it) leaves nothing running. Teardown then checks each remote group
from that host's /proc and SIGKILLs what is left.
"""

import ctypes
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rooftop.errors import RooftopError
from rooftop.launch.groups import _proc_stat, _signal_group, group_is_ours, group_members
from rooftop.launch.logs import known_fix, log_report, logs_report
from rooftop.launch.ssh import (
    HostFiles,
    SSHConnections,
    SSHHost,
    wrapper_command,
    wrapper_config_line,
)
from rooftop.redact import redact_argv
from rooftop.spec.deployment import home_relative

PID_FILE = "pids.json"
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@dataclass(slots=True)
class ProcessSpec:
    """One process to run: its argv (never a shell string), environment overlay, CPUs, and where it logs."""

    name: str
    role: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cpus: list[int] | None = None
    cwd: str | None = None
    log_path: str | None = None  # default: RUN_DIR/logs/NAME.log
    health_url: str | None = None  # polled until it answers 200
    url: str | None = None  # where clients reach it
    gpus: list[int] = field(default_factory=list)
    numa: int | None = None  # the role's NUMA node; only for launch scripts, `cpus` is what pins
    machine: str | None = None  # the [deployment.hosts] entry it runs on; None: this machine
    host: SSHHost | None = None  # how to reach that machine (set from `machine` by engines.build_processes)
    remote_dir: str | None = None  # the run directory on that host (logs/, traces/, pids/)
    # (regex, fix): where a line of its log matches, the error for its death gives that fix (known causes)
    fixes: list[tuple[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class RunningProcess:
    """A started process and the log it writes."""

    spec: ProcessSpec
    popen: subprocess.Popen
    log_path: Path
    started_ns: int
    start_ticks: int | None = None  # kernel start time: tells our group from a later one with a reused id
    remote_pid: int | None = None  # on spec.host: the engine's pid (and process group) there
    remote_cpus: list[int] | None = None  # on spec.host: the CPUs the wrapper pinned it to (a NUMA node's there)
    remote_log: str | None = None  # on spec.host: the engine's whole log there

    @property
    def pid(self) -> int:
        """The engine's pid (on its host; for a remote process popen is the local ssh client)."""
        return self.remote_pid if self.remote_pid is not None else self.popen.pid

    @property
    def where(self) -> str:
        return f" on {self.spec.host.describe()}" if self.spec.host else ""


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) received: unwind like Ctrl-C so teardown runs."""


def reap_leftovers(run_dir: str | Path) -> list[int]:
    """Kill the process groups a previous, crashed supervisor of `run_dir` left alive; returns their pgids."""
    path = Path(run_dir) / PID_FILE
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    reaped = []
    remote = [e for e in entries if e.get("host")]
    if remote:
        ssh = SSHConnections()
        try:
            for entry in remote:
                try:
                    if ssh.kill_group(SSHHost(**entry["host"]), int(entry["pgid"]), entry.get("start_ticks")):
                        reaped.append(int(entry["pgid"]))
                except RooftopError:
                    pass  # the host is unreachable: its wrapper ended the group when the connection dropped
        finally:
            ssh.close()
    for entry in entries:
        if entry.get("host"):
            continue
        pgid = int(entry["pgid"])
        if group_is_ours(pgid, entry.get("start_ticks")) and group_members(pgid):
            _signal_group(pgid, signal.SIGKILL)
            reaped.append(pgid)
    path.unlink(missing_ok=True)
    return reaped


def _load_libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _child_setup(cpus: list[int] | None, parent_pid: int, libc: ctypes.CDLL | None):
    """The function run in the child between fork and exec (after setsid)."""

    def setup() -> None:
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            # The parent may have died before prctl: then no signal will ever come.
            if os.getppid() != parent_pid:
                os._exit(1)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


class Supervisor:
    """Owns the processes of one deployment; use as a context manager so teardown always runs."""

    def __init__(self, run_dir: str | Path, grace_s: float = 10.0, poll_s: float = 0.2,
                 heartbeat_timeout_s: float = 60.0):
        self.run_dir = Path(run_dir)
        self.grace_s = grace_s
        self.poll_s = poll_s
        # a remote wrapper that hears nothing for this long takes its engine down (a link gone silent)
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._heartbeat: threading.Thread | None = None
        self._heartbeat_stop = threading.Event()
        self._stdin_lock = threading.Lock()
        self.processes: list[RunningProcess] = []
        self._libc = _load_libc()
        self._old_handlers: dict[int, object] = {}
        self.ssh: SSHConnections | None = None  # opened by the first process on another host
        self.leftovers: list[str] = []  # remote processes teardown could not check (their host unreachable)

    # -- context: teardown on exit, Ctrl-C and SIGTERM ------------------------------------------
    def __enter__(self) -> "Supervisor":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            self.stop()
        finally:
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            self._old_handlers.clear()

    def _on_signal(self, signum, frame) -> None:
        raise Terminated(f"received {signal.Signals(signum).name}")

    # -- start ----------------------------------------------------------------------------------
    def start(self, spec: ProcessSpec) -> RunningProcess:
        """Start one process in its own session, pinned to spec.cpus, logging to its own file."""
        if threading.current_thread() is not threading.main_thread():
            # PDEATHSIG fires when the forking *thread* exits, not the process.
            raise RuntimeError("Supervisor.start must be called from the main thread")
        log_path = Path(spec.log_path) if spec.log_path else self.run_dir / "logs" / f"{spec.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if spec.host is not None:
            return self._start_remote(spec, log_path)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **spec.env}
        with open(log_path, "ab") as log:
            log.write(f"# rooftop: starting {spec.name}: {' '.join(redact_argv(spec.argv))}\n".encode())
            log.flush()
            try:
                popen = subprocess.Popen(
                    spec.argv,
                    env=env,
                    cwd=spec.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_child_setup(spec.cpus, os.getpid(), self._libc),
                )
            except FileNotFoundError:
                raise RooftopError(
                    f"cannot start {spec.name}: {spec.argv[0]!r} not found", "install it or fix the PATH"
                ) from None
            except subprocess.SubprocessError as exc:
                raise RooftopError(f"cannot start {spec.name}: {exc}", "check the CPUs it is pinned to") from None
        stat = _proc_stat(popen.pid)
        proc = RunningProcess(spec, popen, log_path, time.perf_counter_ns(), stat[1] if stat else None)
        self.processes.append(proc)
        self._write_pid_file()
        return proc

    def connections(self) -> SSHConnections:
        """The SSH connections of this deployment (opened on first use, closed at teardown)."""
        if self.ssh is None:
            self.ssh = SSHConnections(self.run_dir / "logs")
        return self.ssh

    def _start_remote(self, spec: ProcessSpec, log_path: Path) -> RunningProcess:
        """Start `spec` on its host under ssh and the wrapper; returns once the wrapper says the engine started."""
        host = spec.host
        ssh = self.connections()
        ssh.connect(host)
        remote_dir = spec.remote_dir or f"{home_relative(host.workdir)}/{self.run_dir.name}"
        config = {"argv": spec.argv, "env": spec.env, "cpus": spec.cpus, "cwd": spec.cwd, "grace_s": self.grace_s,
                  "heartbeat_s": self.heartbeat_timeout_s,
                  "numa": spec.numa if not spec.cpus else None,
                  "log": f"{remote_dir}/logs/{spec.name}.log", "pid_file": f"{remote_dir}/pids/{spec.name}.json"}
        with open(log_path, "ab") as log:
            log.write(f"# rooftop: starting {spec.name} on {host.describe()}: "
                      f"{' '.join(redact_argv(spec.argv))}\n".encode())
            log.flush()
            offset = log.tell()
            popen = subprocess.Popen(ssh.command_argv(host, wrapper_command()), stdin=subprocess.PIPE,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_child_setup(None, os.getpid(), self._libc))
        try:
            popen.stdin.write(wrapper_config_line(config))  # env may hold secrets: never on a command line
            popen.stdin.flush()
        except OSError:
            pass  # the session already ended: _remote_status reports it
        proc = RunningProcess(spec, popen, log_path, time.perf_counter_ns(), remote_log=config["log"])
        self.processes.append(proc)  # from here teardown knows it, whatever happens next
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._beat, name="rooftop-ssh-heartbeat", daemon=True)
            self._heartbeat.start()
        status = self._remote_status(proc, offset)
        if "error" in status:
            popen.wait(timeout=30)
            python = f"[deployment.hosts.{host.name}] python" if host.python else "deployment.python"
            fix = {"no_cpus": f"give {spec.role} `cpus` that host has, or a `numa` node there",
                   "no_numa": f"give {spec.role} a `numa` node that host has, or `cpus`"}.get(
                status.get("kind"), f"install the engine there, or point {python} at the interpreter that has it")
            raise RooftopError(f"cannot start {spec.name} on {host.describe()}: {status['error']}", fix)
        proc.remote_pid, proc.start_ticks = int(status["pgid"]), status.get("start_ticks")
        proc.remote_cpus = status.get("cpus")
        self._write_pid_file()
        return proc

    def _beat(self) -> None:
        """Write a newline to every remote session a few times per heartbeat timeout (the wrappers' sign of life)."""
        interval_s = max(0.2, min(5.0, self.heartbeat_timeout_s / 6))
        while not self._heartbeat_stop.wait(interval_s):
            with self._stdin_lock:
                for proc in list(self.processes):
                    if proc.spec.host is None or proc.popen.stdin is None or proc.popen.stdin.closed:
                        continue
                    try:
                        proc.popen.stdin.write(b"\n")
                        proc.popen.stdin.flush()
                    except (OSError, ValueError):
                        pass  # that session is gone: check_alive and teardown say so

    def _remote_status(self, proc: RunningProcess, offset: int, timeout_s: float = 60.0) -> dict:
        """The wrapper's first `# rooftop-remote {...}` line in the log after `offset`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(proc.log_path, "rb") as f:
                f.seek(offset)
                for line in f.read().decode(errors="replace").splitlines():
                    if line.startswith("# rooftop-remote "):
                        return json.loads(line.removeprefix("# rooftop-remote "))
            if proc.popen.poll() is not None:
                raise RooftopError(f"{proc.spec.name}'s ssh session{proc.where} ended before the engine started "
                                   f"(exit {proc.popen.returncode}){log_report(proc.log_path)}",
                                   "check that python3 runs there and the SSH connection holds")
            time.sleep(0.05)
        raise RooftopError(f"{proc.spec.name}{proc.where} did not start within {timeout_s:.0f} s", "check the host")

    def _write_pid_file(self) -> None:
        entries = [
            {"name": p.spec.name, "role": p.spec.role, "pid": p.pid, "pgid": p.pid,
             "start_ticks": p.start_ticks, "argv": redact_argv(p.spec.argv),
             **({"host": p.spec.host.to_dict(), "ssh_pid": p.popen.pid} if p.spec.host else {})}
            for p in self.processes if p.spec.host is None or p.remote_pid is not None
        ]  # fmt: skip
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / (PID_FILE + ".tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        tmp.replace(self.run_dir / PID_FILE)

    def died_error(self, proc: RunningProcess, while_what: str = "while starting") -> RooftopError:
        """The error for a process that exited: its exit status, the first error its log reports, and
        the last lines of the log."""
        rc = proc.popen.returncode
        how = f"was killed by {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exited with code {rc}"
        if proc.spec.host is not None and rc == 255:
            if self.ssh is not None and self.ssh.alive(proc.spec.host):  # the link holds: the wrapper itself died
                how = (f"lost its wrapper on the host, which was killed there (the OOM killer, an admin?) while the "
                       f"SSH connection held; teardown takes the rest of the engine's group down (its whole log "
                       f"there: {proc.remote_log})")
            else:
                how = (f"lost its SSH connection (the remote side took the engine down; its whole log there: "
                       f"{proc.remote_log}, copied beside the local one at teardown)")
        return RooftopError(f"{proc.spec.name}{proc.where} {how} {while_what}{log_report(proc.log_path)}",
                            known_fix(proc.log_path, proc.spec.fixes) or "read the whole log there")

    def wait_ready(self, procs: list[RunningProcess], timeout_s: float) -> None:
        """Poll each process's health URL until it answers 200; RooftopError if one dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        pending = [p for p in procs if p.spec.health_url]
        while pending:
            for proc in procs:  # a rank without a health URL (another node of a multi-node role) may die too
                if proc.popen.poll() is not None:
                    raise self.died_error(proc)
            for proc in list(pending):
                if _healthy(proc.spec.health_url):
                    pending.remove(proc)
            if not pending:
                break
            if time.monotonic() > deadline:
                names = ", ".join(f"{p.spec.name} ({p.spec.health_url})" for p in pending)
                raise RooftopError(
                    f"not ready after {timeout_s:.0f} s: {names}{logs_report([(p.spec.name, p.log_path) for p in pending])}",
                    "raise the ready timeout if it is still loading, else read the log",
                )
            time.sleep(self.poll_s)

    def start_and_wait(self, specs: list[ProcessSpec], timeout_s: float) -> list[RunningProcess]:
        """Start all of `specs`, then wait until all are healthy."""
        procs = [self.start(spec) for spec in specs]
        self.wait_ready(procs, timeout_s)
        return procs

    def host_files(self, proc: RunningProcess) -> HostFiles | None:
        """Files on remote process `proc`'s host (listing, fetching), for profile capture; None for a local one."""
        return HostFiles(self.connections(), proc.spec.host) if proc.spec.host is not None else None

    def check_alive(self) -> None:
        """RooftopError naming the first process that has exited."""
        for proc in self.processes:
            if proc.popen.poll() is not None:
                raise self.died_error(proc, "while serving")

    # -- teardown -------------------------------------------------------------------------------
    def stop(self) -> None:
        """SIGTERM every process group, wait up to grace_s, SIGKILL what is left, reap, drop the pid file."""
        if not self.processes:
            self._close_ssh()
            return
        remote = [p for p in self.processes if p.spec.host is not None]
        self._heartbeat_stop.set()
        with self._stdin_lock:
            for proc in reversed(remote):  # end of the session's input: the wrapper takes its group down
                try:
                    proc.popen.stdin.close()
                except (OSError, AttributeError):
                    pass
        owned = {p.pid: p.start_ticks for p in self.processes if p.spec.host is None}

        def ours() -> list[int]:
            for proc in self.processes:
                proc.popen.poll()  # reap leaders that have exited so they stop counting
            return [g for g, ticks in owned.items() if group_is_ours(g, ticks) and group_members(g)]

        for pgid in reversed(ours()):  # routers first, then the workers behind them
            _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and ours():
            time.sleep(0.05)
        for pgid in ours():
            _signal_group(pgid, signal.SIGKILL)
        for proc in self.processes:
            try:
                proc.popen.wait(timeout=5 if proc.spec.host is None else self.grace_s + 10)
            except subprocess.TimeoutExpired:
                if proc.spec.host is not None:
                    proc.popen.kill()  # the connection ends, and with it the wrapper's input
                    proc.popen.wait()
        self.leftovers = self._check_remote(remote)
        self.processes.clear()
        self._close_ssh()
        (self.run_dir / PID_FILE).unlink(missing_ok=True)

    def _check_remote(self, remote: list[RunningProcess]) -> list[str]:
        """Read each remote group from its host's /proc and SIGKILL what is left; what could not be checked."""
        unchecked = []
        for proc in remote:
            if proc.remote_pid is None or self.ssh is None:
                continue
            try:
                self.ssh.kill_group(proc.spec.host, proc.remote_pid, proc.start_ticks)
                lost = proc.popen.returncode is not None and (proc.popen.returncode == 255 or proc.popen.returncode < 0)
                if lost and proc.remote_log:  # the session was lost (or its client killed): its output since
                    self.ssh.fetch(proc.spec.host, proc.remote_log, proc.log_path.with_suffix(".remote.log"))
            except RooftopError as exc:
                unchecked.append(f"{proc.spec.name}{proc.where}: {exc}")
        return unchecked

    def _close_ssh(self) -> None:
        if self.ssh is not None:
            self.ssh.close()
            self.ssh = None


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False

