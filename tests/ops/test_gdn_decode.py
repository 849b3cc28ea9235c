"""gdn_decode (torch backend): one recurrent step per sequence on cache slots, in place."""

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.kernels.reference import gdn_recurrence

from .ops_testing import assert_matches, make_gdn_inputs

BF16, F32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("hk, hv, dk, dv, dtype, min_g", [
    (1, 1, 16, 16, F32, -1.0),
    (2, 4, 16, 32, F32, -20.0),
    (1, 3, 32, 8, F32, -1.0),
    (2, 8, 16, 16, BF16, -1.0),
])
def test_gdn_decode_matches_reference_and_touches_only_its_slots(hk, hv, dk, dv, dtype, min_g, index_dtype):
    rows, slots = 5, 9
    x = make_gdn_inputs([1] * rows, hk, hv, dk, dv, dtype=dtype, min_g=min_g)
    cache = torch.randn(slots, hv, dk, dv)
    indices = torch.tensor([7, 0, 3, 8, 2], dtype=index_dtype)
    before = cache.clone()
    o = ops.gdn_decode(x["q"], x["k"], x["v"], x["g"], x["beta"], cache, indices, use_qk_l2norm=True)
    o_ref, state_ref = gdn_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"],
                                      initial_state=before[indices.long()], use_qk_l2norm=True)
    assert o.dtype == dtype
    assert_matches(o, o_ref, dtype, "o")
    assert_matches(cache[indices.long()], state_ref, dtype, "state rows")
    untouched = [s for s in range(slots) if s not in indices.tolist()]
    assert torch.equal(cache[untouched], before[untouched])


def test_gdn_decode_of_256_sequences():
    x = make_gdn_inputs([1] * 256, 2, 4, 8, 8, min_g=-5.0)
    cache = torch.randn(300, 4, 8, 8)
    indices = torch.randperm(300, generator=torch.Generator().manual_seed(0))[:256]
    before = cache.clone()
    o = ops.gdn_decode(x["q"], x["k"], x["v"], x["g"], x["beta"], cache, indices, use_qk_l2norm=True)
    o_ref, state_ref = gdn_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"],
                                      initial_state=before[indices], use_qk_l2norm=True)
    assert_matches(o, o_ref, F32, "o")
    assert_matches(cache[indices], state_ref, F32, "state rows")


def test_gdn_decode_padded_rows_give_zeros_and_write_nothing():
    x = make_gdn_inputs([1, 1, 1], 1, 2, 16, 16)
    cache = torch.randn(4, 2, 16, 16)
    before = cache.clone()
    indices = torch.tensor([ops.PAD_SLOT_ID, 2, ops.PAD_SLOT_ID], dtype=torch.int32)
    o = ops.gdn_decode(x["q"], x["k"], x["v"], x["g"], x["beta"], cache, indices, use_qk_l2norm=True)
    o_ref, state_ref = gdn_recurrence(x["q"][1:2], x["k"][1:2], x["v"][1:2], x["g"][1:2], x["beta"][1:2],
                                      initial_state=before[2:3], use_qk_l2norm=True)
    assert torch.equal(o[[0, 2]], torch.zeros_like(o[[0, 2]]))
    assert_matches(o[1:2], o_ref, F32, "o")
    assert_matches(cache[2:3], state_ref, F32, "state")
    assert torch.equal(cache[[0, 1, 3]], before[[0, 1, 3]])


@pytest.mark.parametrize("hk, hv, dtype", [(2, 4, F32), (1, 1, BF16)])
def test_prefill_then_decode_steps_equals_prefill_of_the_whole(hk, hv, dtype):
    # Two sequences (lengths 67 and 5) prefilled except their last 3 tokens, then decoded token by token.
    lengths, tail = [67, 5], 3
    x = make_gdn_inputs(lengths, hk, hv, 16, 16, dtype=dtype)
    names = ("q", "k", "v", "g", "beta")
    whole_o, whole_state = ops.gdn_prefill(*(x[n] for n in names), x["cu_seqlens"],
                                           initial_state=x["initial_state"], use_qk_l2norm=True)
    starts = [0, lengths[0]]
    head = torch.cat([torch.arange(s, s + n - tail) for s, n in zip(starts, lengths)])
    o_head, state = ops.gdn_prefill(*(x[n][head] for n in names), torch.tensor([0, 64, 66]),
                                    initial_state=x["initial_state"], use_qk_l2norm=True)
    cache = torch.zeros(3, hv, 16, 16)
    slots = torch.tensor([2, 0])
    cache[slots] = state
    decoded = []
    for step in range(tail):
        rows = torch.tensor([s + n - tail + step for s, n in zip(starts, lengths)])
        decoded.append(ops.gdn_decode(*(x[n][rows] for n in names), cache, slots, use_qk_l2norm=True))
    tol = 1e-5 if dtype == F32 else 2e-2 * whole_o.float().abs().max().item()
    torch.testing.assert_close(o_head.float(), whole_o[head].float(), rtol=0, atol=tol)
    for step in range(tail):
        rows = [s + n - tail + step for s, n in zip(starts, lengths)]
        torch.testing.assert_close(decoded[step].float(), whole_o[rows].float(), rtol=0, atol=tol)
    torch.testing.assert_close(cache[slots], whole_state, rtol=0, atol=1e-5 if dtype == F32 else tol)
