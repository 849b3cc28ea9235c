"""Checkpoint tensors -> parameters: both GatedDeltaNet layouts, against transformers' own code."""

import types

import pytest
import torch

from vllm_gdn_neuron.model.checkpoint import split_flat_qkv, unpack_grouped_ba, unpack_grouped_qkvz
from vllm_gdn_neuron.shells.vllm.weights import plan_loads


def _config(hk, hv, dk, dv):
    return types.SimpleNamespace(
        linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=dk, linear_value_head_dim=dv
    )


# GQA ratios 1, 2, 4 (3 with a non-power-of-two head count); Dk != Dv.
HEADS = [(2, 2, 8, 8), (2, 4, 8, 4), (1, 4, 4, 6), (2, 6, 6, 4)]


@pytest.mark.parametrize(("hk", "hv", "dk", "dv"), HEADS)
def test_grouped_qwen3_next_projections_unpack_like_transformers(hk, hv, dk, dv):
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    hidden, tokens = 16, 5
    hf_config = Qwen3NextConfig(
        hidden_size=hidden, linear_num_key_heads=hk, linear_num_value_heads=hv,
        linear_key_head_dim=dk, linear_value_head_dim=dv, num_hidden_layers=1, layer_types=["linear_attention"],
    )
    hf_layer = Qwen3NextGatedDeltaNet(hf_config, layer_idx=0)
    torch.manual_seed(0)
    w_qkvz = torch.randn(hk * (2 * dk + 2 * dv * hv // hk), hidden, dtype=torch.float64)
    w_ba = torch.randn(2 * hv, hidden, dtype=torch.float64)
    x = torch.randn(1, tokens, hidden, dtype=torch.float64)
    q, k, v, z, b, a = hf_layer.fix_query_key_value_ordering(x @ w_qkvz.T, x @ w_ba.T)

    config = _config(hk, hv, dk, dv)
    ours_q, ours_k, ours_v, ours_z = unpack_grouped_qkvz(w_qkvz, config)
    ours_b, ours_a = unpack_grouped_ba(w_ba, config)
    x2 = x[0]  # float64: only summation-order roundoff (~1e-15) separates the two; a layout error is O(1)
    torch.testing.assert_close(x2 @ ours_q.T, q[0].reshape(tokens, -1), rtol=0, atol=1e-12)
    torch.testing.assert_close(x2 @ ours_k.T, k[0].reshape(tokens, -1), rtol=0, atol=1e-12)
    torch.testing.assert_close(x2 @ ours_v.T, v[0].reshape(tokens, -1), rtol=0, atol=1e-12)
    torch.testing.assert_close(x2 @ ours_z.T, z[0].reshape(tokens, -1), rtol=0, atol=1e-12)
    torch.testing.assert_close(x2 @ ours_b.T, b[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(x2 @ ours_a.T, a[0], rtol=0, atol=1e-12)


def test_flat_qwen3_5_qkv_splits_into_q_k_v_rows():
    config = _config(2, 4, 3, 5)
    weight = torch.arange((2 * 6 + 20) * 2, dtype=torch.float32).reshape(-1, 2)
    q, k, v = split_flat_qkv(weight, config)
    assert (q.shape, k.shape, v.shape) == ((6, 2), (6, 2), (20, 2))
    torch.testing.assert_close(torch.cat([q, k, v]), weight)


def test_plan_loads_routes_every_layout_to_the_merged_parameters():
    config = _config(2, 4, 3, 5)
    qkv = torch.zeros(2 * 6 + 20, 7)
    flat = list(plan_loads("model.layers.0.linear_attn.in_proj_qkv.weight", qkv, config))
    assert [(n, s) for n, s, _ in flat] == [("model.layers.0.linear_attn.in_proj_qkvz.weight", i) for i in range(3)]
    grouped = list(plan_loads("model.layers.0.linear_attn.in_proj_qkvz.weight", torch.zeros(2 * (6 + 20), 7), config))
    assert [(n, s) for n, s, _ in grouped] == [("model.layers.0.linear_attn.in_proj_qkvz.weight", i) for i in range(4)]
    expected = {
        "model.layers.0.linear_attn.in_proj_z.weight": ("model.layers.0.linear_attn.in_proj_qkvz.weight", 3),
        "model.layers.0.linear_attn.in_proj_b.weight": ("model.layers.0.linear_attn.in_proj_ba.weight", 0),
        "model.layers.0.linear_attn.in_proj_a.weight": ("model.layers.0.linear_attn.in_proj_ba.weight", 1),
        "model.layers.3.self_attn.q_proj.weight": ("model.layers.3.self_attn.qkv_proj.weight", "q"),
        "model.layers.3.self_attn.v_proj.weight": ("model.layers.3.self_attn.qkv_proj.weight", "v"),
        "model.layers.1.mlp.up_proj.weight": ("model.layers.1.mlp.gate_up_proj.weight", 1),
        "model.layers.1.mlp.shared_expert.gate_proj.weight": ("model.layers.1.mlp.shared_expert.gate_up_proj.weight", 0),
        "model.layers.1.mlp.gate.weight": ("model.layers.1.mlp.gate.weight", None),
        "model.layers.0.linear_attn.conv1d.weight": ("model.layers.0.linear_attn.conv1d.weight", None),
    }
    for name, (param, shard) in expected.items():
        [(got_param, got_shard, _)] = plan_loads(name, torch.zeros(4, 7), config)
        assert (got_param, got_shard) == (param, shard), name
