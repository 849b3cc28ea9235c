"""Paged ops on mixed steps equal the float64 references run sequence by sequence; padding is exact.

Every step mixes decode rows and prefill sequences of awkward lengths (1, C - 1, C, C + 1,
multi-chunk for the GDN chunk size C), fresh and continuing, with padding rows, empty padding
sequences, padding tokens, shuffled pages and NaN on the pad page and on fresh pages; no page
but the live ones and the pad page may change.
"""

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.ops import paged
from vllm_gdn_neuron.ops.backends.torch.chunked import GDN_CHUNK_SIZE as CHUNK

from .ops_testing import assert_matches, make_gdn_inputs
from .paged_testing import (
    changed_pages,
    make_caches,
    make_step,
    reference_conv_decode,
    reference_conv_prefill,
    reference_gdn_decode,
    reference_gdn_prefill,
)

BF16, F32 = torch.bfloat16, torch.float32
LENGTHS = [1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5]
HAS_STATE = [True, False, True, False, True]
NUM_DECODES = 3


def _steps(step, exact_plan):
    dec = ops.DecodeStep.build(step.decode_pages, step.pad_page)
    pre = ops.PrefillStep.build(step.query_start_loc, step.prefill_pages, step.has_state, step.num_tokens,
                                exact_plan=exact_plan)
    return dec, pre


def _assert_padding_zero(out, rows, what):
    assert torch.equal(out[rows], torch.zeros_like(out[rows])), f"{what}: padding outputs are not zero"


def _assert_only_live_changed(before, after, step, what):
    allowed = set(step.live_pages) | {step.pad_page}
    stray = [p for p in changed_pages(before, after) if p not in allowed]
    assert not stray, f"{what}: pages {stray} changed"


# (Hk, Hv, Dk, Dv, dtype, min_g, correlated, ssm cache dtype)
GDN_CASES = [
    (1, 1, 16, 16, F32, -1.0, False, F32),
    (2, 4, 16, 32, F32, -20.0, False, F32),
    (1, 3, 32, 8, F32, -1.0, True, F32),
    (1, 4, 16, 16, BF16, -1.0, False, F32),
    (2, 2, 8, 24, BF16, -20.0, True, F32),
    (2, 4, 16, 8, F32, -1.0, False, BF16),
    (2, 4, 64, 64, BF16, -1.0, False, F32),    # real models' head size class (64 / 128)
]


#: ``paged``'s gather limits for each eager decode path of a float32 cache: every step's rows
#: gathered, or every step's rows updated in place.
DECODE_PATHS = {"gathered": 1 << 40, "in-place": 0}


@pytest.mark.parametrize("decode_path", DECODE_PATHS)
@pytest.mark.parametrize("exact_plan", [False, True], ids=["varlen-plan", "exact-plan"])
@pytest.mark.parametrize("hk, hv, dk, dv, dtype, min_g, correlated, ssm_dtype", GDN_CASES)
def test_paged_gdn_mixed_step_matches_reference(hk, hv, dk, dv, dtype, min_g, correlated, ssm_dtype, exact_plan,
                                                decode_path, monkeypatch):
    for limit in ("GATHERED_ROW_BYTES", "GATHERED_STEP_BYTES"):
        monkeypatch.setattr(paged, limit, DECODE_PATHS[decode_path])
    step = make_step(NUM_DECODES, LENGTHS, HAS_STATE, seed=hk * 10 + hv)
    dec, pre = _steps(step, exact_plan)
    _, ssm = make_caches(step, (4, 4), (hv, dk, dv), ssm_dtype=ssm_dtype)
    before = ssm.clone()
    prompts = make_gdn_inputs(LENGTHS + [5], hk, hv, dk, dv, dtype=dtype, min_g=min_g, correlated=correlated,
                              with_state=False, seed=1)
    rows = make_gdn_inputs([1] * dec.num_rows, hk, hv, dk, dv, dtype=dtype, min_g=min_g, correlated=correlated,
                           with_state=False, seed=2)
    names = ("q", "k", "v", "g", "beta")

    o_dec = ops.paged_gdn_decode(*(rows[n] for n in names), ssm, dec, use_qk_l2norm=True)
    o_pre = ops.paged_gdn_prefill(*(prompts[n] for n in names), ssm, pre, use_qk_l2norm=True)

    ref_o, ref_state = reference_gdn_decode(*(rows[n] for n in names), before, step, use_qk_l2norm=True)
    state_dtype = dtype if ssm_dtype == F32 else BF16
    assert o_dec.dtype == dtype and o_pre.dtype == dtype
    assert_matches(o_dec[step.decode_real], ref_o, dtype, "decode o")
    assert_matches(ssm[step.decode_pages[step.decode_real]], ref_state, state_dtype, "decode states")
    _assert_padding_zero(o_dec, [r for r in range(dec.num_rows) if r not in step.decode_real], "decode")

    ref_o, ref_state = reference_gdn_prefill(*(prompts[n] for n in names), before, step, use_qk_l2norm=True)
    n = sum(LENGTHS)
    assert_matches(o_pre[:n], ref_o, dtype, "prefill o")
    assert_matches(ssm[step.prefill_pages[:len(LENGTHS)]], ref_state, state_dtype, "prefill states")
    _assert_padding_zero(o_pre, slice(n, None), "prefill")
    _assert_only_live_changed(before, ssm, step, "ssm_cache")


