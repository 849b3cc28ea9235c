"""The paged ops through the NKI kernels (interpreted here) against the float64 references."""

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.kernels.reference import causal_conv1d, causal_conv1d_step, gdn_recurrence, tolerance
from vllm_gdn_neuron.ops.backends import nki as paged_nki

PAGES, C, K = 7, 48, 4
PAD = 6


def _assert_close(actual, expected, dtype, what):
    error = (actual.double() - expected.double()).abs().max().item()
    assert error <= tolerance(dtype, expected), f"{what}: {error:.3g} > {tolerance(dtype, expected):.3g}"


def _qkvgb(rows, hk, hv, dk, dv, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(rows, hk, dk, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(rows, hv, dv, generator=gen).to(dtype)
    return q, k, v, -8.0 * torch.rand(rows, hv, generator=gen), torch.rand(rows, hv, generator=gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hk, hv, dk, dv", [(2, 4, 32, 16), (1, 1, 16, 16), (2, 8, 16, 32)])
def test_decode_matches_the_references(nki_launches, dtype, hk, hv, dk, dv):
    gen = torch.Generator().manual_seed(1)
    conv, ssm = torch.randn(PAGES, C, K, generator=gen), torch.randn(PAGES, hv, dk, dv, generator=gen)
    conv_before, ssm_before = conv.clone(), ssm.clone()
    step = ops.DecodeStep.build(torch.tensor([4, PAD, 0, PAD, 2]), PAD)   # two padding rows
    x, weight = torch.randn(5, C, generator=gen).to(dtype), torch.randn(C, K, generator=gen).to(dtype)
    q, k, v, g, beta = _qkvgb(5, hk, hv, dk, dv, dtype, seed=2)
    y = paged_nki.paged_conv1d_decode(x, weight, conv, step)
    o = paged_nki.paged_gdn_decode(q, k, v, g, beta, ssm, step, use_qk_l2norm=True)
    live, rows = torch.tensor([4, 0, 2]), torch.tensor([0, 2, 4])
    y_ref, conv_ref = causal_conv1d_step(x[rows], weight, conv_before[live])
    o_ref, ssm_ref = gdn_recurrence(q[rows], k[rows], v[rows], g[rows], beta[rows], torch.arange(4),
                                    ssm_before[live], use_qk_l2norm=True)
    _assert_close(y[rows], y_ref, dtype, "y")
    _assert_close(o[rows], o_ref, dtype, "o")
    _assert_close(conv[live], conv_ref, dtype, "conv pages")
    _assert_close(ssm[live], ssm_ref, dtype, "ssm pages")
    assert y.dtype == x.dtype and o.dtype == v.dtype
    assert not y[[1, 3]].any() and not o[[1, 3]].any()
    untouched = torch.tensor([1, 3, 5])
    assert torch.equal(conv[untouched], conv_before[untouched]) and torch.equal(ssm[untouched], ssm_before[untouched])
    assert nki_launches == {"conv1d_decode": 1, "gdn_recurrent_step": 1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "lengths, num_tokens",
    [
        pytest.param([70, 1], 80, id="70+1"),
        pytest.param([128, 3, 0], 140, id="128+3+pad", marks=pytest.mark.slow),  # a 256-token bucket
        pytest.param([5], 5, id="one-5"),
        pytest.param([1, 1, 1, 0], 8, id="three-1+pad"),
    ],
)
def test_prefill_matches_the_references(nki_launches, dtype, lengths, num_tokens):
    hk, hv, dk, dv = 2, 4, 32, 16
    gen = torch.Generator().manual_seed(3)
    conv, ssm = torch.randn(PAGES, C, K, generator=gen), torch.randn(PAGES, hv, dk, dv, generator=gen)
    pages = torch.tensor([1, 3, 5, 0][: len(lengths)])
    pages = torch.where(torch.tensor(lengths) > 0, pages, PAD)
    has_state = torch.tensor([True, False, True, False][: len(lengths)])
    conv[3], ssm[3] = float("nan"), float("nan")                 # a fresh sequence's stale page
    conv_before, ssm_before = conv.clone(), ssm.clone()
    bounds = torch.tensor([0] + lengths).cumsum(0)
    step = ops.PrefillStep.build(bounds, pages, has_state, num_tokens)
    x, weight = torch.randn(num_tokens, C, generator=gen).to(dtype), torch.randn(C, K, generator=gen).to(dtype)
    q, k, v, g, beta = _qkvgb(num_tokens, hk, hv, dk, dv, dtype, seed=4)
    y = paged_nki.paged_conv1d_prefill(x, weight, conv, step)
    o = paged_nki.paged_gdn_prefill(q, k, v, g, beta, ssm, step, use_qk_l2norm=True)
    real = [i for i, n in enumerate(lengths) if n]
    fresh = ~has_state[real]
    init_conv = torch.where(fresh[:, None, None], 0.0, conv_before[pages[real]])
    init_ssm = torch.where(fresh[:, None, None, None], 0.0, ssm_before[pages[real]])
    cut = int(bounds[-1])
    cu = torch.tensor([0] + [lengths[i] for i in real]).cumsum(0)
    y_ref, conv_ref = causal_conv1d(x[:cut], weight, cu, init_conv)
    o_ref, ssm_ref = gdn_recurrence(q[:cut], k[:cut], v[:cut], g[:cut], beta[:cut], cu, init_ssm, use_qk_l2norm=True)
    _assert_close(y[:cut], y_ref, dtype, "y")
    _assert_close(o[:cut], o_ref, dtype, "o")
    _assert_close(conv[pages[real]], conv_ref, dtype, "conv pages")
    _assert_close(ssm[pages[real]], ssm_ref, dtype, "ssm pages")
    assert not y[cut:].any() and not o[cut:].any()
    others = [p for p in range(PAGES) if p not in pages[real].tolist() and p != PAD]
    for cache, before in ((conv, conv_before), (ssm, ssm_before)):
        torch.testing.assert_close(cache[others], before[others], rtol=0, atol=0, equal_nan=True)
    assert nki_launches == {"conv1d_prefill": 1, "gdn_cte": 1}


def test_strided_cache_views_are_updated_in_place():
    """The Neuron shell hands the ops views of one page tensor (conv | ssm parts of a row)."""
    hv, dk, dv = 4, 32, 16
    rows = torch.randn(3, C * K + hv * dk * dv)
    conv, ssm = rows[:, : C * K].view(3, C, K), rows[:, C * K:].view(3, hv, dk, dv)
    assert not conv.is_contiguous()
    expected_conv, expected_ssm = conv.clone(), ssm.clone()
    step = ops.DecodeStep.build(torch.tensor([2, 0]))
    x, weight = torch.randn(2, C), torch.randn(C, K)
    q, k, v, g, beta = _qkvgb(2, 2, hv, dk, dv, torch.float32, seed=5)
    paged_nki.paged_conv1d_decode(x, weight, conv, step)
    paged_nki.paged_gdn_decode(q, k, v, g, beta, ssm, step)
    ops.paged_conv1d_decode(x, weight, expected_conv, step)
    ops.paged_gdn_decode(q, k, v, g, beta, expected_ssm, step)
    _assert_close(conv, expected_conv, torch.float32, "conv view")
    _assert_close(ssm, expected_ssm, torch.float32, "ssm view")


def test_a_bfloat16_state_cache_is_served_through_float32():
    """vLLM's bfloat16 state pages: the kernels run on a float32 copy, the pages get the result rounded."""
    step = ops.DecodeStep.build(torch.tensor([0]))
    q, k, v, g, beta = _qkvgb(1, 1, 1, 16, 16, torch.float32, seed=6)
    ssm = (0.3 * torch.randn(2, 1, 16, 16)).to(torch.bfloat16)
    expected = ssm.clone()
    o = paged_nki.paged_gdn_decode(q, k, v, g, beta, ssm, step)
    o_want = ops.paged_gdn_decode(q, k, v, g, beta, expected, step)
    _assert_close(o, o_want, torch.bfloat16, "o")
    _assert_close(ssm, expected, torch.bfloat16, "bf16 pages")


@pytest.mark.parametrize("env, expected", [("", "torch"), ("torch", "torch"), ("nki", "nki")])
def test_the_neuron_shells_phases_follow_the_backend_choice(monkeypatch, env, expected):
    """Off a Neuron SDK, ``auto`` is torch for a Neuron layer; ``nki`` binds the kernels' paged ops."""
    from vllm_gdn_neuron.ops.auto import ConvShape, GdnShape
    from vllm_gdn_neuron.ops.gating import GatesFirst
    from vllm_gdn_neuron.ops.phases import resolve_phases

    monkeypatch.setenv("VLLM_GDN_BACKEND", env)
    chosen = resolve_phases(GdnShape(torch.float32, 1, 1, 16, 16, 0.25, torch.float32),
                            ConvShape(torch.float32, torch.float32, torch.float32, 48, 4, "silu"), "neuron")
    assert chosen.backends["gdn_decode"] == chosen.backends["conv_prefill"] == expected
    module = paged_nki if expected == "nki" else ops
    assert chosen.gdn_decode == GatesFirst(module.paged_gdn_decode) and chosen.conv_prefill is module.paged_conv1d_prefill
