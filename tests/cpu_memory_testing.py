"""Fake machines for the CPU-memory tests: a ``sys/`` and ``proc/`` tree as Linux lays it out."""

import dataclasses
import pathlib

from vllm_gdn_neuron.cpu_memory import format_id_list
from vllm_gdn_neuron.units import GiB, KiB


@dataclasses.dataclass(frozen=True)
class FakeNode:
    """One NUMA node: its CPUs and its meminfo figures (GiB)."""

    cpus: tuple[int, ...]
    total: float
    free: float
    active_file: float = 0.5
    inactive_file: float = 0.25
    reclaimable: float = 0.25

    @property
    def available(self) -> int:
        """What vLLM's CPU worker reads as available: free + file pages + reclaimable slab."""
        return sum(int(gib * GiB) // KiB * KiB for gib in (self.free, self.active_file, self.inactive_file,
                                                          self.reclaimable))


def fake_machine(root: pathlib.Path, nodes: dict[int, FakeNode], threads_per_core: int = 1,
                 allowed: list[int] | None = None, memory_nodes: list[int] | None = None,
                 mem_available: float = 100.0, cgroup: tuple[float, float] | None = None,
                 node_meminfo: bool = True) -> pathlib.Path:
    """Write a machine under ``root``: ``nodes``, SMT siblings of ``threads_per_core`` consecutive
    CPUs, the process's allowed CPUs and memory nodes (default all), ``/proc/meminfo`` with
    ``mem_available`` GiB, an optional cgroup v2 ``(limit, usage)`` in GiB; ``node_meminfo``
    False leaves the nodes without a meminfo (as on machines without NUMA in sysfs)."""
    cpus = sorted(cpu for node in nodes.values() for cpu in node.cpus)
    cpu_dir = root / "sys/devices/system/cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text(format_id_list(cpus) + "\n")
    for cpu in cpus:
        first = cpu - cpu % threads_per_core
        (cpu_dir / f"cpu{cpu}/topology").mkdir(parents=True)
        (cpu_dir / f"cpu{cpu}/topology/thread_siblings_list").write_text(
            format_id_list(range(first, first + threads_per_core)) + "\n")
    for number, node in nodes.items():
        folder = root / f"sys/devices/system/node/node{number}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(format_id_list(node.cpus) + "\n")
        if node_meminfo:
            rows = [("MemTotal", node.total), ("MemFree", node.free), ("MemUsed", node.total - node.free),
                    ("Active(file)", node.active_file), ("Inactive(file)", node.inactive_file),
                    ("SReclaimable", node.reclaimable)]
            (folder / "meminfo").write_text(
                "".join(f"Node {number} {key}: {int(gib * GiB) // KiB:>12} kB\n" for key, gib in rows))
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/status").write_text(
        f"Name:\tpython\nCpus_allowed_list:\t{format_id_list(allowed or cpus)}\n"
        f"Mems_allowed_list:\t{format_id_list(memory_nodes or sorted(nodes))}\n")
    total = sum(node.total for node in nodes.values())
    (root / "proc/meminfo").write_text(
        f"MemTotal: {int(total * GiB) // KiB} kB\nMemFree: 1 kB\nMemAvailable: {int(mem_available * GiB) // KiB} kB\n")
    if cgroup is not None:
        (root / "sys/fs/cgroup").mkdir(parents=True)
        (root / "sys/fs/cgroup/memory.max").write_text(f"{int(cgroup[0] * GiB)}\n")
        (root / "sys/fs/cgroup/memory.current").write_text(f"{int(cgroup[1] * GiB)}\n")
    return root


def two_nodes(root: pathlib.Path, **kwargs) -> pathlib.Path:
    """Two 8-CPU nodes (2 threads per core): node 0 small and busy, node 1 large and idle."""
    nodes = {0: FakeNode(tuple(range(0, 8)), total=16, free=2), 1: FakeNode(tuple(range(8, 16)), total=64, free=60)}
    return fake_machine(root, nodes, threads_per_core=2, **kwargs)
