"""From Hugging Face checkpoint tensors to the vLLM shell's (merged, vLLM-sharded) parameters.

Both GatedDeltaNet layouts load into the same parameters, through Qwen3.5's flat names
(:func:`vllm_gdn_neuron.model.checkpoint.flat_gdn_tensors`). Each checkpoint tensor becomes zero or more ``(param_name, shard_id, tensor)`` loads;
``shard_id`` is None for a parameter loaded whole.
"""

from collections.abc import Iterator

import torch

from vllm_gdn_neuron.model.checkpoint import flat_gdn_tensors, split_flat_qkv

# (checkpoint name part, parameter name part, shard of the merged parameter)
_STACKED = (
    (".self_attn.q_proj.", ".self_attn.qkv_proj.", "q"),
    (".self_attn.k_proj.", ".self_attn.qkv_proj.", "k"),
    (".self_attn.v_proj.", ".self_attn.qkv_proj.", "v"),
    (".mlp.gate_proj.", ".mlp.gate_up_proj.", 0),
    (".mlp.up_proj.", ".mlp.gate_up_proj.", 1),
    (".shared_expert.gate_proj.", ".shared_expert.gate_up_proj.", 0),
    (".shared_expert.up_proj.", ".shared_expert.gate_up_proj.", 1),
    (".linear_attn.in_proj_z.", ".linear_attn.in_proj_qkvz.", 3),
    (".linear_attn.in_proj_b.", ".linear_attn.in_proj_ba.", 0),
    (".linear_attn.in_proj_a.", ".linear_attn.in_proj_ba.", 1),
)

Load = tuple[str, int | str | None, torch.Tensor]


def plan_loads(name: str, tensor: torch.Tensor, text_config) -> Iterator[Load]:
    """The parameter loads one (already prefix-normalised) checkpoint tensor becomes."""
    for flat_name, flat in flat_gdn_tensors(name, tensor, text_config):
        if ".linear_attn.in_proj_qkv." in flat_name:
            target = flat_name.replace(".in_proj_qkv.", ".in_proj_qkvz.")
            for shard, part in enumerate(split_flat_qkv(flat, text_config)):
                yield target, shard, part
            continue
        yield _stacked(flat_name, flat)


def _stacked(name: str, tensor: torch.Tensor) -> Load:
    """The merged parameter (and its shard) a checkpoint tensor loads into, or itself whole."""
    for ckpt_part, param_part, shard in _STACKED:
        if ckpt_part in name:
            return name.replace(ckpt_part, param_part), shard, tensor
    return name, None, tensor
