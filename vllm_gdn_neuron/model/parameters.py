"""The parameter layout both shells hold, and how every parameter splits over tensor-parallel ranks.

Projections that read the same input are one column-parallel projection (one matmul), named
as vLLM's Qwen3.5 model names them; its rows are the parts in order:

- ``linear_attn.in_proj_qkvz``: q | k | v (Qwen3.5's ``in_proj_qkv``, split) | z (``in_proj_z``);
- ``linear_attn.in_proj_ba``: b | a (``in_proj_b``, ``in_proj_a``);
- ``self_attn.qkv_proj``: q (query and output gate, per head) | k | v;
- ``mlp.gate_up_proj``, ``mlp.shared_expert.gate_up_proj``: gate | up.

:func:`parameter_split` says how the whole tensor of any parameter splits (a :class:`Split`:
the dimension, the parts along it that split separately, and which rank holds which block);
:func:`rank_share` cuts one rank's share out of a whole tensor. The rules:

- merged projections: each part's rows split into equal contiguous blocks, one per rank,
  except the k and v parts of attention: they split by key-value heads, and past one head per
  rank a head is replicated (rank r holds head ``r // (tp / Hkv)``), as vLLM's
  ``QKVParallelLinear`` does;
- ``linear_attn.conv1d.weight [C, 1, K]`` (or ``[C, K]``): the channels' q | k | v parts
  (:class:`~vllm_gdn_neuron.model.dims.GDNDims`) split separately, like ``in_proj_qkvz``;
- ``linear_attn.A_log``, ``linear_attn.dt_bias [Hv]``: split by value heads;
- row-parallel weights (``out_proj``, ``o_proj``, ``mlp.down_proj``, ``shared_expert.down_proj``):
  their input columns (dim 1) split;
- routed experts, either checkpoint layout: ``experts.gate_up_proj`` fused ``[E, 2 * I, H]``
  splits the gate and the up rows of every expert separately, one expert's gate or up
  ``[I, H]`` (the per-expert layout) its rows; ``experts.down_proj`` ``[E, H, I]`` or one
  expert's ``[H, I]`` its last dimension;
- ``lm_head.weight [V, H]``: the vocabulary rows, where the shell splits the vocabulary;
- anything else (embeddings, norms, routers, the vision tower ``visual.*``): replicated.

A rank holds its block of every part, back to back in part order. The vLLM shell's own parallel
layers (vLLM's merged / row-parallel linears, fused MoE, LM head) cut the same blocks themselves.

:func:`merged_loads` turns one checkpoint tensor (in Qwen3.5's flat names,
:func:`~vllm_gdn_neuron.model.checkpoint.flat_gdn_tensors`) into its parts of merged
projections; :func:`rank_rows` says where a part's rows lie for one rank. Any other tensor is
loaded into the parameter of its own name (``shard`` None).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_gdn_neuron.model.checkpoint import flat_gdn_tensors, split_flat_qkv
from vllm_gdn_neuron.model.dims import GDNDims


@dataclass(frozen=True)
class Split:
    """How one whole tensor splits over tensor-parallel ranks.

    Along ``dim`` the tensor is ``parts`` back to back. A part splits into ``tp`` equal
    contiguous blocks, block r going to rank r, except a part of key-value heads
    (``kv_heads`` not None for it): it splits into ``min(tp, heads)`` blocks, and rank r holds
    block ``r * blocks // tp`` (past one head per rank a head is replicated).

    Attributes:
        dim: the split dimension; None: every rank holds the whole tensor.
        parts: the sizes of the parts along ``dim``.
        kv_heads: per part, its key-value heads or None (empty: None for every part).
    """

    dim: int | None
    parts: tuple[int, ...] = ()
    kv_heads: tuple[int | None, ...] = ()

    def rank_slices(self, tp: int, rank: int) -> tuple[slice, ...]:
        """The rank's block of each part, in part order, as indices along ``dim`` of the whole tensor.

        The start-up checks (:func:`vllm_gdn_neuron.model.checks.check_text_config`) refuse a
        ``tp`` that does not divide the heads and sizes the parts are made of.

        Raises:
            ValueError: ``rank`` outside ``[0, tp)``.
        """
        if not 0 <= rank < tp:
            raise ValueError(f"rank must be in [0, tp={tp}); got {rank}")
        slices, start = [], 0
        for size, heads in zip(self.parts, self.kv_heads or (None,) * len(self.parts)):
            blocks = tp if heads is None else min(tp, heads)
            count = size // blocks
            block = rank * blocks // tp
            slices.append(slice(start + block * count, start + (block + 1) * count))
            start += size
        return tuple(slices)

    def take(self, tensor: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
        """The rank's share of the whole ``tensor``: its blocks of every part, concatenated along ``dim``."""
        if self.dim is None or tp == 1:
            return tensor
        pieces = [tensor.narrow(self.dim, piece.start, piece.stop - piece.start)
                  for piece in self.rank_slices(tp, rank)]
        return torch.cat(pieces, dim=self.dim) if len(pieces) > 1 else pieces[0]


REPLICATED = Split(None)


def _gdn_qkvz_sizes(config) -> tuple[int, ...]:
    dims = GDNDims.from_config(config)
    return dims.key_dim, dims.key_dim, dims.value_dim, dims.value_dim


