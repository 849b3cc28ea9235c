"""From Hugging Face checkpoint tensors to the vLLM shell's (merged, vLLM-sharded) parameters.

A block-FP8 checkpoint is dequantized at load (:func:`dequantizing`): the
parameters hold the model dtype, and the layers run as for an unquantized checkpoint.

The layout is :mod:`vllm_gdn_neuron.model.parameters` (both GatedDeltaNet checkpoint layouts,
through Qwen3.5's flat names); vLLM's ``weight_loader`` of each merged parameter takes the
part's shard id and cuts the rank's rows itself.
"""

from collections.abc import Iterable, Iterator

import torch

from vllm_gdn_neuron.model.fp8 import block_size_of, dequantized_tensors, held_fp8_config
from vllm_gdn_neuron.model.parameters import merged_loads

Load = tuple[str, int | str | None, torch.Tensor]


def plan_loads(name: str, tensor: torch.Tensor, text_config) -> Iterator[Load]:
    """The ``(param_name, shard_id, tensor)`` loads one (already prefix-normalised) checkpoint
    tensor becomes; ``shard_id`` is None for a parameter loaded whole."""
    for load in merged_loads(name, tensor, text_config):
        yield load.param, load.shard_id, load.tensor


def dequantizing(
    weights: Iterable[tuple[str, torch.Tensor]], hf_config, dtype: torch.dtype,
) -> Iterable[tuple[str, torch.Tensor]]:
    """The checkpoint stream with a block-FP8 checkpoint's weights dequantized to ``dtype``
    (``fp8 * scale_inv`` in float32, then cast); an unquantized checkpoint's as it is."""
    quantization_config = held_fp8_config(hf_config)
    if not quantization_config:
        return weights
    return dequantized_tensors(weights, block_size_of(quantization_config), dtype)
