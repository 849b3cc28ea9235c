"""The NKI import seam: real NKI when importable, the interpreter otherwise or when forced."""

import importlib
import sys
import types

import pytest

import vllm_gdn_neuron.kernels.nki_compat as nki_compat
from vllm_gdn_neuron.kernels import interp


def _reload(monkeypatch, env=None, fake_nki=None):
    if env is None:
        monkeypatch.delenv(nki_compat.ENV_FORCE_INTERPRETER, raising=False)
    else:
        monkeypatch.setenv(nki_compat.ENV_FORCE_INTERPRETER, env)
    if fake_nki is not None:
        for name, module in fake_nki.items():
            monkeypatch.setitem(sys.modules, name, module)
    return importlib.reload(nki_compat)


@pytest.fixture(autouse=True)
def _restore():
    yield
    importlib.reload(nki_compat)


def _fake_sdk(with_jit=True):
    root = types.ModuleType("nki")
    language = types.ModuleType("nki.language")
    isa = types.ModuleType("nki.isa")
    if with_jit:
        root.jit = lambda f: f
    root.language, root.isa = language, isa
    return {"nki": root, "nki.language": language, "nki.isa": isa}


def test_without_the_sdk_the_interpreter_is_used(monkeypatch):
    monkeypatch.setitem(sys.modules, "nki", None)  # import nki -> ImportError
    compat = _reload(monkeypatch)
    assert compat.using_interpreter is True
    assert compat.nki is interp.nki and compat.nl is interp.nl and compat.nisa is interp.nisa


def test_without_the_sdk_or_the_interpreter_the_kernels_are_refused(monkeypatch):
    """The interpreter serves only where a program imported it first (an explicit opt-in)."""
    monkeypatch.setitem(sys.modules, "nki", None)
    monkeypatch.delitem(sys.modules, nki_compat.INTERPRETER)
    with pytest.raises(ImportError, match="need the Neuron SDK's nki.*set VLLM_GDN_NKI_INTERPRET=1"):
        _reload(monkeypatch)


def test_the_environment_switches_the_interpreter_on(monkeypatch):
    monkeypatch.setitem(sys.modules, "nki", None)
    monkeypatch.delitem(sys.modules, nki_compat.INTERPRETER)
    compat = _reload(monkeypatch, env="1")
    assert compat.using_interpreter is True and compat.nki is sys.modules[nki_compat.INTERPRETER].nki


def test_a_real_sdk_is_preferred(monkeypatch):
    sdk = _fake_sdk()
    compat = _reload(monkeypatch, fake_nki=sdk)
    assert compat.using_interpreter is False
    assert compat.nki is sdk["nki"] and compat.nl is sdk["nki.language"] and compat.nisa is sdk["nki.isa"]


def test_the_environment_forces_the_interpreter(monkeypatch):
    compat = _reload(monkeypatch, env="1", fake_nki=_fake_sdk())
    assert compat.using_interpreter is True
    assert compat.nki is interp.nki


def test_an_empty_placeholder_package_does_not_count_as_nki(monkeypatch):
    compat = _reload(monkeypatch, fake_nki=_fake_sdk(with_jit=False))
    assert compat.using_interpreter is True


def test_the_interpreter_exposes_the_nki_surface():
    assert callable(interp.nki.jit)
    assert interp.nki.language is interp.nl and interp.nki.isa is interp.nisa
    for name in ("nc_matmul", "nc_transpose", "dma_copy", "dma_transpose", "tensor_tensor", "tensor_scalar",
                 "activation", "tensor_copy", "memset", "affine_select", "iota", "tensor_reduce"):
        assert callable(getattr(interp.nisa, name)), name
    for name in ("ndarray", "ds", "program_id", "sbuf", "psum", "hbm", "shared_hbm", "float32", "bfloat16",
                 "float16", "int32", "add", "exp", "equal"):
        assert hasattr(interp.nl, name), name


def test_kernels_reach_nki_only_through_the_seam():
    """No kernel or package module imports nki (or the interpreter's nl/nisa) directly."""
    import pathlib
    import re

    repo = pathlib.Path(__file__).resolve().parents[2]
    direct = re.compile(r"^\s*(import nki\b|from nki\b|from \.interp import|from vllm_gdn_neuron\.kernels\.interp import)",
                        re.MULTILINE)
    sources = [p for p in (repo / "kernels").rglob("*.py")
               if "interp" not in p.relative_to(repo / "kernels").parts and p.name != "nki_compat.py"]
    sources += list((repo / "vllm_gdn_neuron").rglob("*.py"))
    offenders = [str(p.relative_to(repo)) for p in sources if direct.search(p.read_text())]
    assert offenders == []
