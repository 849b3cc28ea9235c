"""gdn2_prefill (torch backend): channel-wise gates against the float64 GDN-2 reference."""

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.ops.gdn2 import gdn2_prefill
from vllm_gdn_neuron.kernels.reference import gdn2_recurrence

from .ops_testing import assert_matches, make_gdn_inputs

BF16, F32 = torch.bfloat16, torch.float32

# (lengths, Hk, Hv, Dk, Dv, dtype, min_g, correlated, with_state, with_w)
CASES = {
    "one-token": ([1], 1, 1, 16, 16, F32, -1.0, False, True, True),
    "chunk-plus-one-gqa2": ([65], 1, 2, 16, 24, F32, -1.0, False, True, True),
    "gqa4-mixed-lengths": ([1, 130, 17], 1, 4, 32, 8, F32, -1.0, False, True, True),
    "gqa3-w-none": ([40, 3], 1, 3, 16, 16, F32, -1.0, False, False, False),
    "strong-decay": ([150], 2, 2, 16, 16, F32, -20.0, False, True, True),
    "correlated-keys": ([100], 1, 1, 32, 16, F32, -0.05, True, True, True),
    "bf16": ([70], 2, 4, 16, 16, BF16, -1.0, False, True, True),
    "many-sequences": ([1 + (5 * i) % 11 for i in range(24)], 1, 1, 16, 8, F32, -2.0, False, True, True),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_gdn2_prefill_matches_reference(case):
    lengths, hk, hv, dk, dv, dtype, min_g, correlated, with_state, with_w = case
    x = make_gdn_inputs(lengths, hk, hv, dk, dv, dtype=dtype, min_g=min_g, correlated=correlated,
                        with_state=with_state, channel_gates=True)
    w = x["w"] if with_w else None
    o, state = gdn2_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], w, x["cu_seqlens"],
                                initial_state=x["initial_state"], use_qk_l2norm=True, backend="torch")
    o_ref, state_ref = gdn2_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], w, x["cu_seqlens"],
                                       initial_state=x["initial_state"], use_qk_l2norm=True)
    assert o.dtype == dtype and state.dtype == F32
    assert_matches(o, o_ref, dtype, "o")
    assert_matches(state, state_ref, dtype, "final_state")


def test_gdn2_with_decay_spread_over_channels():
    # Some channels forget almost at once (g = -20 per token) while others keep everything (g = 0).
    x = make_gdn_inputs([140], 1, 2, 16, 16, channel_gates=True)
    x["g"][..., ::2] = -20.0
    x["g"][..., 1::2] = 0.0
    o, state = gdn2_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["w"], x["cu_seqlens"],
                                initial_state=x["initial_state"], use_qk_l2norm=True)
    o_ref, state_ref = gdn2_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], x["w"], x["cu_seqlens"],
                                       initial_state=x["initial_state"], use_qk_l2norm=True)
    assert torch.isfinite(o).all() and torch.isfinite(state).all()
    assert_matches(o, o_ref, F32, "o")
    assert_matches(state, state_ref, F32, "final_state")


def test_gdn2_with_channel_constant_gates_equals_gdn():
    x = make_gdn_inputs([1, 100, 30], 2, 4, 16, 32)
    t, hv, dk, dv = 131, 4, 16, 32
    o, state = ops.gdn_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"],
                               initial_state=x["initial_state"], use_qk_l2norm=True)
    o2, state2 = gdn2_prefill(x["q"], x["k"], x["v"], x["g"][..., None].expand(t, hv, dk),
                                  x["beta"][..., None].expand(t, hv, dk), x["beta"][..., None].expand(t, hv, dv),
                                  x["cu_seqlens"], initial_state=x["initial_state"], use_qk_l2norm=True)
    torch.testing.assert_close(o2, o, rtol=0, atol=1e-5)
    torch.testing.assert_close(state2, state, rtol=0, atol=1e-5)


def test_gdn2_vk_state_layout_is_the_transpose_for_initial_and_final_state():
    x = make_gdn_inputs([70], 1, 2, 16, 8, channel_gates=True)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], x["w"], x["cu_seqlens"])
    o_kv, state_kv = gdn2_prefill(*args, initial_state=x["initial_state"])
    o_vk, state_vk = gdn2_prefill(*args, initial_state=x["initial_state"].transpose(-1, -2).contiguous(),
                                      state_layout="vk")
    assert state_vk.shape == (1, 2, 8, 16)
    torch.testing.assert_close(o_vk, o_kv, rtol=0, atol=0)
    torch.testing.assert_close(state_vk, state_kv.transpose(-1, -2), rtol=0, atol=0)


def test_gdn2_prefill_in_two_pieces_equals_whole():
    x = make_gdn_inputs([130], 1, 1, 16, 16, channel_gates=True)
    names = ("q", "k", "v", "g", "beta", "w")
    whole_o, whole_state = gdn2_prefill(*(x[n] for n in names), x["cu_seqlens"], initial_state=x["initial_state"],
                                            use_qk_l2norm=True)
    o1, s1 = gdn2_prefill(*(x[n][:50] for n in names), torch.tensor([0, 50]), initial_state=x["initial_state"],
                              use_qk_l2norm=True)
    o2, s2 = gdn2_prefill(*(x[n][50:] for n in names), torch.tensor([0, 80]), initial_state=s1, use_qk_l2norm=True)
    torch.testing.assert_close(torch.cat([o1, o2]), whole_o, rtol=0, atol=1e-5)
    torch.testing.assert_close(s2, whole_state, rtol=0, atol=1e-5)
