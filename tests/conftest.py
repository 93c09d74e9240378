"""Shared fixtures: real helper servers as child processes on 127.0.0.1, stopped at the end."""

import os
import signal

import pytest

from rooftop.bench.subproc import ChildServer, python_module

# A shell starts a background job (`make test &`, `bash -c '...' &`) with SIGINT ignored, and every
# child inherits that: the tests that Ctrl-C a rooftop child would see it shrug. A handler here (not
# an ignore) is reset to the default in each exec'd child, so Python there turns SIGINT into
# KeyboardInterrupt again, however the suite was started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def start_fake_server(*args: str) -> ChildServer:
    """The synthetic streaming server (rooftop.bench.fakeserver) on a free port."""
    return ChildServer(python_module("rooftop.bench.fakeserver", "--port", "0", "--parent-pid", str(os.getpid()), *args),
                       "fakeserver ready")


@pytest.fixture
def fake_server():
    servers = []

    def start(*args: str) -> ChildServer:
        s = start_fake_server(*args)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()
