"""The float64 references against cases computed by hand and against each other's special cases."""

import math

import pytest
import torch

from vllm_gdn_neuron.kernels.reference import (
    causal_conv1d,
    causal_conv1d_step,
    gdn2_recurrence,
    gdn_recurrence,
    l2norm,
    qwen35_gating,
)

f64 = torch.float64


def t(values):
    return torch.tensor(values, dtype=f64)


def test_gdn_one_token_one_head_by_hand():
    # S0 = [[1], [2]] decays by 0.5 -> [[.5], [1]]; S^T k = .5; v_new = .5 * (3 - .5) = 1.25;
    # S = [[1.75], [1]]; o = S^T q = 2.75 with scale 1.
    q, k, v = t([[[1.0, 1.0]]]), t([[[1.0, 0.0]]]), t([[[3.0]]])
    g, beta = t([[math.log(0.5)]]), t([[0.5]])
    o, state = gdn_recurrence(q, k, v, g, beta, initial_state=t([[[[1.0], [2.0]]]]), scale=1.0)
    torch.testing.assert_close(o, t([[[2.75]]]), rtol=0, atol=1e-15)
    torch.testing.assert_close(state, t([[[[1.75], [1.0]]]]), rtol=0, atol=1e-15)


def test_gdn_with_unit_key_and_beta_one_overwrites_the_memory():
    # Dk = Dv = 1, k = 1, beta = 1, g = 0: the delta rule replaces the stored value each token.
    v = t([[[2.0]], [[-5.0]], [[7.0]]])
    ones = torch.ones(3, 1, 1, dtype=f64)
    o, state = gdn_recurrence(ones, ones, v, torch.zeros(3, 1, dtype=f64), torch.ones(3, 1, dtype=f64))
    torch.testing.assert_close(o, v, rtol=0, atol=1e-15)  # scale = 1 ** -0.5 = 1
    torch.testing.assert_close(state, t([[[[7.0]]]]), rtol=0, atol=1e-15)


def test_gdn_default_scale_is_dk_to_the_minus_half():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 4, dtype=f64), torch.randn(3, 1, 4, dtype=f64), torch.randn(3, 1, 2, dtype=f64)
    g, beta = -torch.rand(3, 1, dtype=f64), torch.rand(3, 1, dtype=f64)
    o_default, _ = gdn_recurrence(q, k, v, g, beta)
    o_explicit, _ = gdn_recurrence(q, k, v, g, beta, scale=0.5)
    torch.testing.assert_close(o_default, o_explicit, rtol=0, atol=0)


def test_gdn_value_head_h_reads_key_head_h_over_group():
    # Hk = 2, Hv = 4: value heads 0, 1 read key head 0 and 2, 3 read key head 1.
    torch.manual_seed(1)
    q, k = torch.randn(5, 2, 3, dtype=f64), torch.randn(5, 2, 3, dtype=f64)
    v, g, beta = torch.randn(5, 4, 2, dtype=f64), -torch.rand(5, 4, dtype=f64), torch.rand(5, 4, dtype=f64)
    o, state = gdn_recurrence(q, k, v, g, beta)
    for h in range(4):
        kh = h // 2
        o_h, s_h = gdn_recurrence(q[:, kh:kh + 1], k[:, kh:kh + 1], v[:, h:h + 1], g[:, h:h + 1], beta[:, h:h + 1])
        torch.testing.assert_close(o[:, h:h + 1], o_h, rtol=0, atol=1e-14)
        torch.testing.assert_close(state[:, h:h + 1], s_h, rtol=0, atol=1e-14)


