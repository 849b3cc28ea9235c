"""conv1d prefill / decode kernels in the NKI interpreter against the float64 reference."""

import pytest
import torch

from vllm_gdn_neuron.kernels.conv1d import TIME_TILE, gdn_conv1d_decode, gdn_conv1d_prefill
from vllm_gdn_neuron.kernels.conv1d_torch import gdn_conv1d_decode_torch, gdn_conv1d_prefill_torch
from vllm_gdn_neuron.kernels.reference import causal_conv1d, causal_conv1d_step

from .kernel_testing import DTYPES, assert_close


def _inputs(b, c, t, k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mixed = torch.randn(b, c, t, generator=gen).to(dtype)
    weight = torch.randn(c, k, generator=gen) * 0.5
    state = torch.randn(b, c, k, generator=gen)
    return mixed, weight, state


def _reference(mixed, weight, state, activation):
    outs, states = [], []
    for b in range(mixed.shape[0]):
        y, st = causal_conv1d(mixed[b].T, weight, initial_state=None if state is None else state[b:b + 1],
                              activation=activation)
        outs.append(y.T)
        states.append(st[0])
    return torch.stack(outs), torch.stack(states)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("with_state", [False, True], ids=["new", "continued"])
@pytest.mark.parametrize("b, c, t, k", [(2, 200, 37, 4), (1, 128, 2, 4), (1, 64, 1, 4), (1, 16, 9, 1)],
                         ids=["C200-T37", "T<K", "T1", "K1"])
def test_prefill_matches_reference(b, c, t, k, dtype, with_state):
    mixed, weight, state = _inputs(b, c, t, k, DTYPES[dtype])
    state = state if with_state else None
    out, new_state = gdn_conv1d_prefill(mixed, weight, state)
    ref_out, ref_state = _reference(mixed, weight, state, "silu")
    assert out.dtype == mixed.dtype and new_state.dtype == torch.float32
    assert_close(out, ref_out, DTYPES[dtype], "conv out")
    assert torch.equal(new_state.double(), ref_state)  # raw inputs, copied exactly


def test_prefill_across_time_tiles_without_activation():
    mixed, weight, state = _inputs(1, 8, TIME_TILE + 5, 4, torch.float32, seed=1)
    out, new_state = gdn_conv1d_prefill(mixed, weight, state, activation=None)
    ref_out, ref_state = _reference(mixed, weight, state, None)
    assert_close(out, ref_out, torch.float32, "conv out")
    assert torch.equal(new_state.double(), ref_state)


def test_prefill_in_two_pieces_equals_whole():
    mixed, weight, _ = _inputs(1, 130, 20, 4, torch.float32, seed=2)
    whole, whole_state = gdn_conv1d_prefill(mixed, weight)
    first, mid_state = gdn_conv1d_prefill(mixed[..., :7].contiguous(), weight)
    second, end_state = gdn_conv1d_prefill(mixed[..., 7:].contiguous(), weight, mid_state)
    assert_close(torch.cat([first, second], -1), whole, torch.float32, "two pieces")
    assert torch.equal(end_state, whole_state)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_decode_matches_reference_step(dtype):
    mixed, weight, state = _inputs(3, 200, 1, 4, DTYPES[dtype], seed=3)
    out, new_state = gdn_conv1d_decode(mixed, state, weight)
    ref_out, ref_state = causal_conv1d_step(mixed[..., 0], weight, state)
    assert_close(out[..., 0], ref_out, DTYPES[dtype], "decode out")
    assert torch.equal(new_state.double(), ref_state)


def test_torch_mirrors_match_the_kernels():
    mixed, weight, state = _inputs(2, 140, 6, 4, torch.float32, seed=4)
    for kernel_result, mirror_result in (
        (gdn_conv1d_prefill(mixed, weight, state), gdn_conv1d_prefill_torch(mixed, weight, state)),
        (gdn_conv1d_decode(mixed[..., :1].contiguous(), state, weight),
         gdn_conv1d_decode_torch(mixed[..., :1], state, weight)),
    ):
        for a, m in zip(kernel_result, mirror_result):
            assert_close(a, m, torch.float32, "mirror")


BAD = {
    "mixed rank": (lambda m, w, s: gdn_conv1d_prefill(m[0], w), "mixed must have rank 3"),
    "mixed dtype": (lambda m, w, s: gdn_conv1d_prefill(m.double(), w), "mixed must have dtype"),
    "weight channels": (lambda m, w, s: gdn_conv1d_prefill(m, w[:5]), "conv_weight must have C = 8"),
    "weight rank": (lambda m, w, s: gdn_conv1d_prefill(m, w[:, 0]), "conv_weight must have rank 2"),
    "state shape": (lambda m, w, s: gdn_conv1d_prefill(m, w, s[..., :3]), "conv_state must have shape"),
    "activation": (lambda m, w, s: gdn_conv1d_prefill(m, w, activation="gelu"), "activation"),
    "decode x tokens": (lambda m, w, s: gdn_conv1d_decode(m, s, w), r"one token per sequence"),
    "decode state shape": (lambda m, w, s: gdn_conv1d_decode(m[..., :1], s[:1], w), "conv_state must have shape"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_arguments_raise(case):
    call, message = BAD[case]
    mixed, weight, state = _inputs(2, 8, 3, 4, torch.float32)
    with pytest.raises(ValueError, match=message):
        call(mixed, weight, state)
