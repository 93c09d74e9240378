import os
import subprocess
import sys
import time

import pytest

from rooftop.errors import RooftopError
from rooftop.hardware.pinning import (
    cpus_allowed,
    numactl_argv,
    process_tree,
    resolve_cpus,
    taskset_argv,
    verify_pinning,
)
from rooftop.hardware.topology import NumaNode, Topology

TOPO = Topology(numa_nodes=[NumaNode(0, [0, 1, 2, 3]), NumaNode(1, [4, 5, 6, 7])], online_cpus=list(range(8)))
HAVE_TWO_CPUS = len(os.sched_getaffinity(0)) >= 2 and {0, 1} <= os.sched_getaffinity(0)


def test_resolve_cpus():
    assert resolve_cpus(None, [3, 1], TOPO) == [1, 3]
    assert resolve_cpus(1, None, TOPO) == [4, 5, 6, 7]
    assert resolve_cpus(None, None, TOPO) is None
    with pytest.raises(RooftopError, match="NUMA node 2 does not exist on this host \\(nodes: 0, 1\\)"):
        resolve_cpus(2, None, TOPO)
    with pytest.raises(RooftopError, match="CPU\\(s\\) 9 are not online"):
        resolve_cpus(None, [0, 9], TOPO)


def test_pinning_prefixes():
    assert taskset_argv([0, 1, 2, 3, 8]) == ["taskset", "-c", "0-3,8"]
    assert numactl_argv(cpus=[4, 5]) == ["numactl", "--physcpubind=4-5"]
    assert numactl_argv(numa=1) == ["numactl", "--cpunodebind=1", "--membind=1"]


# A parent pinned to CPU 0 that starts a child (inheriting CPU 0) and, if asked, a second child it re-pins.
TREE = """
import os, subprocess, sys, time
repin = sys.argv[1] == "repin"
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])]
if repin:
    kids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 preexec_fn=lambda: os.sched_setaffinity(0, {0, 1})))
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(60)
"""


def _start_tree(mode: str):
    proc = subprocess.Popen(
        [sys.executable, "-c", TREE, mode],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {0}),
        start_new_session=True,
    )
    kids = [int(p) for p in proc.stdout.readline().split()]
    return proc, kids


def _kill(proc):
    os.killpg(proc.pid, 9)
    proc.wait()


def test_verify_pinning_reads_process_and_children():
    proc, kids = _start_tree("plain")
    try:
        tree = verify_pinning(proc.pid, [0], "prefill")
        assert set(tree) == {proc.pid, *kids}
        assert all(cpus == [0] for cpus in tree.values())
        assert process_tree(proc.pid)[0] == proc.pid
        assert cpus_allowed(proc.pid) == [0]
    finally:
        _kill(proc)


@pytest.mark.skipif(not HAVE_TWO_CPUS, reason="needs CPUs 0 and 1")
def test_verify_pinning_catches_wrong_cpus_of_process_and_of_child():
    proc, kids = _start_tree("repin")
    try:
        with pytest.raises(RooftopError, match=f"pid {proc.pid}\\).*CPUs 0, outside its placement 1"):
            verify_pinning(proc.pid, [1], "decode")
        # The re-pinned child may use CPUs 0-1 while its role has only CPU 0.
        with pytest.raises(RooftopError, match=f"pid {kids[1]}, child of {proc.pid}\\) may run on CPUs 0-1"):
            verify_pinning(proc.pid, [0], "decode")
        assert set(verify_pinning(proc.pid, [0, 1])) == {proc.pid, *kids}
    finally:
        _kill(proc)


def test_gone_process():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    time.sleep(0.05)
    assert cpus_allowed(proc.pid) is None
    with pytest.raises(RooftopError, match="is gone"):
        verify_pinning(proc.pid, [0], "single")