def test_gdn_packed_sequences_are_independent():
    torch.manual_seed(2)
    q, k = torch.randn(7, 1, 3, dtype=f64), torch.randn(7, 1, 3, dtype=f64)
    v, g, beta = torch.randn(7, 2, 2, dtype=f64), -torch.rand(7, 2, dtype=f64), torch.rand(7, 2, dtype=f64)
    h0 = torch.randn(2, 2, 3, 2, dtype=f64)
    o, state = gdn_recurrence(q, k, v, g, beta, cu_seqlens=[0, 4, 7], initial_state=h0, use_qk_l2norm=True)
    for n, (a, b) in enumerate([(0, 4), (4, 7)]):
        o_n, s_n = gdn_recurrence(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], initial_state=h0[n:n + 1],
                                  use_qk_l2norm=True)
        torch.testing.assert_close(o[a:b], o_n, rtol=0, atol=1e-14)
        torch.testing.assert_close(state[n:n + 1], s_n, rtol=0, atol=1e-14)


def test_gdn_matches_the_hf_recurrent_implementation():
    modeling = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    torch.manual_seed(3)
    q, k, v = torch.randn(9, 2, 8, dtype=f64), torch.randn(9, 2, 8, dtype=f64), torch.randn(9, 2, 4, dtype=f64)
    g, beta = -3 * torch.rand(9, 2, dtype=f64), torch.rand(9, 2, dtype=f64)
    h0 = torch.randn(1, 2, 8, 4, dtype=f64)
    o, state = gdn_recurrence(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True)
    o_hf, state_hf = modeling.torch_recurrent_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], initial_state=h0, output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    # HF computes in float32.
    torch.testing.assert_close(o, o_hf[0].to(f64), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, state_hf.to(f64), rtol=1e-5, atol=1e-5)


def test_gdn2_one_token_by_hand():
    # S0 = [[1], [1]]; channel decays (.5, 1) -> [[.5], [1]]; beta * k = (1, 0): S^T (beta k) = .5;
    # v_new = w v - .5 = 1.5; S = [[2], [2.5]]; o = S^T q = 2 with q = (1, 0), scale 1.
    q, k, v = t([[[1.0, 0.0]]]), t([[[1.0, 1.0]]]), t([[[2.0]]])
    g, beta, w = t([[[math.log(0.5), 0.0]]]), t([[[1.0, 0.0]]]), t([[[1.0]]])
    o, state = gdn2_recurrence(q, k, v, g, beta, w, initial_state=t([[[[1.0], [1.0]]]]), scale=1.0)
    torch.testing.assert_close(o, t([[[2.0]]]), rtol=0, atol=1e-15)
    torch.testing.assert_close(state, t([[[[2.0], [2.5]]]]), rtol=0, atol=1e-15)


@pytest.mark.parametrize("w_is_none", [False, True])
def test_gdn2_with_channel_constant_gates_equals_gdn(w_is_none):
    torch.manual_seed(4)
    T, Hk, Hv, Dk, Dv = 6, 1, 2, 3, 5
    q, k, v = torch.randn(T, Hk, Dk, dtype=f64), torch.randn(T, Hk, Dk, dtype=f64), torch.randn(T, Hv, Dv, dtype=f64)
    g, beta = -2 * torch.rand(T, Hv, dtype=f64), torch.rand(T, Hv, dtype=f64)
    if w_is_none:
        beta = torch.ones(T, Hv, dtype=f64)  # w = ones = beta
    h0 = torch.randn(2, Hv, Dk, Dv, dtype=f64)
    cu = [0, 2, 6]
    o, state = gdn_recurrence(q, k, v, g, beta, cu_seqlens=cu, initial_state=h0)
    w = None if w_is_none else beta[..., None].expand(T, Hv, Dv)
    o2, state2 = gdn2_recurrence(q, k, v, g[..., None].expand(T, Hv, Dk), beta[..., None].expand(T, Hv, Dk), w,
                                 cu_seqlens=cu, initial_state=h0)
    torch.testing.assert_close(o2, o, rtol=0, atol=1e-13)
    torch.testing.assert_close(state2, state, rtol=0, atol=1e-13)


