"""The GDN-2 kernel (packed varlen, channel-wise gates) in the NKI interpreter against the float64
GDN-2 recurrence, and its reduction to scalar GDN."""

import pytest
import torch

from vllm_gdn_neuron.kernels.gdn2 import GDN2_CHUNK, gdn2_chunked
from vllm_gdn_neuron.kernels.gdn2.gdn2_torch import gdn2_chunked_torch
from vllm_gdn_neuron.kernels.reference import gdn2_recurrence, gdn_recurrence

from .kernel_testing import DTYPES, assert_close, unit_rows

SCALE = 0.35


def _inputs(cu, hk, hv, dk, dv, dtype, g_min=-20.0, with_w=True, seed=0):
    t = cu[-1]
    gen = torch.Generator().manual_seed(seed)
    q = unit_rows((t, hk, dk), gen).to(dtype)
    k = unit_rows((t, hk, dk), gen).to(dtype)
    v = torch.randn(t, hv, dv, generator=gen).to(dtype)
    g = torch.rand(t, hv, dk, generator=gen) * g_min
    beta = torch.rand(t, hv, dk, generator=gen)
    w = torch.rand(t, hv, dv, generator=gen) if with_w else None
    state = torch.randn(len(cu) - 1, hv, dk, dv, generator=gen)
    return q, k, v, g, beta, w, state


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("cu, hk, hv, dk, dv", [
    ([0, 1, 70, 150], 1, 2, 16, 24),          # a 1-token sequence, lengths not a multiple of 64
    ([0, 64, 64, 100], 2, 2, 32, 16),         # an exact chunk, a zero-length sequence
    ([0, 40], 1, 4, 16, 16),                  # GQA 4
    ([0, 30], 1, 3, 128, 128),                # head dims at the limit
], ids=["varlen", "exact-and-empty", "gqa4", "d128"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
def test_gdn2_matches_reference(cu, hk, hv, dk, dv, dtype, with_state):
    q, k, v, g, beta, w, state = _inputs(cu, hk, hv, dk, dv, DTYPES[dtype])
    initial = state if with_state else None
    o, final = gdn2_chunked(q, k, v, g, beta, w, cu, SCALE, initial)
    ref_o, ref_state = gdn2_recurrence(q, k, v, g, beta, w, cu_seqlens=cu, initial_state=initial, scale=SCALE)
    assert o.dtype == q.dtype and final.dtype == torch.float32
    assert_close(o, ref_o, DTYPES[dtype], "gdn2 out")
    assert_close(final, ref_state, DTYPES[dtype], "gdn2 state")


def test_per_channel_decay_spanning_zero_to_minus_20_stays_finite():
    # some channels barely decay, others by e^-20 per token: the relative exponents never overflow
    cu = [0, GDN2_CHUNK + 9]
    q, k, v, g, beta, w, _ = _inputs(cu, 1, 1, 16, 16, torch.float32, with_w=False, seed=3)
    g[..., ::2] = -1e-3
    o, final = gdn2_chunked(q, k, v, g, beta, None, cu, SCALE)
    ref_o, ref_state = gdn2_recurrence(q, k, v, g, beta, None, cu_seqlens=cu, scale=SCALE)
    assert torch.isfinite(o).all() and torch.isfinite(final).all()
    assert_close(o, ref_o, torch.float32, "out")
    assert_close(final, ref_state, torch.float32, "state")


def test_channel_constant_gates_reduce_to_scalar_gdn():
    cu = [0, 5, 90]
    q, k, v, g, beta, _, state = _inputs(cu, 1, 2, 16, 16, torch.float32, seed=4)
    g_scalar, beta_scalar = g[..., 0], beta[..., 0]
    o, final = gdn2_chunked(q, k, v, g_scalar[..., None].expand_as(g).contiguous(),
                            beta_scalar[..., None].expand_as(beta).contiguous(),
                            beta_scalar[..., None].expand(-1, -1, 16).contiguous(), cu, SCALE, state)
    ref_o, ref_state = gdn_recurrence(q, k, v, g_scalar, beta_scalar, cu_seqlens=cu, initial_state=state, scale=SCALE)
    assert_close(o, ref_o, torch.float32, "as scalar GDN out")
    assert_close(final, ref_state, torch.float32, "as scalar GDN state")


def test_torch_mirror_matches_reference():
    cu = [0, 3, 80]
    q, k, v, g, beta, w, state = _inputs(cu, 1, 2, 16, 8, torch.float32, seed=5)
    o, final = gdn2_chunked_torch(q, k, v, g, beta, w, cu, SCALE, state)
    ref_o, ref_state = gdn2_recurrence(q, k, v, g, beta, w, cu_seqlens=cu, initial_state=state, scale=SCALE)
    assert_close(o, ref_o, torch.float32, "mirror out")
    assert_close(final, ref_state, torch.float32, "mirror state")


BAD = {
    "cu_seqlens end": (dict(cu_seqlens=[0, 5]), "cu_seqlens must run from 0 to T = 10"),
    "cu_seqlens decreasing": (dict(cu_seqlens=[0, 6, 4, 10]), "without decreasing"),
    "g shape": (dict(g=torch.zeros(10, 2)), "g must have shape"),
    "beta dtype": (dict(beta=torch.zeros(10, 2, 16, dtype=torch.float64)), "beta must have dtype float32"),
    "w shape": (dict(w=torch.zeros(10, 2, 16)), "w must have shape"),
    "k dtype": (dict(k=torch.zeros(10, 1, 16, dtype=torch.bfloat16)), "k must have the dtype of q"),
    "Hv % Hk": (dict(q=torch.zeros(10, 2, 16), k=torch.zeros(10, 2, 16), v=torch.zeros(10, 3, 8),
                     g=torch.zeros(10, 3, 16), beta=torch.zeros(10, 3, 16), w=None), "multiple of Hk"),
    "state shape": (dict(initial_state=torch.zeros(2, 2, 8, 8)), "initial_state must have shape"),
    "Dk > 128": (dict(q=torch.zeros(10, 1, 130), k=torch.zeros(10, 1, 130), g=torch.zeros(10, 2, 130),
                      beta=torch.zeros(10, 2, 130)), "Dk"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_arguments_raise(case):
    q, k, v, g, beta, w, state = _inputs([0, 4, 10], 1, 2, 16, 8, torch.float32)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, w=w, cu_seqlens=[0, 4, 10], initial_state=state)
    overrides, message = BAD[case]
    args.update(overrides)
    with pytest.raises(ValueError, match=message):
        gdn2_chunked(**args)
