"""The builder's block-FP8 checkpoints: their bf16 twin's weights, block-quantized in the published layout.

Each ``<name>-fp8`` is built from the same seed as ``<name>``: every tensor the format
quantizes must be the twin's weight quantized block by block (the float64 loop of
tests/model/test_fp8.py), every other tensor the twin's own.
"""

import json
import pathlib

import pytest
import torch

from scripts import build_tiny_models as builder
from tests.support.fp8 import quantize_loop
from vllm_gdn_neuron.model import fp8


def _tensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for shard in sorted(pathlib.Path(folder).glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    return tensors


def _quantization_config(folder) -> dict:
    return json.loads((pathlib.Path(folder) / "config.json").read_text())["quantization_config"]


@pytest.mark.parametrize("name", builder.MODELS)
def test_fp8_twin_is_the_bf16_checkpoint_block_quantized(tiny_model, name):
    bf16, quantized = _tensors(tiny_model(name)), _tensors(tiny_model(name + builder.FP8_SUFFIX))
    scale_dtype = getattr(torch, builder.FP8_SCALE_DTYPE.get(name, "bfloat16"))
    fp8_names = {key for key, tensor in quantized.items() if tensor.dtype == torch.float8_e4m3fn}
    assert fp8_names == {key for key in bf16 if fp8.is_quantized_weight(key)}
    assert set(quantized) == set(bf16) | {fp8.scale_name(key) for key in fp8_names}
    for key, weight in bf16.items():
        if key in fp8_names:
            q_ref, scale_ref = quantize_loop(weight, fp8.BLOCK_SIZE, scale_dtype)
            scale = quantized[fp8.scale_name(key)]
            assert scale.dtype == scale_dtype and scale.shape == fp8.scale_shape(weight.shape)
            torch.testing.assert_close(scale.double(), scale_ref, rtol=0, atol=0)
            torch.testing.assert_close(quantized[key].double(), q_ref, rtol=0, atol=0)
        else:
            assert torch.equal(quantized[key], weight), key


@pytest.mark.parametrize("name", builder.FP8_MODELS)
def test_fp8_checkpoint_layout(tiny_model, name):
    folder = tiny_model(name)
    headers = fp8.read_tensor_headers(folder)
    fp8.check_checkpoint_scales(headers)
    config = _quantization_config(folder)
    fp8.check_fp8_config(config)
    assert (config["quant_method"], config["weight_block_size"]) == ("fp8", [128, 128])
    skipped = config["modules_to_not_convert"]
    assert not any(fp8.is_quantized_weight(module + ".weight") for module in skipped)
    vision_language = name.removesuffix(builder.FP8_SUFFIX) in builder.VL_MODELS
    text_prefix = "model.language_model." if vision_language else "model."
    assert text_prefix + "embed_tokens" in skipped
    assert text_prefix + "layers.0.linear_attn." + ("in_proj_ba" if "next" in name else "in_proj_a") in skipped
    assert any(module.startswith("model.visual.") for module in skipped) == vision_language
    # Tiny dims are under one block: clipped blocks, a single one or a few per weight.
    assert {headers[fp8.scale_name(key)][1] for key, (dtype, _) in headers.items() if dtype == "F8_E4M3"} >= {(1, 1)}
    if "moe" in name or "next" in name:
        layer = 1 if "next" in name else 0  # Qwen3-Next's MoE layers are every second one
        expert = f"{text_prefix}layers.{layer}.mlp.experts.3.down_proj.weight"
        assert headers[expert] == ("F8_E4M3", (64, 32)) and headers[fp8.scale_name(expert)][1] == (1, 1)


@pytest.mark.slow
def test_real_dims_fp8_checkpoint(tiny_model):
    """The 35B-A3B per-layer dims in block-FP8: whole 128-blocks, the published per-expert layout, a sane size."""
    folder = pathlib.Path(tiny_model("qwen3_5-35b-a3b-real-fp8"))
    headers = fp8.read_tensor_headers(folder)
    fp8.check_checkpoint_scales(headers)
    expert = "model.layers.0.mlp.experts.7.gate_proj.weight"
    assert headers[expert] == ("F8_E4M3", (512, 2048))
    assert headers[fp8.scale_name(expert)] == ("BF16", (4, 16))
    assert headers["model.layers.0.linear_attn.in_proj_qkv.weight"] == ("F8_E4M3", (8192, 2048))
    assert headers["model.layers.0.linear_attn.in_proj_a.weight"][0] == "BF16"
    assert headers["lm_head.weight"] == ("BF16", (248320, 2048))
    # Embeddings and lm_head (2 x 1 GB in bf16) dominate; the four layers add ~0.1 GB in FP8.
    size = sum(path.stat().st_size for path in folder.glob("*.safetensors"))
    assert 2.0e9 < size < 2.3e9
