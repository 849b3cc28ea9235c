"""Where a block-FP8 checkpoint runs through vLLM's FP8 CPU kernels, and where it is dequantized at load
(``shells/vllm/fp8_kernels.choose_fp8_path``: vLLM's own kernel classes asked, on this machine's CPU)."""

import pytest
import torch

FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
# The ``-blocks`` tiny models' dims (every quantized projection whole 128 x 128 blocks).
BLOCKS = dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128, linear_num_key_heads=1,
              linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128, num_hidden_layers=4,
              num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128)

pytestmark = pytest.mark.skipif(not torch.cpu._is_amx_tile_supported(), reason="vLLM's FP8 CPU kernels need AMX")


def _config(**changes):
    from transformers import Qwen3_5MoeTextConfig

    return Qwen3_5MoeTextConfig(**{**BLOCKS, **changes})


def _choose(config, dtype=torch.bfloat16, tp_size=1, platform="cpu"):
    from vllm_gdn_neuron.shells.vllm.fp8_kernels import choose_fp8_path

    return choose_fp8_path(config, FP8_CONFIG, dtype, tp_size, platform)


def test_whole_blocks_in_bf16_run_through_vllms_fp8_kernels():
    path = _choose(_config())
    assert path.kernels, path.reason
    assert path.reason == "CPUFp8BlockScaledMMKernel for the linear layers, the CPU FP8 MoE backend for the experts"


@pytest.mark.parametrize("changes, dtype, tp_size, platform, reason", [
    ({}, torch.float32, 1, "cpu", "vLLM's Fp8Config takes dtypes [torch.bfloat16, torch.float16], not torch.float32"),
    ({}, torch.float16, 1, "cpu", "CPUFp8BlockScaledMMKernel Only bfloat16/float32 output dtype supported"),
    ({}, torch.bfloat16, 2, "cpu", "linear_attn.in_proj_qkvz's parts [64, 64, 128, 128] x 256 per rank (tp=2) are "
                                   "not whole [128, 128] blocks"),
    ({"hidden_size": 64}, torch.bfloat16, 1, "cpu", "linear_attn.in_proj_qkvz's parts [128, 128, 256, 256] x 64"),
    ({"head_dim": 64}, torch.bfloat16, 1, "cpu", "self_attn.qkv_proj's parts [256, 64, 64] x 256"),
    ({"moe_intermediate_size": 64}, torch.bfloat16, 1, "cpu", "mlp.experts's parts [64, 64] x 256"),
    ({}, torch.bfloat16, 1, "neuron", "vLLM's FP8 CPU kernels serve on its CPU platform only (this is 'neuron')"),
])
def test_the_weights_are_dequantized_where_the_kernels_do_not_fit(changes, dtype, tp_size, platform, reason):
    path = _choose(_config(**changes), dtype, tp_size, platform)
    assert not path.kernels and reason in path.reason, path.reason


def test_a_cpu_without_amx_is_dequantized(monkeypatch):
    """vLLM's capability check says no AMX (the op itself is not touched): its kernel choice finds none."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    path = _choose(_config())
    assert not path.kernels
    assert "CPUFp8BlockScaledMMKernel requires AMX tile support" in path.reason, path.reason


def test_dense_layers_of_a_mixed_checkpoint_are_checked_too():
    from transformers import Qwen3NextConfig

    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "linear_num_key_heads",
            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "num_hidden_layers",
            "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
    config = Qwen3NextConfig(**{k: BLOCKS[k] for k in keys}, decoder_sparse_step=2, mlp_only_layers=[],
                             intermediate_size=192)
    path = _choose(config)
    assert not path.kernels and "mlp.gate_up_proj's parts [192, 192] x 256" in path.reason, path.reason


@pytest.mark.parametrize("dtype, kernels", [(torch.bfloat16, True), (torch.float32, False)])
def test_the_engine_config_hook_gives_vllm_the_fp8_config_only_where_the_kernels_serve(tmp_path, dtype, kernels):
    """``prepare_model_config`` holds the checkpoint's FP8 config aside; ``choose_fp8_serving`` (run by
    the engine-config hook, before vLLM reads the quantization) gives it back where the kernels serve."""
    import types

    from vllm_gdn_neuron.model.fp8 import FP8_PATH_KEY, held_fp8_config
    from vllm_gdn_neuron.plugin import choose_fp8_serving, prepare_model_config

    config = _config()
    config.quantization_config = dict(FP8_CONFIG)
    model_config = types.SimpleNamespace(model=str(tmp_path / "not-local"), hf_config=config, hf_text_config=config,
                                         quantization=None, dtype=dtype,
                                         model_arch_config=types.SimpleNamespace(quantization_config=FP8_CONFIG))
    prepare_model_config(model_config)
    choose_fp8_serving(model_config, tp_size=1)
    assert getattr(config, FP8_PATH_KEY).kernels == kernels
    if kernels:
        assert model_config.quantization == "fp8" and held_fp8_config(config) is None
        assert config.quantization_config == FP8_CONFIG == model_config.model_arch_config.quantization_config
    else:
        assert model_config.quantization is None and held_fp8_config(config) == FP8_CONFIG
        assert not hasattr(config, "quantization_config")
