import sys
from pathlib import Path

from rooftop.adapters.inventory import packages_of, stack_inventory
from rooftop.hardware.topology import discover, format_cpu_list


def test_inventory_of_this_stack():
    topo = discover()
    procs = [{"role": "prefill", "pid": 123, "cpus_allowed": "0"}]
    inv = stack_inventory(
        "embedded", processes=procs, env={"HF_TOKEN": "hf_secret", "NCCL_DEBUG": "INFO"}, topology=topo
    )
    assert inv["engine"]["name"] == "embedded" and inv["engine"]["version"] == "0.1.0"
    assert len(inv["engine"].get("commit", "")) == 40  # rooftop runs from a git checkout
    assert inv["torch"]["version"].startswith("2.")
    assert inv["packages"]["torch"]["version"] == inv["torch"]["version"]
    assert inv["python"]["python"] == sys.version.split()[0]
    assert inv["host"]["cpu_count"] == len(topo.online_cpus) and inv["host"]["cpu_model"]
    assert inv["numa"] == [{"node": n.node, "cpus": format_cpu_list(n.cpus)} for n in topo.numa_nodes]
    assert inv["gpu_count"] == len(inv["gpus"])
    assert inv["processes"] == procs
    assert inv["env"]["HF_TOKEN"] == "<redacted>" and inv["env"]["NCCL_DEBUG"] == "INFO"
    assert "hf_secret" not in repr(inv)


def test_packages_of_another_interpreter():
    # The venv's python resolved to its base interpreter: another environment, read in a subprocess.
    base = str(Path(sys.executable).resolve())
    info = packages_of(base, ("pip", "rooftop"))
    assert "error" not in info
    assert info["python"].count(".") == 2
    assert info["executable"] != sys.executable
