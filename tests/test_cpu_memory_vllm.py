"""``cpu_memory`` against vLLM 0.32's own code on the same fake machines.

vLLM's placement (``OMPProcessManager``) and node reading (``get_memory_node_info``) run
with their file reads and CPU queries pointed at the fake tree: they must give the CPU
lists, nodes and memory figures ``cpu_memory`` gives.
"""

import builtins
import os
import pathlib
import types

import pytest

from vllm_gdn_neuron import cpu_memory

from .cpu_memory_testing import FakeNode, fake_machine, two_nodes


@pytest.fixture
def vllm_on(monkeypatch):
    """``machine(root) -> module``: vLLM's ``cpu_resource_utils`` reading the fake tree under ``root``."""
    from vllm.utils import cpu_resource_utils as resources

    def machine(root: pathlib.Path, topology: cpu_memory.Topology):
        def fake_open(path, *args, **kwargs):
            path = str(path)
            if path.startswith("/proc/") and path.endswith("/status"):
                path = "/proc/self/status"
            return builtins.open(root / path.lstrip("/"), *args, **kwargs)

        cores = {siblings: index for index, siblings in enumerate(sorted(set(topology.cpu_siblings.values())))}
        cpu_list = [resources.LogicalCPUInfo(cpu, cores[topology.cpu_siblings[cpu]], node)
                    for cpu, node in sorted(topology.cpu_nodes.items())]
        fake_os = types.SimpleNamespace(
            path=types.SimpleNamespace(exists=lambda p: (root / str(p).lstrip("/")).exists()),
            environ=os.environ, getpid=os.getpid, sched_getaffinity=lambda pid: set(topology.allowed_cpus),
        )
        monkeypatch.setattr(resources, "open", fake_open, raising=False)
        monkeypatch.setattr(resources, "os", fake_os)
        monkeypatch.setattr(resources, "_get_cpu_list", lambda: cpu_list)
        resources.get_cgroup_memory_limit.cache_clear()
        return resources

    yield machine
    resources.get_cgroup_memory_limit.cache_clear()


def _vllm_cpu_lists(world_size: int) -> list[list[int]]:
    """The CPU list of each rank, from vLLM's ``OMPProcessManager`` (x86, the MP executor)."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    manager = OMPProcessManager.__new__(OMPProcessManager)
    manager.local_world_size = world_size
    manager.local_dp_rank = 0
    manager.internal_dp_size = 1
    manager.simulate_multi_node = os.environ.get("VLLM_CPU_SIM_MULTI_NUMA", "0") != "0"
    manager.reserve_cpu_num = world_size
    manager._parse_omp_threads_bind_env()
    return manager.cpu_lists


LAYOUTS = {
    "one node": lambda root: fake_machine(root, {0: FakeNode(tuple(range(6)), total=24, free=9)}),
    "two nodes, SMT": two_nodes,
    "two nodes, confined to node 1": lambda root: two_nodes(root, allowed=list(range(8, 16)), memory_nodes=[1]),
    "cgroup below the node": lambda root: two_nodes(root, cgroup=(12.0, 11.0)),
}
CASES = [
    ("one node", 1, {}), ("two nodes, SMT", 1, {}), ("two nodes, SMT", 2, {}),
    ("two nodes, SMT", 1, {"CPU_VISIBLE_MEMORY_NODES": "1"}),
    ("two nodes, SMT", 2, {"VLLM_CPU_OMP_THREADS_BIND": "0-3|8-11"}),
    ("one node", 2, {"VLLM_CPU_SIM_MULTI_NUMA": "1"}),
    ("two nodes, confined to node 1", 1, {}), ("cgroup below the node", 1, {}),
]


@pytest.mark.parametrize(("layout", "world_size", "env"), CASES)
def test_placement_and_node_memory_are_vllms(tmp_path, monkeypatch, vllm_on, layout, world_size, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    root = LAYOUTS[layout](tmp_path)
    topology = cpu_memory.read_topology(root, machine="x86_64")
    resources = vllm_on(root, topology)
    ours = cpu_memory.worker_nodes(topology, world_size, os.environ)
    assert [list(worker.cpus) for worker in ours] == _vllm_cpu_lists(world_size)
    for worker in ours:
        # the worker's first allowed CPU, as vLLM's CPUWorker reads it once bound to its list
        first = [cpu for cpu in resources.get_allowed_cpu_list() if cpu.id in worker.cpus][0]
        assert worker.node == first.numa_node
        info = resources.get_memory_node_info(first.numa_node)
        assert (worker.memory.total, worker.memory.available) == (info.total_memory, info.available_memory)