# (C, K, dtype, conv cache dtype)
# (64, 4, bf16, bf16) runs on vLLM's C++ conv where the CPU has it (``ops.backends.vllm_cpu``'s paged ops).
CONV_CASES = [(12, 4, F32, F32), (10, 4, BF16, BF16), (9, 2, BF16, F32), (8, 1, F32, F32), (64, 4, BF16, BF16)]


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("channels, width, dtype, cache_dtype", CONV_CASES)
def test_paged_conv1d_mixed_step_matches_reference(channels, width, dtype, cache_dtype, activation):
    step = make_step(NUM_DECODES, LENGTHS, HAS_STATE, seed=channels)
    dec, pre = _steps(step, exact_plan=False)
    conv, _ = make_caches(step, (channels, width), (1, 1, 1), conv_dtype=cache_dtype)
    before = conv.clone()
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(channels, width, generator=gen).to(dtype)
    x_dec = torch.randn(dec.num_rows, channels, generator=gen).to(dtype)
    x_pre = torch.randn(step.num_tokens, channels, generator=gen).to(dtype)

    y_dec = ops.paged_conv1d_decode(x_dec, weight, conv, dec, activation=activation)
    y_pre = ops.paged_conv1d_prefill(x_pre, weight, conv, pre, activation=activation)

    state_dtype = BF16 if BF16 in (dtype, cache_dtype) else F32
    ref_y, ref_state = reference_conv_decode(x_dec, weight, before, step, activation)
    assert y_dec.dtype == dtype and y_pre.dtype == dtype
    assert_matches(y_dec[step.decode_real], ref_y, dtype, "decode y")
    assert_matches(conv[step.decode_pages[step.decode_real]], ref_state, state_dtype, "decode states")
    _assert_padding_zero(y_dec, [r for r in range(dec.num_rows) if r not in step.decode_real], "decode")
    ref_y, ref_state = reference_conv_prefill(x_pre, weight, before, step, activation)
    n = sum(LENGTHS)
    assert_matches(y_pre[:n], ref_y, dtype, "prefill y")
    assert_matches(conv[step.prefill_pages[:len(LENGTHS)]], ref_state, state_dtype, "prefill states")
    _assert_padding_zero(y_pre, slice(n, None), "prefill")
    _assert_only_live_changed(before, conv, step, "conv_cache")


def test_paged_gdn_bf16_ssm_cache_decode_path():
    # A bfloat16 cache takes the gather / write-back decode path eagerly too.
    step = make_step(4, [3], [True], seed=5)
    dec, _ = _steps(step, exact_plan=False)
    _, ssm = make_caches(step, (1, 1), (4, 16, 16), ssm_dtype=BF16)
    before = ssm.clone()
    rows = make_gdn_inputs([1] * dec.num_rows, 2, 4, 16, 16, with_state=False, seed=6)
    names = ("q", "k", "v", "g", "beta")
    o = ops.paged_gdn_decode(*(rows[n] for n in names), ssm, dec, use_qk_l2norm=True)
    ref_o, ref_state = reference_gdn_decode(*(rows[n] for n in names), before, step, use_qk_l2norm=True)
    assert_matches(o[step.decode_real], ref_o, F32, "o")
    assert_matches(ssm[step.decode_pages[step.decode_real]], ref_state, BF16, "states")
    _assert_only_live_changed(before, ssm, step, "ssm_cache")


@pytest.mark.parametrize("hk, hv, dtype", [(2, 4, F32), (1, 1, BF16)])
def test_chunked_prefill_then_decode_steps_equal_the_whole_sequences(hk, hv, dtype):
    # Two prompts (lengths 70 and 9) served as: a first prefill chunk, a continuation chunk
    # (has_state), then 3 decode steps; the pages end where the reference of the whole ends.
    lengths, first, tail = [70, 9], [40, 4], 3
    x = make_gdn_inputs(lengths, hk, hv, 16, 16, dtype=dtype, min_g=-3.0, with_state=False, seed=7)
    names = ("q", "k", "v", "g", "beta")
    whole_o, whole_state = ops.gdn_prefill(*(x[n] for n in names), x["cu_seqlens"], use_qk_l2norm=True)
    starts = [0, lengths[0]]
    pages, pad_page = torch.tensor([4, 1]), 0
    ssm = torch.full((6, hv, 16, 16), float("nan"))

    def prefill(spans, has_state):
        tokens = torch.cat([torch.arange(s + a, s + b) for s, (a, b) in zip(starts, spans)])
        bounds = torch.tensor([0] + torch.tensor([b - a for a, b in spans]).cumsum(0).tolist() + [tokens.numel()])
        padded = torch.cat([tokens, torch.zeros(3, dtype=torch.int64)])       # 3 padding tokens
        step = ops.PrefillStep.build(bounds, torch.cat([pages, torch.tensor([pad_page])]),
                                     torch.tensor([has_state, has_state, False]), padded.numel())
        o = ops.paged_gdn_prefill(*(x[n][padded] for n in names), ssm, step, use_qk_l2norm=True)
        return o[:tokens.numel()], tokens

    outputs = [prefill([(0, f) for f in first], False)]
    outputs.append(prefill([(f, n - tail) for f, n in zip(first, lengths)], True))
    step = ops.DecodeStep.build(torch.tensor([pad_page, pages[0], pages[1]]), pad_page)
    for t in range(tail):
        rows = torch.tensor([0] + [s + n - tail + t for s, n in zip(starts, lengths)])
        o = ops.paged_gdn_decode(*(x[n][rows] for n in names), ssm, step, use_qk_l2norm=True)
        outputs.append((o[1:], rows[1:]))
    tol = 1e-5 if dtype == F32 else 2e-2 * whole_o.float().abs().max().item()
    for o, tokens in outputs:
        torch.testing.assert_close(o.float(), whole_o[tokens].float(), rtol=0, atol=tol)
    torch.testing.assert_close(ssm[pages], whole_state, rtol=0, atol=1e-5 if dtype == F32 else tol)


