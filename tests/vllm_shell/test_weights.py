"""Checkpoint tensors -> parameters: both GatedDeltaNet layouts, against transformers' own code."""

import types

import pytest
import torch

from vllm_gdn_neuron.model.checkpoint import split_flat_qkv, unpack_grouped_ba, unpack_grouped_qkvz
from vllm_gdn_neuron.shells.vllm.weights import plan_loads


def _config(hk, hv, dk, dv):
    return types.SimpleNamespace(
        linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=dk, linear_value_head_dim=dv,
        linear_conv_kernel_dim=4,
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


@pytest.fixture
def tensor_parallel_rank(monkeypatch):
    """``tensor_parallel_rank(tp, rank)``: vLLM's tensor-parallel group, as its parallel layers and this
    shell's layers read it (world size and rank only: nothing here communicates)."""
    from vllm.distributed import parallel_state

    def set_rank(tp, rank):
        monkeypatch.setattr(parallel_state, "_TP", types.SimpleNamespace(world_size=tp, rank_in_group=rank))

    return set_rank


@pytest.mark.vllm024
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize(("hk", "hv", "dk", "dv"), [(4, 8, 3, 5), (4, 12, 6, 2)])
def test_gated_deltanet_loaders_write_each_rank_its_described_share(tensor_parallel_rank, tp, hk, hv, dk, dv):
    """Loading Qwen3.5's checkpoint tensors of one GatedDeltaNet layer through the layer's weight
    loaders (vLLM's merged and row-parallel ones, the shell's conv1d and head-vector ones) leaves
    every parameter of rank r equal to :func:`~vllm_gdn_neuron.model.parameters.rank_share` of the
    whole tensor."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    from vllm_gdn_neuron.model.parameters import rank_share
    from vllm_gdn_neuron.shells.vllm.gated_deltanet import GatedDeltaNet

    config = types.SimpleNamespace(**vars(_config(hk, hv, dk, dv)), hidden_size=6, rms_norm_eps=1e-6)
    engine = types.SimpleNamespace(
        model_config=types.SimpleNamespace(dtype=torch.float32), device_config=types.SimpleNamespace(device_type="cpu"),
        cache_config=types.SimpleNamespace(mamba_cache_dtype="auto", mamba_ssm_cache_dtype="float32"))
    prefix, key, value = "model.layers.0.linear_attn", hk * dk, hv * dv
    generator = torch.Generator().manual_seed(0)
    checkpoint = {name: torch.randn(*shape, generator=generator) for name, shape in {
        "in_proj_qkv.weight": (2 * key + value, 6), "in_proj_z.weight": (value, 6), "in_proj_b.weight": (hv, 6),
        "in_proj_a.weight": (hv, 6), "conv1d.weight": (2 * key + value, 1, 4), "A_log": (hv,), "dt_bias": (hv,),
        "norm.weight": (dv,), "out_proj.weight": (6, value)}.items()}
    whole = {
        "in_proj_qkvz.weight": torch.cat([checkpoint["in_proj_qkv.weight"], checkpoint["in_proj_z.weight"]]),
        "in_proj_ba.weight": torch.cat([checkpoint["in_proj_b.weight"], checkpoint["in_proj_a.weight"]]),
        "conv1d.weight": checkpoint["conv1d.weight"][:, 0],
        **{name: checkpoint[name] for name in ("A_log", "dt_bias", "norm.weight", "out_proj.weight")},
    }
    for rank in range(tp):
        tensor_parallel_rank(tp, rank)
        with set_current_vllm_config(VllmConfig()):
            layer = GatedDeltaNet(config, engine, prefix=prefix)
        params = dict(layer.named_parameters())
        assert params.keys() == whole.keys()
        for name, tensor in checkpoint.items():
            for param_name, shard, part in plan_loads(f"{prefix}.{name}", tensor, config):
                param = params[param_name.removeprefix(f"{prefix}.")]
                loader = getattr(param, "weight_loader", default_weight_loader)
                if shard is None:
                    loader(param, part)
                else:
                    loader(param, part, shard)
        for name, param in params.items():
            want = rank_share(f"{prefix}.{name}", whole[name], config, tp, rank)
            torch.testing.assert_close(param.data, want, rtol=0, atol=0, msg=f"rank {rank}: {name}")


@pytest.mark.parametrize("name", ["model.layers.0.linear_attn.in_proj_qkv.weight",
                                  "model.layers.0.linear_attn.in_proj_qkvz.weight"])
def test_block_scales_are_cut_into_the_parts_their_weight_is_cut_into(name):
    """Each part's scales are the blocks of its weight rows: dequantizing part by part (the weight's
    parts by ``plan_loads``, the scales' by ``plan_scale_loads``) gives the whole weight's parts."""
    from vllm_gdn_neuron.model.fp8 import dequantize_blocks, quantize_blocks, scale_name
    from vllm_gdn_neuron.shells.vllm.weights import plan_scale_loads

    config = _config(2, 4, 128, 64)  # q, k 256 rows; v, z 256 rows; Qwen3-Next groups of 2*128 + 2*128 rows
    rows = 3 * 256 if name.endswith("in_proj_qkv.weight") else 4 * 256
    torch.manual_seed(0)
    fp8, scale = quantize_blocks(torch.randn(rows, 256), scale_dtype=torch.bfloat16)
    weights = list(plan_loads(name, fp8, config))
    scales = list(plan_scale_loads(scale_name(name), scale, config, (128, 128)))
    assert [(p + "_scale_inv", s) for p, s, _ in weights] == [(p, s) for p, s, _ in scales]
    whole = list(plan_loads(name, dequantize_blocks(fp8, scale), config))
    for (_, _, w), (_, _, s), (_, _, want) in zip(weights, scales, whole):
        torch.testing.assert_close(dequantize_blocks(w.contiguous(), s), want, rtol=0, atol=0)


def test_block_scales_of_a_part_off_the_block_are_refused():
    from vllm_gdn_neuron.shells.vllm.weights import plan_scale_loads

    config = _config(2, 4, 32, 32)  # q, k 64 rows, v 128: the first block holds q and k rows together
    with pytest.raises(ValueError, match=r"in_proj_qkvz.weight_scale_inv: a part of 64 rows is not whole blocks"):
        list(plan_scale_loads("model.layers.0.linear_attn.in_proj_qkv.weight_scale_inv",
                              torch.arange(2.0).reshape(2, 1), config, (128, 128)))
