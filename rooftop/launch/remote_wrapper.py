"""Runs on the remote host, under ssh, around one engine process; the standard library only.

    python3 -c "$(this file)"      (what rooftop.launch.ssh sends), its config the first line of stdin

It starts the engine in its own session and process group (PR_SET_PDEATHSIG=SIGKILL to this wrapper,
pinned to its CPUs, its environment set), writes the engine's pid to a pid file, copies the engine's
output to a log file there and to stdout (the ssh channel, so rooftop's local log fills as it runs),
and announces itself with one line `# rooftop-remote {"pid": ..., "pgid": ..., "start_ticks": ...}`.

It watches its stdin, which is the ssh channel: when it reaches end of file (rooftop closed it to stop
the engine, or the SSH connection dropped, or rooftop died), or nothing has come for `heartbeat_s`
(rooftop writes a newline every few seconds: a link that went silent without closing), or stdout is
closed, or SIGTERM or SIGHUP arrives, the wrapper sends SIGTERM to the engine's whole group, waits `grace_s`, sends SIGKILL
to what is left, removes the pid file and exits. PR_SET_PDEATHSIG does not cross ssh; this does.
When the engine exits by itself, the wrapper kills what is left of its group and exits with its code.
"""

import base64
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

FORWARD_CAP = 4 << 20  # bytes of output held for a slow channel


def group_members(pgid):
    """Live (non-zombie) pids whose process group is pgid."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(name))
    return members


def parse_cpu_list(text):
    """"0-3,8" -> [0, 1, 2, 3, 8]."""
    cpus = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


def start_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except OSError:
        return None


def stop_group(pgid, grace_s):
    """SIGTERM the group, wait up to grace_s, SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline and group_members(pgid):
            time.sleep(0.05)
            try:
                os.waitpid(-1, os.WNOHANG)  # reap the leader so it stops counting
            except ChildProcessError:
                pass
        if not group_members(pgid):
            return


def read_config(fd=0):
    """The first line of stdin, byte by byte (a buffered read would hide later input from select), as JSON.
    On stdin, not argv: the environment may hold secrets, and a command line is visible to every user."""
    line = bytearray()
    while not line.strip() or not line.endswith(b"\n"):  # blank lines are heartbeats
        byte = os.read(fd, 1)
        if not byte:
            sys.exit(3)  # rooftop went away before it sent the config
        line = bytearray() if line == b"\n" else line
        line += byte
    return json.loads(base64.b64decode(bytes(line).strip()))


class Channel:
    """The ssh channel (this process's stdout): announcements, and the engine's output forwarded without
    blocking, so a stalled link cannot stall the engine (the log here has every byte; the channel keeps the
    last FORWARD_CAP bytes it could not take yet)."""

    def __init__(self, out):
        self.out = out
        self.fd = out.fileno()
        self.pending = bytearray()
        self.closed = False

    def say(self, obj):
        self.out.write(b"# rooftop-remote " + json.dumps(obj).encode() + b"\n")
        self.out.flush()

    def forward(self, chunk):
        self.pending.extend(chunk)
        if len(self.pending) > FORWARD_CAP:
            del self.pending[: len(self.pending) - FORWARD_CAP]
        try:
            del self.pending[: os.write(self.fd, self.pending)]
        except BlockingIOError:
            pass
        except OSError:
            self.closed = True

    def drain(self, timeout_s=5.0):
        """Blocking again: what is still pending, for up to timeout_s."""
        os.set_blocking(self.fd, True)
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline and select.select([], [self.fd], [], 0.5)[1]:
            del self.pending[: os.write(self.fd, self.pending)]


def home_path(p):
    """A config path as list_files reads it: a relative one is under the home directory."""
    p = os.path.expanduser(p) if p else p
    return os.path.join(os.path.expanduser("~"), p) if p and not os.path.isabs(p) else p


def placement_cpus(cfg, channel):
    """The CPUs to pin the engine to (its own list, or its NUMA node's), or exit 2 saying why there are none."""
    cpus = cfg.get("cpus") or None
    if cpus and not set(cpus) <= os.sched_getaffinity(0):
        have = sorted(os.sched_getaffinity(0))
        channel.say({"error": f"CPUs {sorted(set(cpus) - set(have))} are not available on this host (it has {have})",
                     "kind": "no_cpus"})
        sys.exit(2)
    if not cpus and cfg.get("numa") is not None:
        try:
            with open(f"/sys/devices/system/node/node{cfg['numa']}/cpulist") as f:
                cpus = parse_cpu_list(f.read())
        except OSError:
            channel.say({"error": f"this host has no NUMA node {cfg['numa']}", "kind": "no_numa"})
            sys.exit(2)
    return cpus


