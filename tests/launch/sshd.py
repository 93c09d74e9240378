"""A real OpenSSH server for the multi-host tests: unprivileged config in a temporary directory, a host key
and a client key generated here, listening on 127.0.0.1 and 127.0.0.2 (two "hosts") on a free port."""

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
ADDRESSES = ("127.0.0.1", "127.0.0.2")


@dataclass
class Sshd:
    port: int
    identity_file: Path
    known_hosts: Path
    user: str
    proc: subprocess.Popen

    def host_table(self, address: str, **extra) -> dict:
        """A [deployment.hosts.NAME] table that reaches this sshd at `address`."""
        return {"address": address, "user": self.user, "ssh_port": self.port, "identity_file": str(self.identity_file),
                "ssh_options": [f"UserKnownHostsFile={self.known_hosts}", "StrictHostKeyChecking=yes"], **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def start_sshd(tmp: Path) -> Sshd:
    """Start sshd in `tmp` (fails, naming the fix, when openssh-server is missing)."""
    if not Path(SSHD).exists():
        pytest.fail("sshd not found: install openssh-server (make sshd, or apt-get install openssh-server)")
    tmp.mkdir(parents=True, exist_ok=True)
    host_key, client_key = tmp / "host_ed25519", tmp / "client_ed25519"
    for key in (host_key, client_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (tmp / "authorized_keys").write_text((tmp / "client_ed25519.pub").read_text())
    port = _free_port()
    host_pub = (tmp / "host_ed25519.pub").read_text().split()[:2]
    known = tmp / "known_hosts"
    known.write_text("".join(f"[{a}]:{port} {' '.join(host_pub)}\n" for a in ADDRESSES))
    config = tmp / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", *(f"ListenAddress {a}" for a in ADDRESSES), f"HostKey {host_key}",
        f"PidFile {tmp / 'sshd.pid'}", f"AuthorizedKeysFile {tmp / 'authorized_keys'}", "StrictModes no",
        "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password", "LogLevel ERROR", "",
    ]))
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    log = open(tmp / "sshd.log", "ab")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while not all(_listening(a, port) for a in ADDRESSES):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"sshd did not start: {(tmp / 'sshd.log').read_text()}")
        time.sleep(0.05)
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    return Sshd(port, client_key, known, user, proc)


def stop_sshd(sshd: Sshd) -> None:
    sshd.proc.terminate()
    try:
        sshd.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        sshd.proc.kill()
        sshd.proc.wait()
