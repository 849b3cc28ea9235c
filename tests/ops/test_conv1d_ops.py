"""conv1d_prefill / conv1d_decode (torch backend) against the float64 conv reference."""

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.kernels.reference import causal_conv1d, causal_conv1d_step

from .ops_testing import assert_matches

BF16, F32 = torch.bfloat16, torch.float32


def _inputs(lengths, channels, width, dtype, state_dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    return (torch.randn(tokens, channels, generator=gen).to(dtype),
            (0.5 * torch.randn(channels, width, generator=gen)).to(dtype),
            torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32),
            None if state_dtype is None else torch.randn(len(lengths), channels, width, generator=gen).to(state_dtype))


@pytest.mark.parametrize("lengths, channels, width, dtype, state_dtype, activation", [
    ([1], 8, 4, F32, F32, "silu"),
    ([2, 1, 3, 70], 12, 4, F32, F32, "silu"),       # sequences shorter than K keep the incoming tail
    ([5, 9], 6, 3, F32, None, None),
    ([0, 4, 1], 8, 4, F32, F32, "silu"),            # an empty sequence passes its state through
    ([33, 2], 16, 4, BF16, BF16, "silu"),           # vLLM's bf16 conv cache
    ([33, 2], 16, 4, BF16, F32, "silu"),
    ([1 + i % 6 for i in range(50)], 4, 2, F32, F32, "silu"),
    ([10], 4, 1, F32, F32, None),
])
def test_conv1d_prefill_matches_reference(lengths, channels, width, dtype, state_dtype, activation):
    x, weight, cu, h0 = _inputs(lengths, channels, width, dtype, state_dtype)
    y, state = ops.conv1d_prefill(x, weight, cu, initial_state=h0, activation=activation, backend="torch")
    y_ref, state_ref = causal_conv1d(x, weight, cu, h0, activation)
    assert y.dtype == dtype and state.dtype == F32
    assert_matches(y, y_ref, dtype, "y")
    torch.testing.assert_close(state.double(), state_ref, rtol=0, atol=0)  # raw inputs, copied exactly


def test_conv1d_prefill_accepts_non_contiguous_input():
    x, weight, cu, h0 = _inputs([7, 9], 10, 4, F32, F32)
    wide = torch.cat([x, torch.randn(16, 5)], dim=1)[:, :10]
    y, state = ops.conv1d_prefill(wide, weight.T.contiguous().T, cu, initial_state=h0)
    y_ref, state_ref = causal_conv1d(x, weight, cu, h0)
    assert_matches(y, y_ref, F32, "y")
    torch.testing.assert_close(state.double(), state_ref, rtol=0, atol=0)


@pytest.mark.parametrize("dtype, state_dtype", [(F32, F32), (BF16, BF16), (BF16, F32)])
def test_conv1d_decode_matches_reference_in_place(dtype, state_dtype):
    x, weight, _, _ = _inputs([1] * 4, 8, 4, dtype, None)
    cache = torch.randn(6, 8, 4).to(state_dtype)
    before = cache.clone()
    indices = torch.tensor([5, 1, ops.PAD_SLOT_ID, 2], dtype=torch.int32)
    y = ops.conv1d_decode(x, weight, cache, indices)
    real = [0, 1, 3]
    y_ref, state_ref = causal_conv1d_step(x[real], weight, before[[5, 1, 2]])
    assert y.dtype == dtype
    assert_matches(y[real], y_ref, dtype, "y")
    assert torch.equal(y[2], torch.zeros_like(y[2]))
    torch.testing.assert_close(cache[[5, 1, 2]].double(), state_ref, rtol=0, atol=0)
    assert torch.equal(cache[[0, 3, 4]], before[[0, 3, 4]])


def test_conv1d_prefill_in_two_pieces_and_decode_equal_whole():
    x, weight, _, h0 = _inputs([12], 8, 4, F32, F32)
    whole_y, whole_state = ops.conv1d_prefill(x, weight, torch.tensor([0, 12]), initial_state=h0)
    y1, s1 = ops.conv1d_prefill(x[:2], weight, torch.tensor([0, 2]), initial_state=h0)   # shorter than K
    y2, s2 = ops.conv1d_prefill(x[2:9], weight, torch.tensor([0, 7]), initial_state=s1)
    cache = s2.clone()
    decoded = [ops.conv1d_decode(x[t:t + 1], weight, cache, torch.tensor([0])) for t in range(9, 12)]
    torch.testing.assert_close(torch.cat([y1, y2] + decoded), whole_y, rtol=0, atol=1e-6)
    torch.testing.assert_close(cache, whole_state, rtol=0, atol=0)
