"""From Hugging Face checkpoint tensors to the vLLM shell's (merged, vLLM-sharded) parameters.

A block-FP8 checkpoint is either dequantized at load (:func:`dequantizing`: the parameters
hold the model dtype, and the layers run as for an unquantized checkpoint), or, where vLLM's
FP8 kernels serve it (:mod:`~vllm_gdn_neuron.shells.vllm.fp8_kernels`), loaded as stored: each
FP8 weight into vLLM's FP8 parameter like any weight, its block scales (``weight_scale_inv``)
cut into the same parts by :func:`plan_scale_loads`.

The layout is :mod:`vllm_gdn_neuron.model.parameters` (both GatedDeltaNet checkpoint layouts,
through Qwen3.5's flat names); vLLM's ``weight_loader`` of each merged parameter takes the
part's shard id and cuts the rank's rows itself.
"""

from collections.abc import Iterable, Iterator

import torch

from vllm_gdn_neuron.model.fp8 import SCALE_SUFFIX, block_size_of, dequantized_tensors, held_fp8_config
from vllm_gdn_neuron.model.parameters import merged_loads

Load = tuple[str, int | str | None, torch.Tensor]


def plan_loads(name: str, tensor: torch.Tensor, text_config) -> Iterator[Load]:
    """The ``(param_name, shard_id, tensor)`` loads one (already prefix-normalised) checkpoint
    tensor becomes; ``shard_id`` is None for a parameter loaded whole."""
    for load in merged_loads(name, tensor, text_config):
        yield load.param, load.shard_id, load.tensor


def plan_scale_loads(name: str, scale: torch.Tensor, text_config, block_size: tuple[int, int]) -> Iterator[Load]:
    """The loads of one checkpoint weight's block scales (``...weight_scale_inv`` [ceil(N / Bn), ceil(K / Bk)]):
    the same parts as its weight's (:func:`plan_loads`: Qwen3-Next's packed ``in_proj_qkvz``
    unpacked, merged projections cut into their parts), each part's block rows.

    The scales are spread over the weight's rows (one row of blocks per Bn rows), cut as the weight
    is cut, and taken back one row per block: every part must start and end on a block (vLLM's
    FP8 path is only chosen where they do).

    Raises:
        ValueError: a part that is not whole blocks (naming the parameter).
    """
    block_rows = block_size[0]
    rows = scale.repeat_interleave(block_rows, dim=0)
    for param_name, shard, part in plan_loads(name[: -len(SCALE_SUFFIX)], rows, text_config):
        if part.shape[0] % block_rows or not torch.equal(part, part[::block_rows].repeat_interleave(block_rows, 0)):
            raise ValueError(f"{param_name}{SCALE_SUFFIX}: a part of {part.shape[0]} rows is not whole blocks of "
                             f"{block_rows} rows; its block scales cannot be cut out of {name}")
        yield param_name + SCALE_SUFFIX, shard, part[::block_rows]


def dequantizing(
    weights: Iterable[tuple[str, torch.Tensor]], hf_config, dtype: torch.dtype,
) -> Iterable[tuple[str, torch.Tensor]]:
    """The checkpoint stream with a block-FP8 checkpoint's weights dequantized to ``dtype``
    (``fp8 * scale_inv`` in float32, then cast); an unquantized checkpoint's as it is."""
    quantization_config = held_fp8_config(hf_config)
    if not quantization_config:
        return weights
    return dequantized_tensors(weights, block_size_of(quantization_config), dtype)
