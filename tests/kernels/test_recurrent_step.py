"""The batched recurrent decode step in the NKI interpreter against the float64 recurrence."""

import pytest
import torch

from vllm_gdn_neuron.kernels.gdn_cte import gdn_cte
from vllm_gdn_neuron.kernels.recurrent_step import gdn_recurrent_step
from vllm_gdn_neuron.kernels.recurrent_step_torch import gdn_recurrent_step_torch
from vllm_gdn_neuron.kernels.reference import gdn_recurrence

from .kernel_testing import DTYPES, assert_close, gdn_inputs, reference_cte, unit_rows

SCALE = 0.4


def _step_inputs(n, hk, hv, dk, dv, dtype, num_slots, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = unit_rows((n, hk, dk), gen).to(dtype)
    k = unit_rows((n, hk, dk), gen).to(dtype)
    v = torch.randn(n, hv, dv, generator=gen).to(dtype)
    g = torch.rand(n, hv, generator=gen) * -20.0
    beta = torch.rand(n, hv, generator=gen)
    state = torch.randn(num_slots, hv, dk, dv, generator=gen)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("n, hk, hv, dk, dv", [(3, 1, 1, 16, 16), (2, 1, 4, 32, 16), (4, 2, 6, 16, 48),
                                               (1, 1, 1, 128, 128)])
def test_step_matches_reference_on_slots_in_place(n, hk, hv, dk, dv, dtype):
    q, k, v, g, beta, state = _step_inputs(n, hk, hv, dk, dv, DTYPES[dtype], num_slots=n + 3)
    slots = list(range(n + 2, 1, -1))[:n]  # out of order, skipping rows 0 and 1
    before = state.clone()
    pointer = state.data_ptr()
    out = gdn_recurrent_step(q, k, v, g, beta, state, slots, SCALE)
    ref_out, ref_state = gdn_recurrence(q, k, v, g, beta, cu_seqlens=list(range(n + 1)),
                                        initial_state=before[slots], scale=SCALE)
    assert out.shape == (n, hv, dv) and out.dtype == q.dtype and state.data_ptr() == pointer
    assert_close(out, ref_out, DTYPES[dtype], "decode out")
    assert_close(state[slots], ref_state, torch.float32, "slot states")
    untouched = [i for i in range(state.shape[0]) if i not in slots]
    assert torch.equal(state[untouched], before[untouched])


def test_prefill_then_steps_equals_reference_of_the_whole():
    s, steps = 128, 3
    query, key, value, g_log, beta = gdn_inputs(1, 1, 2, s + steps, 16, 16, torch.float32, seed=2)
    _, state = gdn_cte(query[:, :, :s], key[:, :, :s], value[:, :, :s], g_log[:, :, :s], beta[:, :, :s],
                       scale=SCALE)
    cache = torch.zeros(3, 2, 16, 16)
    cache[1] = state[0]
    outs = []
    for t in range(s, s + steps):
        outs.append(gdn_recurrent_step(query[:, :, t], key[:, :, t], value[:, :, t], g_log[:, :, t],
                                       beta[:, :, t], cache, [1], SCALE))
    ref_out, ref_state = reference_cte(query, key, value, g_log, beta, SCALE)
    assert_close(torch.stack(outs, 2), ref_out[:, :, s:], torch.float32, "decoded outputs")
    assert_close(cache[1:2], ref_state, torch.float32, "state after the steps")


def test_torch_mirror_matches_the_kernel():
    q, k, v, g, beta, state = _step_inputs(2, 1, 2, 16, 16, torch.float32, num_slots=4, seed=3)
    mirror_state = state.clone()
    out = gdn_recurrent_step(q, k, v, g, beta, state, [3, 1], SCALE)
    mirror = gdn_recurrent_step_torch(q, k, v, g, beta, mirror_state, [3, 1], SCALE)
    assert_close(out, mirror, torch.float32, "mirror out")
    assert_close(state, mirror_state, torch.float32, "mirror state")


BAD = {
    "repeated slot": (dict(state_indices=[1, 1]), "must not repeat"),
    "slot out of range": (dict(state_indices=[0, 4]), r"must lie in \[0, 4\)"),
    "slot count": (dict(state_indices=[0]), "must hold 2 slot indices"),
    "state dtype": (dict(state=torch.zeros(4, 2, 16, 16, dtype=torch.bfloat16)), "state must have dtype float32"),
    "state shape": (dict(state=torch.zeros(4, 2, 16, 8)), "state must have shape"),
    "key shape": (dict(key=torch.zeros(2, 1, 8)), "key must have shape"),
    "value rows": (dict(value=torch.zeros(3, 2, 16)), "value must have N = 2"),
    "Hv % Hk": (dict(query=torch.zeros(2, 2, 16), key=torch.zeros(2, 2, 16), value=torch.zeros(2, 3, 16),
                     g_log=torch.zeros(2, 3), beta=torch.zeros(2, 3)),
                "multiple of Hk"),
    "g dtype": (dict(g_log=torch.zeros(2, 2, dtype=torch.float64)), "g_log must have dtype float32"),
    "Dk > 128": (dict(query=torch.zeros(2, 1, 130), key=torch.zeros(2, 1, 130)), "Dk"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_arguments_raise_before_any_write(case):
    q, k, v, g, beta, state = _step_inputs(2, 1, 2, 16, 16, torch.float32, num_slots=4)
    args = dict(query=q, key=k, value=v, g_log=g, beta=beta, state=state, state_indices=[0, 2])
    overrides, message = BAD[case]
    args.update(overrides)
    before = args["state"].clone()
    with pytest.raises(ValueError, match=message):
        gdn_recurrent_step(**args)
    assert torch.equal(args["state"], before)
