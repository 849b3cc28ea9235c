"""gdn_cte (schur and neumann) in the NKI interpreter against the float64 token-by-token recurrence."""

import pytest
import torch

from vllm_gdn_neuron.kernels.gdn_cte import gdn_cte
from vllm_gdn_neuron.kernels.gdn_cte_torch import gdn_cte_torch
from vllm_gdn_neuron.kernels.mask_pack import build_mask_pack

from .kernel_testing import DTYPES, assert_close, gdn_inputs, random_state, reference_cte

SCALE = 0.3


def _check(case_inputs, dtype, algorithm, group_size=8, initial_state=None, kernel=gdn_cte):
    query, key, value, g_log, beta = case_inputs
    state = None if initial_state is None else initial_state.clone()
    out, final = kernel(query, key, value, g_log, beta, scale=SCALE, algorithm=algorithm,
                        mask_pack=torch.from_numpy(build_mask_pack()), group_size=group_size,
                        recurrent_state=state)
    ref_out, ref_state = reference_cte(query, key, value, g_log, beta, SCALE, initial_state)
    assert out.shape == ref_out.shape and out.dtype == query.dtype
    assert final.shape == ref_state.shape and final.dtype == torch.float32
    assert_close(out, ref_out, dtype, f"{algorithm} out")
    assert_close(final, ref_state, dtype, f"{algorithm} final state")
    return final, state


# (B, Hk, Hv, S, Dk, Dv): GQA ratios 1-4, Dk != Dv both ways, batch > 1
SCHUR_SHAPES = [
    (1, 1, 1, 128, 32, 32),
    (2, 1, 2, 256, 16, 48),
    (1, 1, 3, 128, 48, 16),
    (1, 2, 8, 128, 16, 16),
]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", SCHUR_SHAPES, ids=lambda s: "B{}-Hk{}-Hv{}-S{}-Dk{}-Dv{}".format(*s))
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
def test_schur_matches_reference(shape, dtype, with_state):
    b, hk, hv, s, dk, dv = shape
    inputs = gdn_inputs(b, hk, hv, s, dk, dv, DTYPES[dtype], seed=s + hv)
    initial = random_state(b, hv, dk, dv) if with_state else None
    _check(inputs, DTYPES[dtype], "schur", group_size=3, initial_state=initial)


@pytest.mark.parametrize("group_size, s", [(1, 384), (3, 640), (8, 1024), (16, 2048), (3, 2048)])
def test_schur_group_sizes_and_lengths(group_size, s):
    # 640 / 3, 2048 / 3: a partial last group; 2048 / 16: exactly one group
    inputs = gdn_inputs(1, 1, 1, s, 16, 16, torch.float32, seed=group_size)
    _check(inputs, torch.float32, "schur", group_size=group_size, initial_state=random_state(1, 1, 16, 16))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 64, 32, 32), (2, 2, 2, 192, 16, 48), (1, 3, 3, 128, 48, 16),
                                   (1, 1, 1, 64, 128, 96)],
                         ids=lambda s: "B{}-H{}-S{}-Dk{}-Dv{}".format(s[0], s[1], *s[3:]))
def test_neumann_matches_reference(shape, dtype):
    b, hk, hv, s, dk, dv = shape
    _check(gdn_inputs(b, hk, hv, s, dk, dv, DTYPES[dtype], seed=s), DTYPES[dtype], "neumann")


@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_correlated_keys_and_mild_decay(algorithm, dtype):
    # near-identical keys and g close to 0: (I + A) is ill-conditioned, powers of A grow
    inputs = gdn_inputs(1, 1, 1, 256, 32, 32, DTYPES[dtype], g_min=-0.01, correlated=True, seed=5)
    _check(inputs, DTYPES[dtype], algorithm)


def test_strong_decay_down_to_minus_20_with_state():
    inputs = gdn_inputs(1, 1, 2, 256, 32, 16, torch.float32, g_min=-20.0, seed=9)
    _check(inputs, torch.float32, "schur", initial_state=random_state(1, 2, 32, 16))


def test_head_dims_at_the_128_limit():
    inputs = gdn_inputs(1, 1, 1, 128, 128, 128, torch.bfloat16, seed=3)
    _check(inputs, torch.bfloat16, "schur", initial_state=random_state(1, 1, 128, 128))


def test_recurrent_state_is_updated_in_the_callers_buffer():
    inputs = gdn_inputs(1, 1, 2, 128, 16, 16, torch.float32, seed=4)
    initial = random_state(1, 2, 16, 16)
    buffer = initial.clone()
    pointer = buffer.data_ptr()
    out, final = gdn_cte(*inputs, scale=SCALE, recurrent_state=buffer)
    assert final is buffer and buffer.data_ptr() == pointer
    _, ref_state = reference_cte(*inputs, SCALE, initial)
    assert_close(buffer, ref_state, torch.float32, "state written in place")


def test_default_mask_pack_and_numpy_inputs():
    query, key, value, g_log, beta = (x.numpy() for x in gdn_inputs(1, 1, 1, 128, 16, 16, torch.float32, seed=6))
    out, final = gdn_cte(query, key, value, g_log, beta, scale=SCALE)
    ref_out, ref_state = reference_cte(*(torch.from_numpy(x) for x in (query, key, value, g_log, beta)), SCALE)
    assert_close(torch.from_numpy(out), ref_out, torch.float32, "numpy out")
    assert_close(torch.from_numpy(final), ref_state, torch.float32, "numpy state")


