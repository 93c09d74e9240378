"""--engine-process on: the step loop in a child process serves what the in-server engine serves; a dead
engine process fails its requests and /health says so; Ctrl-C leaves no process behind; PD roles refuse it.
(test_server.py runs the whole HTTP API both ways.)"""

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
from engine_server import post_json, python_module, request, start_engine

ARGS = ("--context-length", "256", "--page-size", "16", "--kv-cache-tokens", "2048", "--seed", "3")


def engine_pid(server) -> int:
    line = next(line for line in server.lines if "the step loop runs in process" in line)
    return int(re.search(r"process (\d+)", line).group(1))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def greedy_tokens(url: str, prompts: list[str]) -> list[list[int]]:
    out: list = [None] * len(prompts)

    def one(i: int) -> None:
        status, body = post_json(url, "/v1/completions", {"prompt": prompts[i], "max_tokens": 12, "temperature": 0,
                                                          "ignore_eos": True, "return_token_ids": True})
        assert status == 200, body
        out[i] = body["choices"][0]["token_ids"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_tokens_are_those_of_the_engine_in_the_server():
    prompts = ["roof", "a longer prompt about ceilings", "x" * 40]
    got = {}
    for mode in ("off", "on"):
        server = start_engine(*ARGS, "--engine-process", mode)
        try:
            got[mode] = greedy_tokens(server.url, prompts)
        finally:
            server.stop()
    assert got["on"] == got["off"]
    assert all(len(t) == 12 for t in got["on"])


def test_a_dead_engine_process_fails_its_requests_and_health_says_why():
    server = start_engine(*ARGS, "--engine-process", "on")
    try:
        pid = engine_pid(server)
        assert alive(pid) and pid != server.proc.pid
        result = {}
        started = threading.Event()

        def long_request() -> None:
            url = urllib.parse.urlsplit(server.url)
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
            try:
                conn.request("POST", "/v1/completions", json.dumps({
                    "prompt": "go", "max_tokens": 200, "ignore_eos": True, "stream": True}),
                    {"Content-Type": "application/json"})
                resp = conn.getresponse()
                first = resp.readline()  # the stream has started: the request is running
                started.set()
                result["reply"] = (resp.status, first + resp.read())
            finally:
                started.set()
                conn.close()

        t = threading.Thread(target=long_request)
        t.start()
        assert started.wait(60)
        os.kill(pid, signal.SIGKILL)  # a few ms after its first event, far from its 200th token
        t.join(60)
        status, raw = result["reply"]
        assert status == 200  # the stream had started; its last event is the error
        events = [json.loads(b[len("data: "):]) for b in raw.decode().split("\n\n")
                  if b.startswith("data: {")]
        assert "engine process exited" in events[-1]["error"]["message"]
        status, raw = request(server.url, "/health")
        assert status == 503 and json.loads(raw)["status"] == "dead"
        status, body = post_json(server.url, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert status == 503 and body["error"]["code"] == "engine_dead"
    finally:
        server.stop()


def test_ctrl_c_stops_the_front_end_and_the_engine_process():
    server = start_engine(*ARGS, "--engine-process", "on")
    try:
        pid = engine_pid(server)
        assert post_json(server.url, "/v1/completions", {"prompt": "hi", "max_tokens": 3})[0] == 200
        os.killpg(server.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does to the group
        assert server.proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid)
        assert not any("Traceback" in line for line in server.lines), server.lines[-10:]
    finally:
        server.stop()


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_pd_roles_refuse_an_engine_process(role):
    proc = subprocess.run(python_module("rooftop.engine", "--preset", "tiny", "--device", "cpu", "--port", "0",
                                        "--role", role, "--engine-process", "on"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--engine-process on is for the single role" in proc.stderr


def _running(pid: int) -> bool:
    """Whether pid is a live process (a zombie nobody reaps counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_parent_pid_ends_the_server_when_its_parent_dies():
    """`--parent-pid`: a server whose parent is SIGKILLed (no chance to stop it) shuts itself down."""
    code = (
        "import os, subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'rooftop.engine', '--preset', 'tiny', '--port', '0',\n"
        "    '--device', 'cpu', '--kv-cache-tokens', '4096', '--parent-pid', str(os.getpid())],\n"
        "    stdout=subprocess.PIPE, text=True)\n"
        "print(p.pid, flush=True)\n"
        "print(p.stdout.readline(), end='', flush=True)\n"
        "time.sleep(600)\n"
    )
    middle = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        engine_pid = int(middle.stdout.readline())
        assert "rooftop-engine ready on" in middle.stdout.readline()
        assert _running(engine_pid)
        middle.kill()
        middle.wait()
        deadline = time.monotonic() + 60  # a bound on a hang, not a timing: it polls every second
        while _running(engine_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(engine_pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(middle.pid, signal.SIGKILL)  # the engine too, if the test failed
