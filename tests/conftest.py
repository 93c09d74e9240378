"""Shared fixtures: real helper servers as child processes on 127.0.0.1, stopped at the end."""

import os
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


# `make test` runs the suite on two pytest-xdist workers, a file at a time (-n 2 --dist loadfile): a module's
# servers start once and its tests never overlap each other, as in a serial run. The slowest files are handed
# out first (--no-loadscope-reorder keeps this order) so that both workers finish at about the same time.
# Order only: a file that is not listed runs after these, in the usual order. A serial run is unchanged.
# (Not --dist loadgroup: xdist 3.8 marks a group by rewriting item._nodeid, which pytest 9.2 no longer reads.)
SLOWEST_FIRST = [  # from a serial run's --durations, slowest first
    "tests/adapters/test_vllm_live.py",
    "tests/adapters/test_vllm_live_errors.py",
    "tests/adapters/test_vllm_multi_turn.py",
    "tests/campaign/test_campaign_runner.py",
    "tests/launch/test_hosts.py",
    "tests/cli/test_deploy.py",
    "tests/engine/test_kernels_cpu.py",
    "tests/engine/test_engine_process.py",
    "tests/bench/test_slo.py",
    "tests/profile/test_spill.py",
    "tests/engine/test_pd.py",
    "tests/cli/test_narrow_tables.py",
    "tests/report/test_html.py",
    "tests/cli/test_bench_backend.py",
    "tests/report/test_report_build.py",
    "tests/profile/test_graph_map.py",
    "tests/engine/test_server.py",
]


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order