@pytest.mark.parametrize("kernel", [gdn_cte, gdn_cte_torch], ids=["kernel", "torch-mirror"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_l2_norm_on_chip(kernel, dtype):
    gen = torch.Generator().manual_seed(11)
    query, key, value, g_log, beta = gdn_inputs(1, 1, 2, 128, 32, 16, DTYPES[dtype], seed=11)
    query = (3.0 * torch.randn(query.shape, generator=gen)).to(DTYPES[dtype])  # far from unit norm
    key = (0.2 * torch.randn(key.shape, generator=gen)).to(DTYPES[dtype])
    initial = random_state(1, 2, 32, 16)
    out, final = kernel(query, key, value, g_log, beta, scale=SCALE, recurrent_state=initial.clone(),
                        use_qk_l2norm=True)
    ref_out, ref_state = reference_cte(query, key, value, g_log, beta, SCALE, initial, use_qk_l2norm=True)
    assert_close(out, ref_out, DTYPES[dtype], "out, normalised on chip")
    assert_close(final, ref_state, DTYPES[dtype], "state, normalised on chip")


@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
def test_torch_mirror_matches_reference(algorithm):
    inputs = gdn_inputs(1, 1, 1, 256, 32, 16, torch.float32, seed=8)
    _check(inputs, torch.float32, algorithm, kernel=gdn_cte_torch)


def _good(**overrides):
    query, key, value, g_log, beta = gdn_inputs(1, 1, 2, 128, 16, 16, torch.float32, seed=0)
    args = dict(query=query, key=key, value=value, g_log=g_log, beta=beta)
    args.update(overrides)
    return args


BAD_CASES = {
    "unknown algorithm": (dict(algorithm="cholesky"), "algorithm"),
    "query rank": (dict(query=torch.zeros(1, 128, 16)), "query must have rank 4"),
    "Dq != Dk": (dict(query=torch.zeros(1, 1, 128, 32)), "Dq == Dk"),
    "key shape": (dict(key=torch.zeros(1, 1, 64, 16)), "key must have shape"),
    "key dtype": (dict(key=torch.zeros(1, 1, 128, 16, dtype=torch.bfloat16)), "key must have the dtype of query"),
    "int dtype": (dict(query=torch.zeros(1, 1, 128, 16, dtype=torch.int32)), "query must have dtype"),
    "Dk > 128": (dict(query=torch.zeros(1, 1, 128, 160), key=torch.zeros(1, 1, 128, 160)), "Dk"),
    "Dv > 128": (dict(value=torch.zeros(1, 2, 128, 130)), "Dv"),
    "Hv % Hk": (dict(query=torch.zeros(1, 2, 128, 16), key=torch.zeros(1, 2, 128, 16),
                     value=torch.zeros(1, 3, 128, 16), g_log=torch.zeros(1, 3, 128), beta=torch.zeros(1, 3, 128)),
                "multiple of Hk"),
    "S % 128 (schur)": (dict(query=torch.zeros(1, 1, 192, 16), key=torch.zeros(1, 1, 192, 16),
                             value=torch.zeros(1, 2, 192, 16), g_log=torch.zeros(1, 2, 192),
                             beta=torch.zeros(1, 2, 192)), "multiple of 128"),
    "S % 64 (neumann)": (dict(algorithm="neumann", query=torch.zeros(1, 2, 96, 16), key=torch.zeros(1, 2, 96, 16),
                              value=torch.zeros(1, 2, 96, 16), g_log=torch.zeros(1, 2, 96),
                              beta=torch.zeros(1, 2, 96)), "multiple of 64"),
    "neumann GQA": (dict(algorithm="neumann"), "Hk == Hv"),
    "neumann state": (dict(algorithm="neumann", value=torch.zeros(1, 1, 128, 16), g_log=torch.zeros(1, 1, 128),
                           beta=torch.zeros(1, 1, 128), recurrent_state=torch.zeros(1, 1, 16, 16)),
                      "supports no incoming state"),
    "g_log shape": (dict(g_log=torch.zeros(1, 1, 128)), "g_log must have shape"),
    "beta dtype": (dict(beta=torch.zeros(1, 2, 128, dtype=torch.float64)), "beta must have dtype float32"),
    "state shape": (dict(recurrent_state=torch.zeros(1, 2, 16, 8)), "recurrent_state must have shape"),
    "state dtype": (dict(recurrent_state=torch.zeros(1, 2, 16, 16, dtype=torch.bfloat16)),
                    "recurrent_state must have dtype float32"),
    "mask pack shape": (dict(mask_pack=torch.zeros(3, 128, 128)), "mask_pack must have shape"),
    "group size": (dict(group_size=0), "group_size"),
    "group size > 16": (dict(group_size=17), "group_size must be <= 16"),
}


@pytest.mark.parametrize("case", list(BAD_CASES), ids=list(BAD_CASES))
def test_every_constraint_raises_before_any_write(case):
    overrides, message = BAD_CASES[case]
    args = _good(**overrides)
    state = args.get("recurrent_state")
    before = None if state is None else state.clone()
    with pytest.raises(ValueError, match=message):
        gdn_cte(**args)
    if state is not None:
        assert torch.equal(state, before)
