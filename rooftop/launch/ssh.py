"""Other hosts over SSH: one OpenSSH master connection per host, commands through it, files fetched back.

rooftop drives the OpenSSH client (`ssh`) rather than a Python SSH library: no new dependency, and the
user's ~/.ssh/config (aliases, ProxyJump, keys), agent and known_hosts apply to these commands as they
do at a shell (HTTP to an engine goes to its host's `address` directly, without them). Every
call is `ssh -o BatchMode=yes ...`: a password prompt would hang, so a host that needs one is an error
that says so. A master connection per host (`ControlMaster`, socket in a private temporary directory)
carries every command and every engine's session, so a deployment opens one TCP connection per host;
the master is rooftop's child with PR_SET_PDEATHSIG, and ServerAliveInterval notices a dead link.

The remote side needs `python3` (any 3.8+) on the PATH: the engine's wrapper (`remote_wrapper.py`) and
the checks below are standard-library Python sent inline; nothing is copied to the host.
"""

import base64
import json
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rooftop.errors import RooftopError

CONNECT_TIMEOUT_S = 10
_PR_SET_PDEATHSIG = 1



@dataclass(slots=True)
class SSHHost:
    """How to reach one host: its spec name, address, ssh user/port/key/options, and where rooftop writes there."""

    name: str
    address: str
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    options: list[str] = field(default_factory=list)
    workdir: str = "rooftop-runs"
    python: str | None = None  # the engine's interpreter there

    @property
    def target(self) -> str:
        return f"{self.user}@{self.address}" if self.user else self.address

    def describe(self) -> str:
        """'host b (root@127.0.0.2, ssh port 2222)' for messages."""
        port = f", ssh port {self.port}" if self.port else ""
        return f"host {self.name} ({self.target}{port})"

    def to_dict(self) -> dict:
        return {"name": self.name, "address": self.address, "user": self.user, "port": self.port,
                "identity_file": self.identity_file, "options": list(self.options), "workdir": self.workdir,
                "python": self.python}


def _pdeathsig() -> None:
    import ctypes

    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


def _remote_python(code: str, *args: str) -> str:
    """A remote shell command line running `code` with python3 (the remote shell takes one string)."""
    return shlex.join(["python3", "-c", code, *args])


# Run on the host: which executables and modules are missing, which ports are taken.
_PREFLIGHT = r"""
import errno, json, os, shutil, socket, subprocess, sys
req = json.loads(sys.argv[1]); out = {"missing": [], "no_module": [], "ports": []}
home = os.path.expanduser("~")
for exe in req["executables"]:
    path = exe if os.path.isabs(exe) else (os.path.join(home, exe) if "/" in exe else shutil.which(exe))
    if not path or not os.access(path, os.X_OK):
        out["missing"].append(exe)
for exe, module in req["modules"]:
    if exe in out["missing"]:
        continue
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec(%r) is None)" % module
    try:
        if subprocess.run([exe, "-c", probe], capture_output=True, timeout=60, cwd=home).returncode:
            out["no_module"].append([exe, module])
    except (OSError, subprocess.SubprocessError):
        out["no_module"].append([exe, module])
for host, port in req["ports"]:  # bound as a server binds (SO_REUSEADDR: a port in TIME_WAIT is free)
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        out["ports"].append([host, port, "unresolved", str(exc)])
        continue
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
    except OSError as exc:
        kind = {errno.EADDRINUSE: "in_use", errno.EADDRNOTAVAIL: "not_here"}.get(exc.errno, "other")
        out["ports"].append([host, port, kind, exc.strerror or str(exc)])
    finally:
        s.close()
print(json.dumps(out))
"""

# Run on the host: Cpus_allowed_list of a process and its descendants.
_PLACEMENT = r"""
import json, os, sys
root = int(sys.argv[1]); parent = {}
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            with open("/proc/%s/stat" % name) as f:
                parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            pass
tree, todo = [], [root]
while todo:
    pid = todo.pop(); tree.append(pid); todo += [c for c, p in parent.items() if p == pid]
out = {}
for pid in tree:
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    out[pid] = line.split(":", 1)[1].strip()
    except OSError:
        pass
print(json.dumps(out))
"""

# Run on the host: kill process group pgid if it is still the one whose leader started at start_ticks;
# print the members that were alive.
_KILL_GROUP = r"""
import json, os, signal, sys, time
pgid, ticks = int(sys.argv[1]), (None if sys.argv[2] == "None" else int(sys.argv[2]))
def members():
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(name))
    return out
try:
    with open("/proc/%d/stat" % pgid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    if int(fields[2]) == pgid and ticks is not None and int(fields[19]) != ticks:
        print("[]"); sys.exit(0)  # the id was reused: not ours
except OSError:
    pass
alive = members()
if alive:
    os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while members() and time.monotonic() < deadline:
        time.sleep(0.05)
print(json.dumps(alive))
"""


