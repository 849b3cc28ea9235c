"""The plugin's model-config hook on a quantized checkpoint: block-FP8 held for dequantization, the rest refused.

The hook runs on vLLM's ``ModelConfig`` before vLLM reads the quantization (both vLLM lanes
call it there); here it gets a stand-in with the fields it reads, over a checkpoint folder of
one FP8 weight.
"""

import types

import pytest
import torch

FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
              "modules_to_not_convert": ["lm_head"]}


def _checkpoint(folder, scale_shape=(2, 1)):
    """A folder with one FP8 weight [130, 64] and its scales of ``scale_shape`` (None: none)."""
    from safetensors.torch import save_file

    from vllm_gdn_neuron.model import fp8

    weight, scale = fp8.quantize_blocks(torch.randn(130, 64))
    tensors = {"model.layers.0.mlp.down_proj.weight": weight}
    if scale_shape is not None:
        tensors["model.layers.0.mlp.down_proj.weight_scale_inv"] = torch.ones(scale_shape)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def _model_config(folder, quantization_config, quantization=None):
    hf_config = types.SimpleNamespace(quantization_config=quantization_config)
    return types.SimpleNamespace(
        model=str(folder), hf_config=hf_config, hf_text_config=hf_config, quantization=quantization,
        model_arch_config=types.SimpleNamespace(quantization_config=quantization_config))


@pytest.mark.vllm024
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_a_block_fp8_checkpoint_is_held_for_dequantization(tmp_path, quantization):
    from vllm_gdn_neuron.model.fp8 import held_fp8_config
    from vllm_gdn_neuron.plugin import prepare_model_config

    config = _model_config(_checkpoint(tmp_path), dict(FP8_CONFIG), quantization)
    prepare_model_config(config)
    assert config.quantization is None and config.model_arch_config.quantization_config is None
    assert not hasattr(config.hf_config, "quantization_config")
    assert held_fp8_config(config.hf_config) == FP8_CONFIG


@pytest.mark.vllm024
def test_an_unquantized_checkpoint_is_left_as_it_is(tmp_path):
    from vllm_gdn_neuron.model.fp8 import held_fp8_config
    from vllm_gdn_neuron.plugin import prepare_model_config

    config = _model_config(tmp_path, None)
    prepare_model_config(config)
    assert config.quantization is None and held_fp8_config(config.hf_config) is None


@pytest.mark.vllm024
@pytest.mark.parametrize("quantization_config, quantization, message", [
    ({"quant_method": "gptq", "bits": 4}, "gptq", "quantization 'gptq' is not supported .*; got quantization='gptq'"),
    ({"quant_method": "awq", "bits": 4}, "awq", "quantization 'awq' is not supported"),
    ({"quant_method": "compressed-tensors"}, "compressed-tensors", "quantization 'compressed-tensors' is not supported"),
    ({"quant_method": "mxfp4"}, None, "quantization 'mxfp4' is not supported"),
    (None, "fp8", "quantization='fp8' on an unquantized checkpoint"),
    ({**FP8_CONFIG, "weight_block_size": None}, None, "weight_block_size must be two positive ints"),
])
def test_other_quantizations_are_refused(tmp_path, quantization_config, quantization, message):
    from vllm_gdn_neuron.plugin import prepare_model_config

    with pytest.raises(ValueError, match=message):
        prepare_model_config(_model_config(_checkpoint(tmp_path), quantization_config, quantization))


@pytest.mark.vllm024
@pytest.mark.parametrize("scale_shape, message", [
    (None, r"model.layers.0.mlp.down_proj.weight_scale_inv: missing; .*\(130, 64\) needs block scales of shape \(2, 1\)"),
    ((1, 1), r"model.layers.0.mlp.down_proj.weight_scale_inv: shape must be \(2, 1\) .*; got \(1, 1\)"),
])
def test_bad_scales_are_refused(tmp_path, scale_shape, message):
    from vllm_gdn_neuron.plugin import prepare_model_config

    with pytest.raises(ValueError, match=message):
        prepare_model_config(_model_config(_checkpoint(tmp_path, scale_shape), dict(FP8_CONFIG)))
