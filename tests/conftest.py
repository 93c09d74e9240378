"""Shared fixtures: real helper servers as child processes on 127.0.0.1, stopped at the end."""

import pytest

from rooftop.bench.subproc import ChildServer, python_module


def start_fake_server(*args: str) -> ChildServer:
    """The synthetic streaming server (rooftop.bench.fakeserver) on a free port."""
    return ChildServer(python_module("rooftop.bench.fakeserver", "--port", "0", *args), "fakeserver ready")


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