class SSHConnections:
    """One master connection per host, opened on first use; `close()` ends them all."""

    def __init__(self, log_dir: str | Path | None = None):
        # Unix socket paths are short (~104 bytes): a private directory under /tmp, one short name per host.
        self.control_dir = Path(tempfile.mkdtemp(prefix="rooftop-ssh-", dir="/tmp"))
        self.log_dir = Path(log_dir) if log_dir else self.control_dir
        self.masters: dict[str, tuple[SSHHost, subprocess.Popen]] = {}
        self._sockets: dict[str, Path] = {}  # host name -> its master's socket (short: h0, h1, ...)

    def socket_path(self, host: SSHHost) -> Path:
        if host.name not in self._sockets:
            self._sockets[host.name] = self.control_dir / f"h{len(self._sockets)}"
        return self._sockets[host.name]

    # -- argv -----------------------------------------------------------------------------------
    def base_argv(self, host: SSHHost, master: bool = False) -> list[str]:
        """`ssh` and its options for `host` (without the target), through its master connection. ssh keeps the
        first value it is given: rooftop's BatchMode and control socket come first, then the host's own
        `ssh_options`, then rooftop's defaults they may override (ConnectTimeout, ServerAlive*)."""
        argv = ["ssh", "-o", "BatchMode=yes",
                "-o", f"ControlPath={self.socket_path(host)}", "-o", f"ControlMaster={'yes' if master else 'no'}"]
        for option in host.options:
            argv += ["-o", option]
        argv += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", "ServerAliveInterval=5",
                 "-o", "ServerAliveCountMax=3"]
        if host.port:
            argv += ["-p", str(host.port)]
        if host.identity_file:
            argv += ["-i", host.identity_file, "-o", "IdentitiesOnly=yes"]
        return argv

    def command_argv(self, host: SSHHost, remote_command: str) -> list[str]:
        """argv that runs `remote_command` (one shell string) on `host`, without a terminal."""
        return [*self.base_argv(host), "-T", host.target, remote_command]

    # -- the master ------------------------------------------------------------------------------
    def connect(self, host: SSHHost) -> None:
        """Open `host`'s master connection (once); RooftopError naming the host, ssh's reason and the fix."""
        if host.name in self.masters and self.masters[host.name][1].poll() is None:
            return
        log = self.log_dir / f"ssh-{host.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path(host).unlink(missing_ok=True)  # a master that died leaves its socket behind
        with open(log, "ab") as f:
            master = subprocess.Popen([*self.base_argv(host, master=True), "-N", host.target],
                                      stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                      start_new_session=True,
                                      # PDEATHSIG follows the forking thread: only the main thread's lives on
                                      preexec_fn=_pdeathsig if threading.current_thread() is threading.main_thread()
                                      else None)
        self.masters[host.name] = (host, master)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S + 5
        while time.monotonic() < deadline:
            if master.poll() is not None:
                break
            check = subprocess.run([*self.base_argv(host), "-O", "check", host.target], capture_output=True)
            if check.returncode == 0:
                return
            time.sleep(0.1)
        if master.poll() is None:
            master.kill()
            master.wait()
        del self.masters[host.name]
        said = " ".join(line.strip() for line in log.read_text(errors="replace").splitlines()[-3:] if line.strip())
        raise RooftopError(
            f"cannot reach {host.describe()} over SSH: {said or 'no answer'}",
            f"check the address and port, that sshd runs there, and that `ssh -o BatchMode=yes "
            f"{'-p ' + str(host.port) + ' ' if host.port else ''}{host.target} true` works without a password "
            "(a key in the agent or [deployment.hosts] identity_file)")

    def alive(self, host: SSHHost) -> bool:
        """Whether `host`'s master connection is up and answers (`ssh -O check`)."""
        if host.name not in self.masters or self.masters[host.name][1].poll() is not None:
            return False
        try:
            return subprocess.run([*self.base_argv(host), "-O", "check", host.target], capture_output=True,
                                  timeout=CONNECT_TIMEOUT_S).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def close(self) -> None:
        """End every master connection (their sessions end with them) and remove the socket directory."""
        for host, master in self.masters.values():
            if master.poll() is None:
                subprocess.run([*self.base_argv(host), "-O", "exit", host.target], capture_output=True, timeout=10)
                try:
                    master.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    master.kill()
                    master.wait()
        self.masters.clear()
        shutil.rmtree(self.control_dir, ignore_errors=True)

    # -- commands ---------------------------------------------------------------------------------
    def run(self, host: SSHHost, remote_command: str, timeout_s: float = 60.0,
            stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
        """Run one shell command on `host`; RooftopError when ssh itself fails (exit 255) or it times out."""
        self.connect(host)
        try:
            done = subprocess.run(self.command_argv(host, remote_command), stdin=subprocess.DEVNULL, stdout=stdout,
                                  stderr=subprocess.PIPE, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RooftopError(f"a command on {host.describe()} took over {timeout_s:.0f} s",
                               "check the host's load and the SSH connection") from None
        if done.returncode == 255:
            raise RooftopError(f"lost the SSH connection to {host.describe()}: "
                               f"{done.stderr.decode(errors='replace').strip()[-300:]}", "check the host and the network")
        return done

    def python(self, host: SSHHost, code: str, *args: str, timeout_s: float = 60.0):
        """Run standard-library `code` with the host's python3; its stdout parsed as JSON."""
        done = self.run(host, _remote_python(code, *args), timeout_s)
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip()
            if done.returncode == 127:  # the remote shell found no python3
                raise RooftopError(f"{host.describe()} has no python3 on its PATH ({err[-200:]})",
                                   "install python3 there: rooftop's remote wrapper and checks run with it")
            raise RooftopError(f"a check on {host.describe()} failed: {err[-300:]}", "read the error above")
        return json.loads(done.stdout)

    def preflight(self, host: SSHHost, executables: list[str], modules: list[tuple[str, str]],
                  ports: list[tuple[str, int]]) -> dict:
        """{"missing": [exe], "no_module": [[exe, module]], "ports": [[address, port, kind, why]]} on `host`,
        where kind is "in_use" (something listens), "not_here" (the address is not one of that host's),
        "unresolved" (the name does not resolve there) or "other" (e.g. a port under 1024 without root)."""
        request = json.dumps({"executables": executables, "modules": modules, "ports": ports})
        return self.python(host, _PREFLIGHT, request)

    def placement(self, host: SSHHost, pid: int) -> dict[int, str]:
        """{pid: Cpus_allowed_list} of remote process `pid` and its descendants (empty if it is gone)."""
        return {int(k): v for k, v in self.python(host, _PLACEMENT, str(pid)).items()}

    def kill_group(self, host: SSHHost, pgid: int, start_ticks: int | None) -> list[int]:
        """SIGKILL remote process group `pgid` if it is still ours; the members that were alive."""
        return self.python(host, _KILL_GROUP, str(pgid), str(start_ticks))

    def fetch(self, host: SSHHost, remote_path: str, local_path: str | Path, timeout_s: float = 600.0) -> Path:
        """Copy one file from `host` to `local_path` (through the master connection, with `cat`)."""
        local_path = Path(local_path)
        local_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = local_path.with_name(local_path.name + ".part")
        with open(tmp, "wb") as f:
            done = self.run(host, shlex.join(["cat", "--", remote_path]), timeout_s, stdout=f)
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RooftopError(f"cannot read {remote_path} on {host.describe()}: "
                               f"{done.stderr.decode(errors='replace').strip()[-200:]}", "check that the file exists")
        tmp.replace(local_path)
        return local_path

    def list_files(self, host: SSHHost, directory: str, since_s: float) -> dict[str, int]:
        """{path: size} of files under `directory` on `host` modified at or after `since_s` (epoch seconds)."""
        code = ("import json, os, sys\nd, since = os.path.expanduser(sys.argv[1]), float(sys.argv[2]); out = {}\n"
                "if not os.path.isabs(d): d = os.path.join(os.path.expanduser('~'), d)\n"
                "for root, _, names in os.walk(d):\n    for n in names:\n        p = os.path.join(root, n)\n"
                "        try:\n            st = os.stat(p)\n        except OSError:\n            continue\n"
                "        if st.st_mtime >= since: out[p] = st.st_size\nprint(json.dumps(out))")
        return self.python(host, code, directory, str(since_s))


@dataclass(slots=True)
class HostFiles:
    """Files on one host, as profile capture reads them: list a directory, fetch a file."""

    connections: SSHConnections
    host: SSHHost

    @property
    def name(self) -> str:
        """The host's [deployment.hosts] name (capture keeps its traces in a directory of that name)."""
        return self.host.name

    def list_files(self, directory: str, since_s: float) -> dict[str, int]:
        return self.connections.list_files(self.host, directory, since_s)

    def fetch(self, remote_path: str, local_path: str | Path) -> Path:
        return self.connections.fetch(self.host, remote_path, local_path)


def wrapper_command() -> str:
    """The remote command line that runs the wrapper; its config goes as the first line of its stdin
    (`wrapper_config_line`), so no environment value appears on a command line."""
    return _remote_python((Path(__file__).parent / "remote_wrapper.py").read_text())


def wrapper_config_line(config: dict) -> bytes:
    """The wrapper's config as the line it reads first from stdin."""
    return base64.b64encode(json.dumps(config).encode()) + b"\n"
