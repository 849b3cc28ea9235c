"""gdn_prefill (torch backend) against the float64 token-by-token reference, across the matrix."""

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.kernels.reference import gdn_recurrence

from .ops_testing import assert_matches, make_gdn_inputs

BF16, F32 = torch.bfloat16, torch.float32

# (lengths, Hk, Hv, Dk, Dv, dtype, min_g, correlated, with_state, use_qk_l2norm)
CASES = {
    "one-token": ([1], 1, 1, 16, 16, F32, -1.0, False, True, True),
    "one-chunk-exact": ([64], 2, 2, 16, 16, F32, -1.0, False, True, True),
    "chunk-plus-one": ([65], 1, 2, 16, 24, F32, -1.0, False, True, True),
    "gqa3-dk-ne-dv": ([5, 130], 1, 3, 32, 8, F32, -1.0, False, True, True),
    "gqa4-mixed-lengths": ([1, 130, 3, 64], 2, 8, 16, 32, F32, -1.0, False, True, True),
    "strong-decay": ([200], 2, 4, 16, 16, F32, -20.0, False, True, True),
    "correlated-keys": ([150], 1, 2, 32, 16, F32, -0.05, True, True, True),
    "zero-state": ([70, 1], 2, 2, 16, 16, F32, -1.0, False, False, True),
    "no-l2norm": ([100], 1, 1, 16, 16, F32, -1.0, False, True, False),
    "bf16": ([1, 129], 2, 4, 32, 16, BF16, -1.0, False, True, True),
    "bf16-strong-decay-correlated": ([90], 1, 1, 16, 16, BF16, -20.0, True, True, True),
    "many-sequences": ([1 + (7 * i) % 23 for i in range(40)], 1, 2, 16, 8, F32, -2.0, False, True, True),
    "empty-sequence-passes-state-through": ([3, 0, 66], 1, 1, 16, 16, F32, -1.0, False, True, True),
    "large-heads": ([70], 1, 1, 128, 256, F32, -1.0, False, True, True),
    "dk-256": ([66], 1, 2, 256, 32, BF16, -1.0, False, True, True),
    "256-sequences": ([1 + i % 3 for i in range(256)], 1, 2, 8, 8, F32, -3.0, False, True, True),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_gdn_prefill_matches_reference(case):
    lengths, hk, hv, dk, dv, dtype, min_g, correlated, with_state, l2 = case
    x = make_gdn_inputs(lengths, hk, hv, dk, dv, dtype=dtype, min_g=min_g, correlated=correlated,
                        with_state=with_state)
    if not l2:  # keep unnormalised keys at unit scale so the recurrence stays bounded
        x["k"] = (x["k"].float() * dk ** -0.5).to(dtype)
    o, state = ops.gdn_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"],
                               initial_state=x["initial_state"], use_qk_l2norm=l2, backend="torch")
    o_ref, state_ref = gdn_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"],
                                      initial_state=x["initial_state"], use_qk_l2norm=l2)
    assert o.dtype == dtype and state.dtype == F32
    assert_matches(o, o_ref, dtype, "o")
    assert_matches(state, state_ref, dtype, "final_state")


def test_gdn_prefill_explicit_scale_and_non_contiguous_views():
    x = make_gdn_inputs([33, 40], 2, 4, 16, 16)
    qkv = torch.cat([x["q"].flatten(1), x["k"].flatten(1), x["v"].flatten(1)], dim=1)  # a fused projection
    q, k, v = (t.view(73, -1, 16) for t in qkv.split([32, 32, 64], dim=1))
    assert not q.is_contiguous()
    o, state = ops.gdn_prefill(q, k, v, x["g"], x["beta"], x["cu_seqlens"].long(), initial_state=x["initial_state"],
                               scale=0.3, use_qk_l2norm=True)
    o_ref, state_ref = gdn_recurrence(q, k, v, x["g"], x["beta"], x["cu_seqlens"], x["initial_state"], scale=0.3,
                                      use_qk_l2norm=True)
    assert_matches(o, o_ref, F32, "o")
    assert_matches(state, state_ref, F32, "final_state")


def test_gdn_prefill_does_not_modify_its_inputs():
    x = make_gdn_inputs([70], 1, 1, 16, 16)
    before = {name: t.clone() for name, t in x.items()}
    _, state = ops.gdn_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"],
                               initial_state=x["initial_state"])
    for name, t in x.items():
        assert torch.equal(t, before[name]), name
    assert state.data_ptr() != x["initial_state"].data_ptr()


def test_gdn_prefill_in_two_pieces_equals_whole():
    x = make_gdn_inputs([150], 2, 4, 16, 16)
    whole_o, whole_state = ops.gdn_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"],
                                           initial_state=x["initial_state"], use_qk_l2norm=True)
    split = 70
    first = [t[:split] for t in (x["q"], x["k"], x["v"], x["g"], x["beta"])]
    second = [t[split:] for t in (x["q"], x["k"], x["v"], x["g"], x["beta"])]
    o1, s1 = ops.gdn_prefill(*first, torch.tensor([0, split]), initial_state=x["initial_state"], use_qk_l2norm=True)
    o2, s2 = ops.gdn_prefill(*second, torch.tensor([0, 150 - split]), initial_state=s1, use_qk_l2norm=True)
    torch.testing.assert_close(torch.cat([o1, o2]), whole_o, rtol=0, atol=1e-5)
    torch.testing.assert_close(s2, whole_state, rtol=0, atol=1e-5)


def test_gdn_prefill_matches_hf_chunked_implementation():
    modeling = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    x = make_gdn_inputs([100], 2, 2, 32, 32)
    o, state = ops.gdn_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"],
                               initial_state=x["initial_state"], use_qk_l2norm=True)
    o_hf, state_hf = modeling.torch_chunk_gated_delta_rule(
        x["q"][None], x["k"][None], x["v"][None], x["g"][None], x["beta"][None],
        initial_state=x["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(o, o_hf[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(state, state_hf, rtol=1e-4, atol=1e-5)
