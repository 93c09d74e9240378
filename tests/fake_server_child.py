"""Start the synthetic streaming server as a child: in a module of its own, not a conftest, so a test
can import it by a name no other folder's conftest.py shares (`from conftest import ...` picks
whichever conftest module was imported first when several folders run together)."""

import os

from rooftop.bench.subproc import ChildServer, python_module


def start_fake_server(*args: str) -> ChildServer:
    """The synthetic streaming server (rooftop.bench.fakeserver) on a free port; it dies with this process."""
    return ChildServer(python_module("rooftop.bench.fakeserver", "--port", "0", "--parent-pid", str(os.getpid()), *args),
                       "fakeserver ready")