def _gdn_ba_sizes(config) -> tuple[int, ...]:
    heads = GDNDims.from_config(config).num_v_heads
    return heads, heads


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

    def split(self, text_config) -> Split:
        """How the whole merged weight (or bias) splits: its rows, part by part."""
        sizes = self.part_sizes(text_config)
        heads = tuple(text_config.num_key_value_heads if part in self.by_kv_heads else None
                      for part in range(len(sizes)))
        return Split(0, sizes, heads)


GDN_QKVZ = MergedProjection("linear_attn.in_proj_qkvz", (0, 1, 2, 3), _gdn_qkvz_sizes)
GDN_BA = MergedProjection("linear_attn.in_proj_ba", (0, 1), _gdn_ba_sizes)
ATTENTION_QKV = MergedProjection("self_attn.qkv_proj", ("q", "k", "v"), _attention_qkv_sizes, by_kv_heads=(1, 2))
MLP_GATE_UP = MergedProjection("mlp.gate_up_proj", (0, 1), _mlp_gate_up_sizes)
SHARED_EXPERT_GATE_UP = MergedProjection("shared_expert.gate_up_proj", (0, 1), _shared_expert_gate_up_sizes)
MERGED_PROJECTIONS = (GDN_QKVZ, GDN_BA, ATTENTION_QKV, MLP_GATE_UP, SHARED_EXPERT_GATE_UP)

# Weights whose input columns (dim 1) split: their matmul's partial sums are reduced over ranks.
ROW_PARALLEL = (".out_proj.weight", ".o_proj.weight", "mlp.down_proj.weight", "shared_expert.down_proj.weight")
# Per-value-head vectors of a GatedDeltaNet layer.
HEAD_VECTORS = (".A_log", ".dt_bias")


def parameter_split(name: str, shape: tuple[int, ...], text_config, vocab_split: bool = False) -> Split:
    """How the whole tensor of parameter ``name`` splits over tensor-parallel ranks.

    Args:
        name: the parameter's name (``model.layers.0.linear_attn.conv1d.weight``; ``visual.*``
            for the vision tower).
        shape: the whole tensor's shape (it tells the routed experts' two layouts apart).
        text_config: the text decoder's config.
        vocab_split: whether ``lm_head.weight`` is split by vocabulary rows (else replicated).
    """
    if name.startswith("visual."):
        return REPLICATED
    for merged in MERGED_PROJECTIONS:
        if f".{merged.name}." in name:
            return merged.split(text_config)
    if name.endswith(".conv1d.weight"):
        dims = GDNDims.from_config(text_config)
        return Split(0, (dims.key_dim, dims.key_dim, dims.value_dim))
    if name.endswith(HEAD_VECTORS):
        return Split(0, (GDNDims.from_config(text_config).num_v_heads,))
    if name.endswith(ROW_PARALLEL):
        return Split(1, (shape[1],))
    if name.endswith(".experts.gate_up_proj"):
        # gate rows then up rows ([E, 2I, H] fused, or [2I, H] one expert's), or one expert's gate or up [I, H]
        inter = text_config.moe_intermediate_size
        return Split(len(shape) - 2, (inter, inter) if shape[-2] == 2 * inter else (shape[-2],))
    if name.endswith(".experts.down_proj"):  # [E, H, I] or one expert's [H, I]
        return Split(len(shape) - 1, (shape[-1],))
    if name == "lm_head.weight" and vocab_split:
        return Split(0, (shape[0],))
    return REPLICATED


def rank_share(name: str, tensor: torch.Tensor, text_config, tp: int, rank: int,
               vocab_split: bool = False) -> torch.Tensor:
    """The slice of the whole ``tensor`` of parameter ``name`` that rank ``rank`` of ``tp`` holds
    (:func:`parameter_split`).

    Raises:
        ValueError: naming the parameter, when the tensor's size along the split dimension is not
            the sum of its parts.
    """
    split = parameter_split(name, tuple(tensor.shape), text_config, vocab_split)
    if split.dim is not None and tp > 1 and tensor.shape[split.dim] != sum(split.parts):
        raise ValueError(f"{name}: the whole tensor must have {sum(split.parts)} entries along dim {split.dim} "
                         f"(parts {split.parts}); got shape {tuple(tensor.shape)}")
    return split.take(tensor, tp, rank)


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


def checkpoint_modules(module: str) -> tuple[str, ...]:
    """The checkpoint modules (Qwen3.5's flat names) a module of this layout is loaded from: a merged
    projection's parts (``...self_attn.qkv_proj`` -> its ``q_proj``, ``k_proj``, ``v_proj``), the routed
    experts' projections (expert 0's standing for all), or the module itself."""
    if module.endswith(".mlp.experts"):
        return tuple(f"{module}.0.{proj}" for proj in ("gate_proj", "up_proj", "down_proj"))
    parts = tuple(module[: -len(merged.name)] + flat for flat, merged, _ in _CHECKPOINT_PARTS
                  if module.endswith("." + merged.name))
    return parts or (module,)


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
    split = merged.split(text_config)
    blocks = split.rank_slices(tp, rank)
    part_start = sum(split.parts[:part])
    offset = sum(block.stop - block.start for block in blocks[:part])
    count = blocks[part].stop - blocks[part].start
    return slice(blocks[part].start - part_start, blocks[part].stop - part_start), slice(offset, offset + count)