def test_paged_ops_leave_inputs_unchanged():
    step = make_step(2, [5, 33], [True, False], seed=8)
    dec, pre = _steps(step, exact_plan=False)
    x = make_gdn_inputs([1] * dec.num_rows, 1, 2, 8, 8, with_state=False)
    names = ("q", "k", "v", "g", "beta")
    inputs = [x[n].clone() for n in names]
    _, ssm = make_caches(step, (1, 1), (2, 8, 8))
    ops.paged_gdn_decode(*inputs, ssm, dec, use_qk_l2norm=True)
    assert all(torch.equal(a, x[n]) for a, n in zip(inputs, names))


def test_paged_ops_on_strided_cache_views():
    # vLLM's mamba cache hands the layer views into one shared buffer per page: the conv and the
    # recurrent state of a page sit side by side, with bytes of other owners around them.
    hk, hv, dk, dv, channels, width = 1, 2, 8, 8, 6, 4
    step = make_step(NUM_DECODES, LENGTHS, HAS_STATE, seed=11)
    dec, pre = _steps(step, exact_plan=True)
    conv_size, ssm_size = channels * width, hv * dk * dv
    buffer = torch.randn(step.num_pages, 3 + conv_size + ssm_size + 5, generator=torch.Generator().manual_seed(12))
    conv = buffer[:, 3:3 + conv_size].view(step.num_pages, channels, width)
    ssm = buffer[:, 3 + conv_size:3 + conv_size + ssm_size].view(step.num_pages, hv, dk, dv)
    assert not conv.is_contiguous() and not ssm.is_contiguous()
    before, conv_before, ssm_before = buffer.clone(), conv.clone(), ssm.clone()
    gen = torch.Generator().manual_seed(13)
    weight = torch.randn(channels, width, generator=gen)
    x_dec, x_pre = torch.randn(dec.num_rows, channels, generator=gen), torch.randn(step.num_tokens, channels, generator=gen)
    rows = make_gdn_inputs([1] * dec.num_rows, hk, hv, dk, dv, with_state=False, seed=14)
    prompts = make_gdn_inputs(LENGTHS + [5], hk, hv, dk, dv, with_state=False, seed=15)
    names = ("q", "k", "v", "g", "beta")

    y_dec = ops.paged_conv1d_decode(x_dec, weight, conv, dec)
    y_pre = ops.paged_conv1d_prefill(x_pre, weight, conv, pre)
    o_dec = ops.paged_gdn_decode(*(rows[n] for n in names), ssm, dec, use_qk_l2norm=True)
    o_pre = ops.paged_gdn_prefill(*(prompts[n] for n in names), ssm, pre, use_qk_l2norm=True)

    real, live = sum(LENGTHS), step.decode_pages[step.decode_real]
    assert_matches(y_dec[step.decode_real], reference_conv_decode(x_dec, weight, conv_before, step)[0], F32, "conv decode")
    assert_matches(y_pre[:real], reference_conv_prefill(x_pre, weight, conv_before, step)[0], F32, "conv prefill")
    ref_o, ref_state = reference_gdn_decode(*(rows[n] for n in names), ssm_before, step, use_qk_l2norm=True)
    assert_matches(o_dec[step.decode_real], ref_o, F32, "gdn decode")
    assert_matches(ssm[live], ref_state, F32, "gdn decode states")
    ref_o, ref_state = reference_gdn_prefill(*(prompts[n] for n in names), ssm_before, step, use_qk_l2norm=True)
    assert_matches(o_pre[:real], ref_o, F32, "gdn prefill")
    assert_matches(ssm[step.prefill_pages[:len(LENGTHS)]], ref_state, F32, "gdn prefill states")
    outside = torch.ones_like(buffer, dtype=torch.bool)
    outside[:, 3:3 + conv_size + ssm_size] = False
    assert torch.equal(buffer[outside], before[outside]), "bytes outside the cache views changed"
    _assert_only_live_changed(before, buffer, step, "buffer")
