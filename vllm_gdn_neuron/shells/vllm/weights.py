"""From Hugging Face checkpoint tensors to the vLLM shell's (merged, vLLM-sharded) parameters.

The layout is :mod:`vllm_gdn_neuron.model.parameters` (both GatedDeltaNet checkpoint layouts,
through Qwen3.5's flat names); vLLM's ``weight_loader`` of each merged parameter takes the
part's shard id and cuts the rank's rows itself.
"""

from collections.abc import Iterator

import torch

from vllm_gdn_neuron.model.parameters import merged_loads

Load = tuple[str, int | str | None, torch.Tensor]


def plan_loads(name: str, tensor: torch.Tensor, text_config) -> Iterator[Load]:
    """The ``(param_name, shard_id, tensor)`` loads one (already prefix-normalised) checkpoint
    tensor becomes; ``shard_id`` is None for a parameter loaded whole."""
    for load in merged_loads(name, tensor, text_config):
        yield load.param, load.shard_id, load.tensor
