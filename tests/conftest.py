"""Shared fixtures: real helper servers as child processes on 127.0.0.1, stopped at the end."""

import signal

import pytest
from fake_server_child import start_fake_server  # this folder's (pytest puts it on the path)

from rooftop.bench.subproc import ChildServer

# A shell starts a background job (`make test &`, `bash -c '...' &`) with SIGINT ignored, and every
# child inherits that: the tests that Ctrl-C a rooftop child would see it shrug. A handler here (not
# an ignore) is reset to the default in each exec'd child, so Python there turns SIGINT into
# KeyboardInterrupt again, however the suite was started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
