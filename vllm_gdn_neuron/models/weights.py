"""From Hugging Face checkpoint tensors to this plugin's parameters.

Both GatedDeltaNet layouts load into the same parameters:

- Qwen3.5 stores ``in_proj_qkv`` (flat ``[q all heads | k all heads | v all heads]``),
  ``in_proj_z``, ``in_proj_b`` and ``in_proj_a`` separately;
- Qwen3-Next packs them per key-head group: ``in_proj_qkvz`` rows are, for each of
  the Hk groups, ``[q_g (Dk) | k_g (Dk) | v_g (r*Dv) | z_g (r*Dv)]`` with r = Hv / Hk,
  and ``in_proj_ba`` rows are ``[b_g (r) | a_g (r)]`` per group. These are
  un-interleaved here, once, at load time, so the forward has one code path.

Each checkpoint tensor becomes zero or more ``(param_name, shard_id, tensor)`` loads;
``shard_id`` is None for a parameter loaded whole.
"""

from collections.abc import Iterator

import torch

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


def split_flat_qkv(weight: torch.Tensor, text_config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Qwen3.5 ``in_proj_qkv`` [2*Hk*Dk + Hv*Dv, H] -> q, k [Hk*Dk, H], v [Hv*Dv, H]."""
    key_dim = text_config.linear_num_key_heads * text_config.linear_key_head_dim
    value_dim = text_config.linear_num_value_heads * text_config.linear_value_head_dim
    return weight.split([key_dim, key_dim, value_dim], dim=0)


def unpack_grouped_qkvz(weight: torch.Tensor, text_config) -> tuple[torch.Tensor, ...]:
    """Qwen3-Next ``in_proj_qkvz`` [Hk*(2*Dk + 2*r*Dv), H] -> flat q, k, v, z (head-major rows)."""
    hk, dk, dv = text_config.linear_num_key_heads, text_config.linear_key_head_dim, text_config.linear_value_head_dim
    ratio = text_config.linear_num_value_heads // hk
    grouped = weight.reshape(hk, 2 * dk + 2 * ratio * dv, weight.shape[-1])
    parts = grouped.split([dk, dk, ratio * dv, ratio * dv], dim=1)
    return tuple(part.reshape(-1, weight.shape[-1]) for part in parts)


def unpack_grouped_ba(weight: torch.Tensor, text_config) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next ``in_proj_ba`` [Hk*2*r, H] -> b, a [Hv, H] (value-head-major rows)."""
    hk = text_config.linear_num_key_heads
    ratio = text_config.linear_num_value_heads // hk
    grouped = weight.reshape(hk, 2 * ratio, weight.shape[-1])
    b, a = grouped.split([ratio, ratio], dim=1)
    return b.reshape(-1, weight.shape[-1]), a.reshape(-1, weight.shape[-1])


def plan_loads(name: str, tensor: torch.Tensor, text_config) -> Iterator[Load]:
    """The parameter loads one (already prefix-normalised) checkpoint tensor becomes."""
    if ".linear_attn.in_proj_qkv." in name:
        target = name.replace(".in_proj_qkv.", ".in_proj_qkvz.")
        for shard, part in enumerate(split_flat_qkv(tensor, text_config)):
            yield target, shard, part
        return
    if ".linear_attn.in_proj_qkvz." in name:
        for shard, part in enumerate(unpack_grouped_qkvz(tensor, text_config)):
            yield name, shard, part
        return
    if ".linear_attn.in_proj_ba." in name:
        for shard, part in enumerate(unpack_grouped_ba(tensor, text_config)):
            yield name, shard, part
        return
    for ckpt_part, param_part, shard in _STACKED:
        if ckpt_part in name:
            yield name.replace(ckpt_part, param_part), shard, tensor
            return
    yield name, None, tensor