def start_engine(cfg, cpus, pid_path, channel):
    """The engine in its own session and group, dying with this wrapper, pinned; its pid file written."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        libc = None
    me = os.getpid()

    def setup():
        if libc is not None:
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with this wrapper
            if os.getppid() != me:
                os._exit(1)
        if cpus:
            os.sched_setaffinity(0, cpus)

    env = dict(os.environ)
    env.update({"PYTHONUNBUFFERED": "1"})
    env.update(cfg.get("env") or {})
    cwd = home_path(cfg.get("cwd")) or os.path.expanduser("~")
    try:
        proc = subprocess.Popen(cfg["argv"], env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=setup)
    except FileNotFoundError:
        channel.say({"error": f"{cfg['argv'][0]!r} not found", "kind": "not_found"})
        sys.exit(127)
    except (PermissionError, OSError, subprocess.SubprocessError) as exc:
        channel.say({"error": f"cannot start {cfg['argv'][0]!r}: {exc}", "kind": "not_started"})
        sys.exit(126)
    with open(pid_path + ".tmp", "w") as f:
        json.dump({"pid": proc.pid, "pgid": proc.pid, "start_ticks": start_ticks(proc.pid)}, f)
    os.replace(pid_path + ".tmp", pid_path)
    channel.say({"pid": proc.pid, "pgid": proc.pid, "start_ticks": start_ticks(proc.pid), "cpus": cpus})
    return proc


def relay(proc, log, channel, heartbeat_s):
    """Copy the engine's output to the log and the channel until it exits or something says stop; the
    reason to stop (a signal, stdin closed, a silent link, the channel gone), or None when the engine exited."""
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append("signal"))
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a closed channel shows as an error on write
    engine_out = proc.stdout.fileno()
    os.set_blocking(channel.fd, False)
    last_input = time.monotonic()  # rooftop writes a byte at least every heartbeat_s; silence = a dead link
    watching = [0, engine_out]
    while not stopping:
        if channel.closed:
            stopping.append("ssh channel closed")
            break
        try:
            ready, _, _ = select.select(watching, [], [], 0.5)
        except InterruptedError:
            continue
        if 0 in ready:
            if not os.read(0, 4096):
                stopping.append("stdin closed")  # rooftop stopped us, or the connection is gone
                break
            last_input = time.monotonic()
        if heartbeat_s and time.monotonic() - last_input > heartbeat_s:
            stopping.append(f"no word from rooftop for {heartbeat_s:.0f} s")  # the link went silent
            break
        if engine_out in ready:
            chunk = os.read(engine_out, 65536)
            if chunk:
                log.write(chunk)
                log.flush()
                channel.forward(chunk)
            else:
                watching.remove(engine_out)
        elif channel.pending:
            channel.forward(b"")
        if proc.poll() is not None:
            while engine_out in watching and select.select([engine_out], [], [], 0.2)[0]:
                chunk = os.read(engine_out, 65536)  # its last words, often the reason it exited
                if not chunk:
                    break
                log.write(chunk)
                channel.forward(chunk)
            break
    if not stopping and channel.closed:
        stopping.append("ssh channel closed")
    return stopping[0] if stopping else None


def main():
    cfg = read_config()
    channel = Channel(sys.stdout.buffer)
    log_path, pid_path = home_path(cfg["log"]), home_path(cfg["pid_file"])
    for p in (log_path, pid_path):
        os.makedirs(os.path.dirname(p), exist_ok=True)
    log = open(log_path, "ab")
    cpus = placement_cpus(cfg, channel)
    proc = start_engine(cfg, cpus, pid_path, channel)
    why = relay(proc, log, channel, cfg.get("heartbeat_s"))
    if why:
        stop_group(proc.pid, float(cfg.get("grace_s", 10.0)))
    rc = proc.wait()
    stop_group(proc.pid, 1.0)  # children the engine left behind
    try:
        os.unlink(pid_path)
    except OSError:
        pass
    try:
        channel.drain()
        channel.say({"exit": rc, "why": why or "engine exited"})
    except OSError:
        pass
    sys.exit(rc if rc >= 0 else 128 - rc)


if __name__ == "__main__":
    main()