def test_references_do_not_modify_their_inputs():
    h0 = torch.ones(1, 1, 2, 1, dtype=f64)
    x0 = torch.ones(1, 1, 3, dtype=f64)
    gdn_recurrence(torch.ones(2, 1, 2), torch.ones(2, 1, 2), torch.ones(2, 1, 1), torch.zeros(2, 1),
                   torch.ones(2, 1), initial_state=h0)
    causal_conv1d(torch.ones(2, 1), torch.ones(1, 3), initial_state=x0)
    assert torch.equal(h0, torch.ones(1, 1, 2, 1, dtype=f64))
    assert torch.equal(x0, torch.ones(1, 1, 3, dtype=f64))


def test_conv1d_decode_step_by_hand():
    # state (oldest first) [10, 20, 30], weight [1, 2, 3], x = 1: window [20, 30, 1] -> 20 + 60 + 3.
    y, state = causal_conv1d_step(t([1.0]), t([[1.0, 2.0, 3.0]]), t([[10.0, 20.0, 30.0]]), activation=None)
    torch.testing.assert_close(y, t([83.0]), rtol=0, atol=0)
    torch.testing.assert_close(state, t([[20.0, 30.0, 1.0]]), rtol=0, atol=0)


def test_conv1d_prefill_by_hand_with_a_sequence_shorter_than_k():
    weight, h0 = t([[1.0, 2.0, 3.0]]), t([[[10.0, 20.0, 30.0]], [[0.0, 0.0, 5.0]]])
    x = t([[1.0], [2.0], [4.0]])
    # Sequence 0 = [1, 2] from [10, 20, 30]: y = 20 + 60 + 3 = 83, then 30 + 2 + 6 = 38; state [30, 1, 2].
    # Sequence 1 = [4] from [0, 0, 5]: window [0, 5, 4] -> 10 + 12 = 22; state keeps [0, 5] in front.
    y, state = causal_conv1d(x, weight, cu_seqlens=[0, 2, 3], initial_state=h0, activation=None)
    torch.testing.assert_close(y, t([[83.0], [38.0], [22.0]]), rtol=0, atol=0)
    torch.testing.assert_close(state, t([[[30.0, 1.0, 2.0]], [[0.0, 5.0, 4.0]]]), rtol=0, atol=0)


def test_conv1d_new_sequence_starts_from_zeros_and_applies_silu():
    torch.manual_seed(5)
    x, weight = torch.randn(5, 3, dtype=f64), torch.randn(3, 4, dtype=f64)
    y, state = causal_conv1d(x, weight)
    padded = torch.cat([torch.zeros(3, 3, dtype=f64), x.T], dim=1)
    expected = torch.nn.functional.silu(torch.nn.functional.conv1d(padded[None], weight[:, None], groups=3)[0].T)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-14)
    torch.testing.assert_close(state, x[1:].T[None], rtol=0, atol=0)


def test_conv1d_rejects_an_unknown_activation():
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d_step(t([1.0]), t([[1.0, 2.0]]), t([[0.0, 0.0]]), activation="relu")


def test_qwen35_gating_by_hand():
    g, beta = qwen35_gating(a=t([[0.0, 50.0]]), b=t([[0.0, 100.0]]), A_log=t([0.0, math.log(2.0)]),
                            dt_bias=t([0.0, -10.0]))
    torch.testing.assert_close(g, t([[-math.log(2.0), -2.0 * (40.0 + math.log1p(math.exp(-40.0)))]]),
                               rtol=1e-15, atol=0)
    torch.testing.assert_close(beta, t([[0.5, 1.0]]), rtol=1e-15, atol=0)


def test_l2norm_by_hand():
    torch.testing.assert_close(l2norm(t([3.0, 4.0]), eps=0.0), t([0.6, 0.8]), rtol=0, atol=1e-16)
    torch.testing.assert_close(l2norm(t([[3.0, 4.0]])), t([[3.0, 4.0]]) / math.sqrt(25.0 + 1e-6),
                               rtol=0, atol=1e-16)
    torch.testing.assert_close(l2norm(torch.zeros(2)), torch.zeros(2, dtype=f64), rtol=0, atol=0)
