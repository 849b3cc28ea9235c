"""From Hugging Face checkpoint tensors to the vLLM shell's (merged, vLLM-sharded) parameters.

A block-FP8 checkpoint is dequantized at load (:func:`dequantizing`): the
parameters hold the model dtype, and the layers run as for an unquantized checkpoint.

The layout is :mod:`vllm_gdn_neuron.model.parameters` (both GatedDeltaNet checkpoint layouts,
through Qwen3.5's flat names); vLLM's ``weight_loader`` of each merged parameter takes the
part's shard id and cuts the rank's rows itself.
"""

from collections.abc import Iterable, Iterator

import torch

from vllm_gdn_neuron.model.fp8 import FP8_METHOD, block_size_of, dequantized_tensors
from vllm_gdn_neuron.model.parameters import merged_loads

Load = tuple[str, int | str | None, torch.Tensor]


def plan_loads(name: str, tensor: torch.Tensor, text_config) -> Iterator[Load]:
    """The ``(param_name, shard_id, tensor)`` loads one (already prefix-normalised) checkpoint
    tensor becomes; ``shard_id`` is None for a parameter loaded whole."""
    for load in merged_loads(name, tensor, text_config):
        yield load.param, load.shard_id, load.tensor


# Where :func:`hold_dequantized` keeps a block-FP8 checkpoint's quantization_config on the config.
DEQUANTIZED_CONFIG_KEY = "vllm_gdn_neuron_fp8_config"


def hold_dequantized(model_config) -> None:
    """Serve a block-FP8 checkpoint dequantized: its ``quantization_config`` moves from the
    checkpoint's config (and vLLM's view of it) to ``DEQUANTIZED_CONFIG_KEY``, so vLLM builds
    unquantized layers and :func:`dequantizing` finds the format at load."""
    hf_config = model_config.hf_config
    setattr(hf_config, DEQUANTIZED_CONFIG_KEY, hf_config.quantization_config)
    for config in {id(c): c for c in (hf_config, model_config.hf_text_config)}.values():
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
    arch_config = getattr(model_config, "model_arch_config", None)  # vLLM 0.32's view of the config
    if arch_config is not None:
        arch_config.quantization_config = None
    if model_config.quantization == FP8_METHOD:
        model_config.quantization = None


def dequantizing(
    weights: Iterable[tuple[str, torch.Tensor]], hf_config, dtype: torch.dtype,
) -> Iterable[tuple[str, torch.Tensor]]:
    """The checkpoint stream with a block-FP8 checkpoint's weights dequantized to ``dtype``
    (``fp8 * scale_inv`` in float32, then cast); an unquantized checkpoint's as it is."""
    quantization_config = getattr(hf_config, DEQUANTIZED_CONFIG_KEY, None)
    if not quantization_config:
        return weights
    return dequantized_tensors(weights, block_size_of(quantization_config), dtype)
