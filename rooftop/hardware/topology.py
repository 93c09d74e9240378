"""What this host has: GPUs (NVML or nvidia-smi), NUMA nodes and their CPUs (/sys), and the NUMA node of each GPU.

Everything reads from `sys_root` (default "/sys") so a test can point it at a directory tree of its own.
"""

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rooftop.errors import RooftopError


@dataclass(slots=True)
class Gpu:
    """One GPU as the driver lists it; `numa_node` is None where /sys does not say."""

    index: int
    name: str
    pci_bus_id: str
    memory_total_mib: int
    numa_node: int | None = None


@dataclass(slots=True)
class NumaNode:
    """A NUMA node and the CPU ids it holds."""

    node: int
    cpus: list[int]


@dataclass(slots=True)
class Topology:
    """GPUs, NUMA nodes and online CPUs of this host."""

    gpus: list[Gpu] = field(default_factory=list)
    numa_nodes: list[NumaNode] = field(default_factory=list)
    online_cpus: list[int] = field(default_factory=list)
    gpu_source: str = "none"  # "nvml" | "nvidia-smi" | "none"

    def cpus_of_node(self, node: int) -> list[int]:
        """CPU ids of NUMA node `node`; RooftopError if this host has no such node."""
        for n in self.numa_nodes:
            if n.node == node:
                return list(n.cpus)
        have = ", ".join(str(n.node) for n in self.numa_nodes) or "none"
        raise RooftopError(
            f"NUMA node {node} does not exist on this host (nodes: {have})",
            "use a node this host has, or give the role an explicit `cpus` list",
        )


def parse_cpu_list(text: str) -> list[int]:
    """Parse a kernel CPU list such as "0-3,8,10-11" into sorted unique ids; ValueError when malformed."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo_text, hi_text = part.split("-", 1)
            lo, hi = int(lo_text), int(hi_text)
            if lo < 0 or hi < lo:
                raise ValueError(f"bad CPU range {part!r}")
            cpus.update(range(lo, hi + 1))
        else:
            cpu = int(part)
            if cpu < 0:
                raise ValueError(f"bad CPU id {part!r}")
            cpus.add(cpu)
    return sorted(cpus)


def format_cpu_list(cpus: list[int] | set[int]) -> str:
    """Format CPU ids the way the kernel does: [0, 1, 2, 3, 8] -> "0-3,8"."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def read_numa_nodes(sys_root: str | Path = "/sys") -> list[NumaNode]:
    """NUMA nodes from /sys/devices/system/node/node*/cpulist; one node 0 with all online CPUs if absent."""
    node_dir = Path(sys_root) / "devices/system/node"
    nodes: list[NumaNode] = []
    for path in sorted(node_dir.glob("node[0-9]*")):
        cpulist = path / "cpulist"
        if cpulist.is_file():
            nodes.append(NumaNode(int(path.name[4:]), parse_cpu_list(cpulist.read_text())))
    if not nodes:
        # Kernels built without NUMA have no node directory: the whole machine is one node.
        nodes.append(NumaNode(0, read_online_cpus(sys_root)))
    return sorted(nodes, key=lambda n: n.node)


def read_online_cpus(sys_root: str | Path = "/sys") -> list[int]:
    """Online CPU ids from /sys/devices/system/cpu/online, else the CPUs this process may use."""
    online = Path(sys_root) / "devices/system/cpu/online"
    if online.is_file():
        return parse_cpu_list(online.read_text())
    return sorted(os.sched_getaffinity(0))


def sysfs_bus_id(bus_id: str) -> str:
    """NVML/nvidia-smi bus id ("00000000:1B:00.0") -> the /sys spelling ("0000:1b:00.0")."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]:0>4}:{rest}" if rest else bus_id


def gpu_numa_node(bus_id: str, sys_root: str | Path = "/sys") -> int | None:
    """NUMA node of the PCI device `bus_id` from /sys/bus/pci/devices/<bus>/numa_node; None if unknown (-1)."""
    path = Path(sys_root) / "bus/pci/devices" / sysfs_bus_id(bus_id) / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def parse_nvidia_smi_csv(text: str) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv,noheader` output."""
    gpus: list[Gpu] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4:
            continue
        memory = fields[3].split()[0]  # "143771 MiB"
        gpus.append(Gpu(int(fields[0]), fields[1], fields[2], int(memory) if memory.isdigit() else 0))
    return gpus


def _gpus_from_nvml() -> list[Gpu] | None:
    try:
        import pynvml  # nvidia-ml-py: present only where a GPU is
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: NVML raises its own error types
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            gpus.append(
                Gpu(
                    i,
                    name.decode() if isinstance(name, bytes) else name,
                    bus.decode() if isinstance(bus, bytes) else bus,
                    int(memory) // (1 << 20),
                )
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _gpus_from_nvidia_smi() -> list[Gpu] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    query = [exe, "--query-gpu=index,name,pci.bus_id,memory.total", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi_csv(out)


def discover_gpus(sys_root: str | Path = "/sys") -> tuple[list[Gpu], str]:
    """GPUs of this host and where the list came from ("nvml", "nvidia-smi" or "none")."""
    for source, probe in (("nvml", _gpus_from_nvml), ("nvidia-smi", _gpus_from_nvidia_smi)):
        gpus = probe()
        if gpus is not None:
            for gpu in gpus:
                gpu.numa_node = gpu_numa_node(gpu.pci_bus_id, sys_root)
            return gpus, source
    return [], "none"


def discover(sys_root: str | Path = "/sys") -> Topology:
    """The whole topology of this host."""
    gpus, source = discover_gpus(sys_root)
    return Topology(gpus, read_numa_nodes(sys_root), read_online_cpus(sys_root), source)
