"""The parameter layout both shells hold: which checkpoint projections share one merged projection.

Projections that read the same input are one column-parallel projection (one matmul), named
as vLLM's Qwen3.5 model names them; its rows are the parts in order, and each
tensor-parallel rank holds its rows of every part, in the same order:

- ``linear_attn.in_proj_qkvz``: q | k | v (Qwen3.5's ``in_proj_qkv``, split) | z (``in_proj_z``);
- ``linear_attn.in_proj_ba``: b | a (``in_proj_b``, ``in_proj_a``);
- ``self_attn.qkv_proj``: q (query and output gate, per head) | k | v;
- ``mlp.gate_up_proj``, ``mlp.shared_expert.gate_up_proj``: gate | up.

A part is split into equal contiguous row blocks, one per rank, except the k and v parts of
attention: they split by key-value heads, and past one head per rank a head is replicated
(rank r holds head ``r // (tp / Hkv)``), as vLLM's ``QKVParallelLinear`` does.

:func:`merged_loads` turns one checkpoint tensor (in Qwen3.5's flat names,
:func:`~vllm_gdn_neuron.model.checkpoint.flat_gdn_tensors`) into its parts;
:func:`rank_rows` says where a part's rows lie for one rank. Any other tensor is loaded into
the parameter of its own name (``shard`` None).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_gdn_neuron.model.checkpoint import flat_gdn_tensors, split_flat_qkv


def _gdn_qkvz_sizes(config) -> tuple[int, ...]:
    key = config.linear_num_key_heads * config.linear_key_head_dim
    value = config.linear_num_value_heads * config.linear_value_head_dim
    return key, key, value, value


def _gdn_ba_sizes(config) -> tuple[int, ...]:
    return config.linear_num_value_heads, config.linear_num_value_heads


def _attention_qkv_sizes(config) -> tuple[int, ...]:
    kv = config.num_key_value_heads * config.head_dim
    return 2 * config.num_attention_heads * config.head_dim, kv, kv


def _mlp_gate_up_sizes(config) -> tuple[int, ...]:
    return config.intermediate_size, config.intermediate_size


def _shared_expert_gate_up_sizes(config) -> tuple[int, ...]:
    return config.shared_expert_intermediate_size, config.shared_expert_intermediate_size


@dataclass(frozen=True)
class MergedProjection:
    """One merged projection.

    Attributes:
        name: its module name below the layer (``linear_attn.in_proj_qkvz``).
        shard_ids: vLLM's ``weight_loader`` shard id of each part, in row order.
        part_sizes: ``part_sizes(text_config)``: the rows of each part over all ranks.
        by_kv_heads: the parts split by key-value heads (replicated past one head per rank).
    """

    name: str
    shard_ids: tuple[int | str, ...]
    part_sizes: Callable[[object], tuple[int, ...]]
    by_kv_heads: tuple[int, ...] = ()


GDN_QKVZ = MergedProjection("linear_attn.in_proj_qkvz", (0, 1, 2, 3), _gdn_qkvz_sizes)
GDN_BA = MergedProjection("linear_attn.in_proj_ba", (0, 1), _gdn_ba_sizes)
ATTENTION_QKV = MergedProjection("self_attn.qkv_proj", ("q", "k", "v"), _attention_qkv_sizes, by_kv_heads=(1, 2))
MLP_GATE_UP = MergedProjection("mlp.gate_up_proj", (0, 1), _mlp_gate_up_sizes)
SHARED_EXPERT_GATE_UP = MergedProjection("shared_expert.gate_up_proj", (0, 1), _shared_expert_gate_up_sizes)

# (checkpoint module in the flat layout, its merged projection, the parts it holds)
_CHECKPOINT_PARTS = (
    ("linear_attn.in_proj_qkv", GDN_QKVZ, (0, 1, 2)),
    ("linear_attn.in_proj_z", GDN_QKVZ, (3,)),
    ("linear_attn.in_proj_b", GDN_BA, (0,)),
    ("linear_attn.in_proj_a", GDN_BA, (1,)),
    ("self_attn.q_proj", ATTENTION_QKV, (0,)),
    ("self_attn.k_proj", ATTENTION_QKV, (1,)),
    ("self_attn.v_proj", ATTENTION_QKV, (2,)),
    ("shared_expert.gate_proj", SHARED_EXPERT_GATE_UP, (0,)),
    ("shared_expert.up_proj", SHARED_EXPERT_GATE_UP, (1,)),
    ("mlp.gate_proj", MLP_GATE_UP, (0,)),
    ("mlp.up_proj", MLP_GATE_UP, (1,)),
)


@dataclass(frozen=True)
class PartLoad:
    """One part of a merged projection (or a whole parameter) from one checkpoint tensor.

    Attributes:
        param: the parameter's name.
        merged: the merged projection, or None for a parameter loaded whole.
        part: the part's index in ``merged`` (None for a whole parameter).
        tensor: the part over all ranks (``[rows, ...]``), or the whole tensor.
    """

    param: str
    merged: MergedProjection | None
    part: int | None
    tensor: torch.Tensor

    @property
    def shard_id(self) -> int | str | None:
        """vLLM's ``weight_loader`` shard id (None: loaded whole)."""
        return None if self.merged is None else self.merged.shard_ids[self.part]


def merged_loads(name: str, tensor: torch.Tensor, text_config) -> list[PartLoad]:
    """The loads of one (prefix-normalised) text-decoder checkpoint tensor, either GDN layout."""
    loads = []
    for flat_name, flat in flat_gdn_tensors(name, tensor, text_config):
        loads += _parts(flat_name, flat, text_config)
    return loads


def _parts(name: str, tensor: torch.Tensor, text_config) -> list[PartLoad]:
    for module, merged, parts in _CHECKPOINT_PARTS:
        if f".{module}." in name:
            param = name.replace(f".{module}.", f".{merged.name}.")
            pieces = split_flat_qkv(tensor, text_config) if len(parts) > 1 else (tensor,)
            return [PartLoad(param, merged, part, piece) for part, piece in zip(parts, pieces)]
    return [PartLoad(name, None, None, tensor)]


def rank_rows(merged: MergedProjection, part: int, text_config, tp: int, rank: int) -> tuple[slice, slice]:
    """Where one rank's rows of a part lie.

    Returns:
        ``(source, target)``: the rows of the whole part the rank holds, and where they go in the
        rank's merged parameter (its rows of every earlier part come first).
    """
    sizes = merged.part_sizes(text_config)
    local = [_rank_part(merged, index, size, text_config, tp, rank) for index, size in enumerate(sizes)]
    start, count = local[part]
    offset = sum(count for _, count in local[:part])
    return slice(start, start + count), slice(offset, offset + count)


def _rank_part(merged: MergedProjection, part: int, size: int, text_config, tp: int, rank: int) -> tuple[int, int]:
    """``(first row, rows)`` of the rank's share of a part of ``size`` rows."""
    if part in merged.by_kv_heads:
        kv_heads = text_config.num_key_value_heads
        replicas = max(1, tp // kv_heads)
        count = size // (tp // replicas)
        return rank // replicas * count, count
    count = size // tp
    return rank * count, count
