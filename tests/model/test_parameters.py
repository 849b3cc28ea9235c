"""The one parameter layout: checkpoint tensors -> merged projections, and each rank's share of every parameter."""

import types

import pytest
import torch

from vllm_gdn_neuron.model.dims import GDNDims
from vllm_gdn_neuron.model.parameters import (ATTENTION_QKV, GDN_BA, GDN_QKVZ, MLP_GATE_UP, REPLICATED,
                                              SHARED_EXPERT_GATE_UP, merged_loads, parameter_split, rank_rows,
                                              rank_share)

CONFIG = types.SimpleNamespace(
    linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=3, linear_value_head_dim=5, linear_conv_kernel_dim=4,
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


# Dk != Dv, GQA 2 (GatedDeltaNet) and 4 (attention, key-value heads replicated at tp 4).
AWKWARD = types.SimpleNamespace(
    linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=3, linear_value_head_dim=5,
    linear_conv_kernel_dim=4, num_attention_heads=8, num_key_value_heads=2, head_dim=4, intermediate_size=16,
    shared_expert_intermediate_size=8, moe_intermediate_size=12, num_experts=3, hidden_size=6, vocab_size=20,
)
# Dk > Dv, GQA 3, as many key-value heads as query heads.
WIDE_KEYS = types.SimpleNamespace(
    linear_num_key_heads=4, linear_num_value_heads=12, linear_key_head_dim=6, linear_value_head_dim=2,
    linear_conv_kernel_dim=3, num_attention_heads=4, num_key_value_heads=4, head_dim=2, intermediate_size=8,
    shared_expert_intermediate_size=4, moe_intermediate_size=4, num_experts=2, hidden_size=5, vocab_size=12,
)


def _whole(*shape):
    """A tensor whose every entry is distinct, so a misplaced slice cannot go unseen."""
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)


def _rebuilt(split, shares, tp):
    """The whole tensor put back from every rank's slices: each part's distinct blocks in rank order."""
    pieces = []
    for part in range(len(split.parts)):
        seen = []
        for rank in range(tp):
            block = split.rank_slices(tp, rank)[part]
            if block not in seen:
                seen.append(block)
                pieces.append(shares[rank][part])
    return torch.cat(pieces, dim=split.dim)


