"""Helpers for the engine's server tests: start `python -m rooftop.engine` as a child, talk HTTP to it."""

import contextlib
import json
import os
import urllib.error
import urllib.request

import torch

from rooftop.bench.subproc import ChildServer, python_module

READY = "rooftop-engine ready on"


def start_engine(*args: str, timeout_s: float = 240.0, env_extra: dict[str, str] | None = None) -> ChildServer:
    """The tiny preset on a free port of 127.0.0.1 (its own process group; stop() ends it); env_extra adds to
    its environment."""
    argv = python_module("rooftop.engine", "--preset", "tiny", "--port", "0", "--device", "cpu",
                         "--parent-pid", str(os.getpid()), *args)  # dies with the test run, however it ends
    # one intra-op thread: on a busy 2-core machine two spinning OpenMP threads make each step 30x slower
    return ChildServer(argv, READY, timeout_s=timeout_s, env={"OMP_NUM_THREADS": "1", **(env_extra or {})})


def request(url: str, path: str, body: dict | bytes | None = None, method: str | None = None,
            timeout_s: float = 120.0, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """(status, raw body) of one request; a JSON body for a dict; `headers` beside Content-Type."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(url + path, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def post_json(url: str, path: str, body: dict) -> tuple[int, dict]:
    status, raw = request(url, path, body)
    return status, json.loads(raw)


def sse_events(raw: bytes) -> list:
    """The `data:` payloads of an SSE body: dicts, and the final "[DONE]" string."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


@contextlib.contextmanager
def one_torch_thread():
    """Run in-process torch work on one thread (see start_engine), restoring the setting after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
