"""The ``nki`` backend (kernels run in the NKI interpreter) through the public ops, against the
float64 references; and how it is selected."""

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.kernels.reference import causal_conv1d, causal_conv1d_step, gdn2_recurrence, gdn_recurrence
from vllm_gdn_neuron.ops import dispatch
from vllm_gdn_neuron.ops.backends import nki as nki_backend
from vllm_gdn_neuron.ops.gdn2 import gdn2_prefill

from .ops_testing import assert_matches, make_gdn_inputs

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("lengths, hk, hv, dk, dv", [
    ([1, 130, 0, 37], 1, 2, 16, 24),   # 1-token, over one chunk, empty, short
    ([200], 2, 8, 32, 16),             # GQA 4
    ([5, 3], 3, 3, 16, 16),
], ids=["varlen-gqa2", "gqa4", "short"])
def test_gdn_prefill_matches_reference(lengths, hk, hv, dk, dv, dtype):
    inputs = make_gdn_inputs(lengths, hk, hv, dk, dv, dtype=DTYPES[dtype], min_g=-20.0)
    o, final = ops.gdn_prefill(**inputs, use_qk_l2norm=True, backend="nki")
    ref_o, ref_state = gdn_recurrence(**inputs, use_qk_l2norm=True)
    assert o.dtype == inputs["q"].dtype and final.dtype == torch.float32
    assert_matches(o, ref_o, DTYPES[dtype], "o")
    assert_matches(final, ref_state, DTYPES[dtype], "final state")


def test_gdn_prefill_leaves_the_initial_state_untouched():
    inputs = make_gdn_inputs([20, 3], 1, 1, 16, 16)
    before = inputs["initial_state"].clone()
    _, final = ops.gdn_prefill(**inputs, use_qk_l2norm=True, backend="nki")
    assert torch.equal(inputs["initial_state"], before) and final.data_ptr() != before.data_ptr()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("contiguous", [True, False], ids=["cache", "cache-view"])
def test_gdn_decode_updates_the_slots_in_place(dtype, contiguous):
    inputs = make_gdn_inputs([1, 1, 1], 1, 2, 16, 16, dtype=DTYPES[dtype], with_state=False, min_g=-5.0)
    gen = torch.Generator().manual_seed(1)
    storage = torch.randn(5, 2, 2, 16, 16, generator=gen)
    state = storage[:, 0] if not contiguous else storage[:, 0].contiguous()
    before = state.clone()
    slots = torch.tensor([3, 0, -1])  # the PAD slot row gets zeros and touches nothing
    o = ops.gdn_decode(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], state, slots,
                       use_qk_l2norm=True, backend="nki")
    live = [3, 0]
    ref_o, ref_state = gdn_recurrence(inputs["q"][:2], inputs["k"][:2], inputs["v"][:2], inputs["g"][:2],
                                      inputs["beta"][:2], cu_seqlens=[0, 1, 2], initial_state=before[live],
                                      use_qk_l2norm=True)
    assert_matches(o[:2], ref_o, DTYPES[dtype], "decode o")
    assert torch.count_nonzero(o[2]) == 0
    assert_matches(state[live], ref_state, torch.float32, "slot states")
    assert torch.equal(state[[1, 2, 4]], before[[1, 2, 4]])


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_gdn2_prefill_matches_reference(layout):
    inputs = make_gdn_inputs([1, 70, 9], 1, 2, 16, 8, min_g=-20.0, channel_gates=True)
    initial = inputs["initial_state"]
    given = initial if layout == "kv" else initial.transpose(-1, -2).contiguous()
    o, final = gdn2_prefill(**{**inputs, "initial_state": given}, use_qk_l2norm=True, state_layout=layout,
                            backend="nki")
    ref_o, ref_state = gdn2_recurrence(**inputs, use_qk_l2norm=True)
    assert_matches(o, ref_o, torch.float32, "gdn2 o")
    assert_matches(final if layout == "kv" else final.transpose(-1, -2), ref_state, torch.float32, "gdn2 state")


@pytest.mark.parametrize("with_state", [False, True])
def test_conv1d_prefill_matches_reference(with_state):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(12, 200, generator=gen)
    weight = torch.randn(200, 4, generator=gen)
    cu = torch.tensor([0, 2, 2, 12])
    initial = torch.randn(3, 200, 4, generator=gen) if with_state else None
    y, final = ops.conv1d_prefill(x, weight, cu, initial_state=initial, backend="nki")
    ref_y, ref_state = causal_conv1d(x, weight, cu_seqlens=cu, initial_state=initial)
    assert_matches(y, ref_y, torch.float32, "conv y")
    assert torch.equal(final.double(), ref_state)


def test_conv1d_decode_updates_the_slots_in_place():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 130, generator=gen)
    weight = torch.randn(130, 4, generator=gen)
    state = torch.randn(4, 130, 4, generator=gen)
    before = state.clone()
    y = ops.conv1d_decode(x, weight, state, torch.tensor([2, 0]), backend="nki")
    ref_y, ref_state = causal_conv1d_step(x, weight, before[[2, 0]])
    assert_matches(y, ref_y, torch.float32, "conv decode y")
    assert torch.equal(state[[2, 0]].double(), ref_state)
    assert torch.equal(state[[1, 3]], before[[1, 3]])


def test_head_dims_beyond_the_kernels_raise_a_clear_error():
    inputs = make_gdn_inputs([4], 1, 1, 160, 16)
    with pytest.raises(ValueError, match="Dk .* must be <= 128"):
        ops.gdn_prefill(**inputs, backend="nki")


def test_selection_env_override_and_auto(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv(dispatch.ENV_VAR, "nki")
    assert dispatch.select_backend("auto", "gdn_prefill", cpu) is nki_backend
    monkeypatch.delenv(dispatch.ENV_VAR)
    dispatch.env_override.cache_clear()  # read once per process: a new process without the variable
    # the interpreter is not a Neuron device: auto keeps torch here
    assert nki_backend.is_available() is False
    assert dispatch.select_backend("auto", "gdn_prefill", cpu) is not nki_backend
    assert dispatch.select_backend("nki", "gdn_decode", cpu) is nki_backend
