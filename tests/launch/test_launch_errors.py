"""Errors of a launch that name the right process and the right cause: a pd pair's first completion, a
readiness timeout of several workers, the remote port probe, the local router checked before any host."""

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from rooftop.adapters.processes import free_port
from rooftop.deploy.bring_up import verify_serving
from rooftop.errors import RooftopError
from rooftop.launch.ssh import _PREFLIGHT, SSHConnections, SSHHost
from rooftop.launch.supervisor import ProcessSpec, Supervisor


def proxy_failing(kind: str | None):
    """A pd proxy answering every completion 502 as rooftop's vllm_proxy does when `kind` (prefill_failed, ...)."""

    class Proxy(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.answer(200, {"data": [{"id": "m"}]})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            error = {"message": "it failed", "code": 502, **({"type": kind} if kind else {})}
            self.answer(502, {"error": error})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def workers(tmp_path):
    (tmp_path / "prefill.log").write_text("INFO starting\n(EngineCore_DP0 pid=7) ERROR 12-01 10:00:00 [core.py:1] "
                                          "ValueError: Head dimension 80 is not supported by MLA.\n")
    (tmp_path / "decode.log").write_text("INFO starting\nINFO Application startup complete.\n")
    (tmp_path / "router.log").write_text("router up\n")
    return SimpleNamespace(processes=[SimpleNamespace(spec=SimpleNamespace(role=r, name=r), log_path=tmp_path / f"{r}.log")
                                      for r in ("prefill", "decode", "router")])


@pytest.mark.parametrize("kind", ["prefill_failed", None])
def test_a_pd_pairs_failed_first_completion_quotes_the_failing_worker(tmp_path, kind):
    """The proxy names the worker that failed: its log is quoted (before, decode's always was); without a
    name, every worker's first error is."""
    server = proxy_failing(kind)
    try:
        with pytest.raises(RooftopError) as info:
            verify_serving(f"http://127.0.0.1:{server.server_port}", workers(tmp_path), 10)
    finally:
        server.shutdown()
    text = str(info.value)
    assert "ValueError: Head dimension 80 is not supported by MLA." in text
    assert f"last lines of {tmp_path / 'prefill.log'}" in text
    if kind is None:
        assert "first error in each one's log: prefill: ValueError: Head dimension 80" in text and "decode: none" in text
    assert "router up" not in text


def test_a_readiness_timeout_shows_every_pending_workers_log(tmp_path):
    code = "import sys, time; print(sys.argv[1], flush=True); time.sleep(60)"
    specs = [ProcessSpec(name=name, role=name, argv=[sys.executable, "-c", code, error],
                         health_url=f"http://127.0.0.1:{free_port()}/health")
             for name, error in (("prefill", "KeyError: 'prefill-cause'"), ("decode", "ValueError: decode-cause"))]
    with Supervisor(tmp_path, grace_s=1) as sup:
        procs = [sup.start(s) for s in specs]
        time.sleep(1.0)
        with pytest.raises(RooftopError) as info:
            sup.wait_ready(procs, 0.5)
    text = str(info.value)
    assert "not ready after 0 s: prefill (" in text and "decode (" in text
    assert "prefill: KeyError: 'prefill-cause'" in text and "decode: ValueError: decode-cause" in text


def preflight(ports):
    done = subprocess.run([sys.executable, "-c", _PREFLIGHT, json.dumps({"executables": [], "modules": [],
                                                                          "ports": ports})],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["ports"]


def test_the_port_probe_tells_a_taken_port_from_a_wrong_address():
    """A port in TIME_WAIT is free (servers bind with SO_REUSEADDR); a listener is in_use; an address the
    host lacks is not_here; a name that does not resolve is unresolved."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its port is left in TIME_WAIT
    time.sleep(0.1)
    client.close()
    server.close()
    assert preflight([["127.0.0.1", port]]) == []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        (found,) = preflight([["127.0.0.1", taken]])
    assert found[:3] == ["127.0.0.1", taken, "in_use"]
    (found,) = preflight([["10.254.254.254", 30123]])
    assert found[2] == "not_here"
    (found,) = preflight([["no-such-host.invalid", 30123]])
    assert found[2] == "unresolved"


def test_user_ssh_options_override_rooftops_defaults():
    """ssh keeps the first value it is given: a host's own ConnectTimeout/ServerAlive* win over rooftop's."""
    connections = SSHConnections()
    try:
        host = SSHHost(name="a", address="127.0.0.1",
                       options=["ConnectTimeout=60", "ServerAliveInterval=30", "ServerAliveCountMax=10"])
        effective = subprocess.run([*connections.base_argv(host), "-G", host.target], capture_output=True, text=True,
                                   check=True).stdout.splitlines()
    finally:
        connections.close()
    said = dict(line.split(" ", 1) for line in effective if " " in line)
    assert (said["connecttimeout"], said["serveraliveinterval"], said["serveralivecountmax"]) == ("60", "30", "10")
    assert said["batchmode"] == "yes"
