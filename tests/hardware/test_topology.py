import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rooftop.errors import RooftopError
from rooftop.hardware.topology import (
    discover,
    format_cpu_list,
    gpu_numa_node,
    parse_cpu_list,
    parse_nvidia_smi_csv,
    read_numa_nodes,
    sysfs_bus_id,
)


def test_parse_cpu_list_ranges_and_singles():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("5") == [5]
    assert parse_cpu_list("3,1,1-2") == [1, 2, 3]


@pytest.mark.parametrize("bad", ["3-1", "a", "1-", "-2", "0-x"])
def test_parse_cpu_list_rejects_malformed(bad):
    with pytest.raises(ValueError):
        parse_cpu_list(bad)


def test_format_cpu_list_collapses_runs():
    assert format_cpu_list([8, 0, 1, 2, 3, 10, 11]) == "0-3,8,10-11"
    assert format_cpu_list([4]) == "4"
    assert format_cpu_list([]) == ""


@given(st.sets(st.integers(min_value=0, max_value=300), max_size=60))
def test_format_then_parse_round_trips(cpus):
    assert parse_cpu_list(format_cpu_list(cpus)) == sorted(cpus)


def _fake_sys(root, nodes, pci=None):
    for node, cpulist in nodes.items():
        d = root / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    (root / "devices/system/cpu").mkdir(parents=True, exist_ok=True)
    (root / "devices/system/cpu/online").write_text("0-15\n")
    for bus, node in (pci or {}).items():
        d = root / "bus/pci/devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node}\n")
    return root


def test_numa_nodes_from_sysfs(tmp_path):
    root = _fake_sys(tmp_path, {1: "8-15", 0: "0-7"})
    nodes = read_numa_nodes(root)
    assert [(n.node, n.cpus) for n in nodes] == [(0, list(range(8))), (1, list(range(8, 16)))]


def test_no_numa_directory_means_one_node_of_online_cpus(tmp_path):
    (tmp_path / "devices/system/cpu").mkdir(parents=True)
    (tmp_path / "devices/system/cpu/online").write_text("0-5\n")
    nodes = read_numa_nodes(tmp_path)
    assert [(n.node, n.cpus) for n in nodes] == [(0, [0, 1, 2, 3, 4, 5])]


def test_gpu_numa_node_uses_sysfs_spelling_of_bus_id(tmp_path):
    root = _fake_sys(tmp_path, {0: "0-7"}, pci={"0000:1b:00.0": 1, "0000:3c:00.0": -1})
    assert sysfs_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    assert gpu_numa_node("00000000:1B:00.0", root) == 1
    assert gpu_numa_node("00000000:3C:00.0", root) is None  # -1: the firmware does not say
    assert gpu_numa_node("00000000:99:00.0", root) is None


def test_parse_nvidia_smi_csv():
    text = (
        "0, NVIDIA H200, 00000000:1B:00.0, 143771 MiB\n"
        "1, NVIDIA H200, 00000000:43:00.0, 143771 MiB\n\n"
    )
    gpus = parse_nvidia_smi_csv(text)
    assert [(g.index, g.name, g.pci_bus_id, g.memory_total_mib) for g in gpus] == [
        (0, "NVIDIA H200", "00000000:1B:00.0", 143771),
        (1, "NVIDIA H200", "00000000:43:00.0", 143771),
    ]


def test_discover_this_host():
    topo = discover()
    assert topo.numa_nodes, "every host has at least one NUMA node"
    mine = os.sched_getaffinity(0)
    assert mine <= set(topo.online_cpus)
    all_node_cpus = {c for n in topo.numa_nodes for c in n.cpus}
    assert mine <= all_node_cpus
    assert topo.cpus_of_node(topo.numa_nodes[0].node) == topo.numa_nodes[0].cpus
    with pytest.raises(RooftopError, match="NUMA node 97 does not exist"):
        topo.cpus_of_node(97)