def _rule_tensors(c):
    """``(name, whole tensor)`` of each rule's parameter (names as the shells hold them), both expert layouts."""
    value_width = c.linear_num_value_heads * c.linear_value_head_dim
    conv_channels = 2 * c.linear_num_key_heads * c.linear_key_head_dim + value_width
    h, e, i = c.hidden_size, c.num_experts, c.moe_intermediate_size
    layer = "model.layers.1"
    return [
        (f"{layer}.linear_attn.conv1d.weight", _whole(conv_channels, 1, c.linear_conv_kernel_dim)),
        (f"{layer}.linear_attn.A_log", _whole(c.linear_num_value_heads)),
        (f"{layer}.linear_attn.dt_bias", _whole(c.linear_num_value_heads)),
        (f"{layer}.linear_attn.out_proj.weight", _whole(h, value_width)),
        (f"{layer}.self_attn.o_proj.weight", _whole(h, c.num_attention_heads * c.head_dim)),
        (f"{layer}.mlp.down_proj.weight", _whole(h, c.intermediate_size)),
        (f"{layer}.mlp.shared_expert.down_proj.weight", _whole(h, c.shared_expert_intermediate_size)),
        (f"{layer}.mlp.experts.gate_up_proj", _whole(e, 2 * i, h)),  # fused 3-D layout
        (f"{layer}.mlp.experts.down_proj", _whole(e, h, i)),
        (f"{layer}.mlp.experts.gate_up_proj", _whole(i, h)),  # per-expert layout: one expert's gate (or up)
        (f"{layer}.mlp.experts.down_proj", _whole(h, i)),
        ("lm_head.weight", _whole(c.vocab_size, h)),
        (f"{layer}.linear_attn.in_proj_qkvz.weight", _whole(sum(GDN_QKVZ.part_sizes(c)), h)),
        (f"{layer}.self_attn.qkv_proj.weight", _whole(sum(ATTENTION_QKV.part_sizes(c)), h)),
    ]


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("config", [AWKWARD, WIDE_KEYS], ids=["gqa2-dk3-dv5", "gqa3-dk6-dv2"])
def test_every_rule_s_rank_slices_rebuild_the_whole_tensor(config, tp):
    """Each rank's share is its block of every part back to back, and the ranks' blocks, part by part
    in rank order, are the whole tensor."""
    for name, whole in _rule_tensors(config):
        split = parameter_split(name, tuple(whole.shape), config, vocab_split=True)
        assert split.dim is not None, name
        shares = []
        for rank in range(tp):
            blocks = [whole.narrow(split.dim, b.start, b.stop - b.start) for b in split.rank_slices(tp, rank)]
            share = rank_share(name, whole, config, tp, rank, vocab_split=True)
            torch.testing.assert_close(share, torch.cat(blocks, dim=split.dim), rtol=0, atol=0, msg=name)
            shares.append(blocks)
        torch.testing.assert_close(_rebuilt(split, shares, tp), whole, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("config", [AWKWARD, WIDE_KEYS], ids=["gqa2-dk3-dv5", "gqa3-dk6-dv2"])
def test_gated_deltanet_shares_are_the_rank_s_heads(config, tp):
    """conv1d's channels and A_log / dt_bias are the rank's key heads' q, k and their value heads' v
    (:class:`GDNDims` of one rank), as the rank's rows of in_proj_qkvz and in_proj_ba hold them."""
    whole_dims, local = GDNDims.from_config(config), GDNDims.from_config(config, tp)
    conv = _whole(whole_dims.conv_dim, 1, 3)
    heads = _whole(whole_dims.num_v_heads)
    q, k, v = whole_dims.split_heads(conv[:, 0].T)  # [K, H*, D*]: one "token" per kernel tap
    for rank in range(tp):
        key_heads = slice(rank * local.num_k_heads, (rank + 1) * local.num_k_heads)
        value_heads = slice(rank * local.num_v_heads, (rank + 1) * local.num_v_heads)
        share = rank_share("model.layers.0.linear_attn.conv1d.weight", conv, config, tp, rank)
        assert share.shape == (local.conv_dim, 1, 3)
        local_q, local_k, local_v = local.split_heads(share[:, 0].T)
        torch.testing.assert_close(local_q, q[:, key_heads], rtol=0, atol=0)
        torch.testing.assert_close(local_k, k[:, key_heads], rtol=0, atol=0)
        torch.testing.assert_close(local_v, v[:, value_heads], rtol=0, atol=0)
        for name in ("A_log", "dt_bias"):
            torch.testing.assert_close(rank_share(f"model.layers.0.linear_attn.{name}", heads, config, tp, rank),
                                       heads[value_heads], rtol=0, atol=0)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_row_parallel_shares_sum_to_the_whole_matmul(tp):
    """The ranks' partial products over their input columns sum to the unsplit product (what the
    all-reduce after a row-parallel weight relies on)."""
    config = AWKWARD
    torch.manual_seed(0)
    for name, width in [("model.layers.0.linear_attn.out_proj.weight", 40), ("model.layers.3.self_attn.o_proj.weight", 32),
                        ("model.layers.1.mlp.down_proj.weight", 16),
                        ("model.layers.1.mlp.shared_expert.down_proj.weight", 8)]:
        weight, x = torch.randn(6, width, dtype=torch.float64), torch.randn(3, width, dtype=torch.float64)
        partial = 0
        for rank in range(tp):
            columns = parameter_split(name, tuple(weight.shape), config).rank_slices(tp, rank)[0]
            partial = partial + x[:, columns] @ rank_share(name, weight, config, tp, rank).T
        torch.testing.assert_close(partial, x @ weight.T, rtol=0, atol=1e-12)


@pytest.mark.parametrize("tp", [2, 4])
def test_fused_and_per_expert_layouts_give_each_rank_the_same_expert_weights(tp):
    """A rank's share of the fused ``[E, 2I, H]`` / ``[E, H, I]`` experts is, expert by expert, its
    share of that expert's gate, then of its up, and of its down (the per-expert layout)."""
    config, e, i, h = AWKWARD, AWKWARD.num_experts, AWKWARD.moe_intermediate_size, AWKWARD.hidden_size
    gate_up, down = _whole(e, 2 * i, h), _whole(e, h, i)
    for rank in range(tp):
        fused_gate_up = rank_share("model.layers.1.mlp.experts.gate_up_proj", gate_up, config, tp, rank)
        fused_down = rank_share("model.layers.1.mlp.experts.down_proj", down, config, tp, rank)
        assert fused_gate_up.shape == (e, 2 * i // tp, h) and fused_down.shape == (e, h, i // tp)
        for expert in range(e):
            gate, up = gate_up[expert].split([i, i])
            per_expert = [rank_share("model.layers.1.mlp.experts.gate_up_proj", half, config, tp, rank)
                          for half in (gate, up)]
            torch.testing.assert_close(fused_gate_up[expert], torch.cat(per_expert), rtol=0, atol=0)
            torch.testing.assert_close(
                fused_down[expert], rank_share("model.layers.1.mlp.experts.down_proj", down[expert], config, tp, rank),
                rtol=0, atol=0)


@pytest.mark.parametrize("tp", [2, 4])
def test_merged_parameter_shares_are_the_rank_rows_of_each_part(tp):
    """Cutting a whole merged weight (:func:`rank_share`) and copying each part's rows (:func:`rank_rows`,
    what the Neuron loader does per checkpoint tensor) give a rank the same parameter."""
    config = AWKWARD
    for merged in (GDN_QKVZ, GDN_BA, ATTENTION_QKV, MLP_GATE_UP, SHARED_EXPERT_GATE_UP):
        whole = _whole(sum(merged.part_sizes(config)), 3)
        parts = whole.split(list(merged.part_sizes(config)))
        for rank in range(tp):
            share = rank_share(f"model.layers.0.{merged.name}.weight", whole, config, tp, rank)
            copied = torch.empty_like(share)
            for part, tensor in enumerate(parts):
                source, target = rank_rows(merged, part, config, tp, rank)
                copied[target] = tensor[source]
            torch.testing.assert_close(share, copied, rtol=0, atol=0, msg=merged.name)


@pytest.mark.parametrize("name", [
    "model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight",
    "model.layers.0.linear_attn.norm.weight", "model.layers.3.self_attn.q_norm.weight", "model.layers.1.mlp.gate.weight",
    "model.layers.1.mlp.shared_expert_gate.weight", "visual.tower.blocks.0.mlp.down_proj.weight",
    "visual.tower.blocks.0.attn.proj.weight",
])
def test_other_parameters_are_replicated(name):
    whole = _whole(8, 4)
    assert parameter_split(name, tuple(whole.shape), AWKWARD) == REPLICATED
    for rank in range(4):
        assert rank_share(name, whole, AWKWARD, 4, rank) is whole


def test_the_lm_head_splits_by_vocabulary_rows_only_where_the_shell_splits_its_vocabulary():
    whole = _whole(AWKWARD.vocab_size, AWKWARD.hidden_size)
    assert parameter_split("lm_head.weight", tuple(whole.shape), AWKWARD) == REPLICATED
    shares = [rank_share("lm_head.weight", whole, AWKWARD, 4, rank, vocab_split=True) for rank in range(4)]
    torch.testing.assert_close(torch.cat(shares), whole, rtol=0, atol=0)
    assert all(share.shape == (5, AWKWARD.hidden_size) for share in shares)


def test_a_whole_tensor_of_the_wrong_size_is_refused_naming_the_parameter():
    with pytest.raises(ValueError, match=r"model.layers.0.linear_attn.conv1d.weight: the whole tensor must have 64 "
                                         r"entries along dim 0 \(parts \(12, 12, 40\)\); got shape \(60, 1, 4\)"):
        rank_share("model.layers.0.linear_attn.conv1d.weight", torch.zeros(60, 1, 4), AWKWARD, 2, 0)
    with pytest.raises(ValueError, match=r"rank must be in \[0, tp=2\); got 2"):
        parameter_split("lm_head.weight", (20, 6), AWKWARD, vocab_split=True).rank_slices(2, 2)
