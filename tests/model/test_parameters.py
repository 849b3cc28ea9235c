"""The one parameter layout: checkpoint tensors -> merged projections, and each rank's rows of them."""

import types

import pytest
import torch

from vllm_gdn_neuron.model.parameters import ATTENTION_QKV, GDN_BA, GDN_QKVZ, MLP_GATE_UP, merged_loads, rank_rows

CONFIG = types.SimpleNamespace(
    linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=3, linear_value_head_dim=5,
    num_attention_heads=8, num_key_value_heads=2, head_dim=4, intermediate_size=16, shared_expert_intermediate_size=8,
)


def test_every_checkpoint_projection_becomes_a_part_of_its_merged_projection():
    loads = {
        "model.layers.0.linear_attn.in_proj_qkv.weight": [("model.layers.0.linear_attn.in_proj_qkvz.weight", i)
                                                          for i in range(3)],
        "model.layers.0.linear_attn.in_proj_qkvz.weight": [("model.layers.0.linear_attn.in_proj_qkvz.weight", i)
                                                           for i in range(4)],
        "model.layers.0.linear_attn.in_proj_ba.weight": [("model.layers.0.linear_attn.in_proj_ba.weight", i)
                                                         for i in range(2)],
        "model.layers.3.self_attn.k_proj.weight": [("model.layers.3.self_attn.qkv_proj.weight", 1)],
        "model.layers.1.mlp.up_proj.weight": [("model.layers.1.mlp.gate_up_proj.weight", 1)],
        "model.layers.1.mlp.shared_expert.gate_proj.weight": [("model.layers.1.mlp.shared_expert.gate_up_proj.weight", 0)],
        "model.layers.1.mlp.experts.2.gate_proj.weight": [("model.layers.1.mlp.experts.2.gate_proj.weight", None)],
        "model.layers.0.linear_attn.conv1d.weight": [("model.layers.0.linear_attn.conv1d.weight", None)],
    }
    rows = {"in_proj_qkv": 2 * 12 + 40, "in_proj_qkvz": 2 * 12 + 2 * 40, "in_proj_ba": 16}
    for name, expected in loads.items():
        tensor = torch.zeros(rows.get(name.split(".")[-2], 8), 2)
        assert [(load.param, load.part) for load in merged_loads(name, tensor, CONFIG)] == expected, name


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("merged", [GDN_QKVZ, GDN_BA, ATTENTION_QKV, MLP_GATE_UP], ids=lambda m: m.name)
def test_each_rank_holds_its_rows_of_every_part_in_order(merged, tp):
    """Row blocks of a part go to ranks in order (k / v heads: replicated past one per rank), and the
    rank's parameter is its blocks of part 0, part 1, ... back to back."""
    sizes = merged.part_sizes(CONFIG)
    for rank in range(tp):
        offset = 0
        for part, size in enumerate(sizes):
            source, target = rank_rows(merged, part, CONFIG, tp, rank)
            shards = min(tp, CONFIG.num_key_value_heads) if part in merged.by_kv_heads else tp
            count = size // shards
            assert source == slice(rank * shards // tp * count, (rank * shards // tp + 1) * count)
            assert target == slice(offset, offset + count)
            offset += count
