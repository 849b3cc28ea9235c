"""The dimensions of a Qwen3.5 / Qwen3.5-MoE / Qwen3-Next text decoder, read from its config.

One statement of what a config says about the model's shape, for the two shells (which
layers are GatedDeltaNet or attention, which feed-forwards are MoE), the start-up checks of
``vllm-gdn-serve`` (``checkpoint``) and the trn2 memory arithmetic (``sizing``): the layer
kinds, the MoE rule and the parameter count of the text decoder as the Hugging Face
checkpoint holds it, and one rank's share of a GatedDeltaNet layer (:class:`GDNDims`).
Reads config fields only: no torch import, no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def config_layer_types(text) -> tuple[str, ...]:
    """Each layer's kind: the config's ``layer_types``, else every ``full_attention_interval``-th
    layer full attention (Qwen3_5TextConfig builds ``layer_types`` itself; older Qwen3-Next
    configs may not)."""
    if getattr(text, "layer_types", None):
        return tuple(text.layer_types)
    interval = text.full_attention_interval
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(text.num_hidden_layers))


def check_layer_types(config) -> None:
    """Refuse a stack with a layer type neither shell implements.

    Raises:
        ValueError: naming ``layer_types[i]`` and the value given.
    """
    for idx, layer_type in enumerate(config_layer_types(config)):
        if layer_type not in ("linear_attention", "full_attention"):
            raise ValueError(
                f"layer_types[{idx}] must be 'linear_attention' or 'full_attention'; got {layer_type!r}"
            )


def is_sparse_layer(config, layer_idx: int) -> bool:
    """Whether layer ``layer_idx`` uses the MoE block (Qwen3-Next / Qwen3.5-MoE rule)."""
    return (
        (getattr(config, "num_experts", 0) or 0) > 0
        and layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
        and (layer_idx + 1) % (getattr(config, "decoder_sparse_step", 1) or 1) == 0
    )


@dataclass(frozen=True)
class GDNDims:
    """Head counts and sizes of one tensor-parallel rank's share of a GatedDeltaNet layer.

    Attributes:
        num_k_heads, num_v_heads: Hk and Hv on this rank.
        head_k_dim, head_v_dim: Dk and Dv.
        conv_kernel: K, the short conv's width.
    """

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int

    @classmethod
    def from_config(cls, config, tp_size: int = 1) -> "GDNDims":
        return cls(
            config.linear_num_key_heads // tp_size,
            config.linear_num_value_heads // tp_size,
            config.linear_key_head_dim,
            config.linear_value_head_dim,
            config.linear_conv_kernel_dim,
        )

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """C = 2 * Hk * Dk + Hv * Dv, the conv channels (q | k | v)."""
        return 2 * self.key_dim + self.value_dim

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[N, C]`` conv output -> q, k ``[N, Hk, Dk]`` and v ``[N, Hv, Dv]``."""
        n = x.shape[0]
        q, k, v = x.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return (
            q.reshape(n, self.num_k_heads, self.head_k_dim),
            k.reshape(n, self.num_k_heads, self.head_k_dim),
            v.reshape(n, self.num_v_heads, self.head_v_dim),
        )


@dataclass(frozen=True)
class ModelDims:
    """The dimensions of a Qwen3.5 / Qwen3.5-MoE / Qwen3-Next text decoder that size its memory."""

    name: str
    source: str
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    tie_word_embeddings: bool
    intermediate_size: int = 0
    num_experts: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    attention_bias: bool = False

    @classmethod
    def from_hf(cls, config, name: str, source: str) -> "ModelDims":
        """From a transformers config (a ``text_config`` is used when the config has one)."""
        text = getattr(config, "text_config", None) or config
        return cls(
            name=name,
            source=source,
            vocab_size=text.vocab_size,
            hidden_size=text.hidden_size,
            layer_types=config_layer_types(text),
            num_attention_heads=text.num_attention_heads,
            num_key_value_heads=text.num_key_value_heads,
            head_dim=text.head_dim,
            linear_num_key_heads=text.linear_num_key_heads,
            linear_num_value_heads=text.linear_num_value_heads,
            linear_key_head_dim=text.linear_key_head_dim,
            linear_value_head_dim=text.linear_value_head_dim,
            linear_conv_kernel_dim=text.linear_conv_kernel_dim,
            tie_word_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
            intermediate_size=getattr(text, "intermediate_size", 0) or 0,
            num_experts=getattr(text, "num_experts", 0) or 0,
            moe_intermediate_size=getattr(text, "moe_intermediate_size", 0) or 0,
            shared_expert_intermediate_size=getattr(text, "shared_expert_intermediate_size", 0) or 0,
            decoder_sparse_step=getattr(text, "decoder_sparse_step", 1) or 1,
            mlp_only_layers=tuple(getattr(text, "mlp_only_layers", ()) or ()),
            attention_bias=bool(getattr(text, "attention_bias", False)),
        )

    @property
    def num_gdn_layers(self) -> int:
        return self.layer_types.count("linear_attention")

    @property
    def num_attention_layers(self) -> int:
        return self.layer_types.count("full_attention")

    @property
    def conv_channels(self) -> int:
        """Channels of the depthwise conv: q, k and v concatenated (:attr:`GDNDims.conv_dim`)."""
        return GDNDims.from_config(self).conv_dim

    def is_moe_layer(self, index: int) -> bool:
        return is_sparse_layer(self, index)


@dataclass(frozen=True)
class WeightCount:
    """Parameter counts: ``split`` are divided by the TP size, ``replicated`` are not."""

    split: int
    replicated: int
    kv_projections: int  # k_proj + v_proj: split by heads, replicated past one head per core

    @property
    def total(self) -> int:
        return self.split + self.replicated + self.kv_projections

    def per_core(self, dims: ModelDims, tp: int) -> float:
        kv_heads_per_core = max(1, dims.num_key_value_heads // tp)
        return self.split / tp + self.replicated + self.kv_projections * kv_heads_per_core / dims.num_key_value_heads


def count_weights(dims: ModelDims) -> WeightCount:
    """Parameters of the text decoder, layer by layer, as the Hugging Face checkpoint holds them."""
    h, d = dims.hidden_size, dims.head_dim
    split = dims.vocab_size * h * (1 if dims.tie_word_embeddings else 2)
    replicated = h  # the final norm
    kv = 0
    hv = dims.linear_num_value_heads
    value_width = hv * dims.linear_value_head_dim
    for index, kind in enumerate(dims.layer_types):
        replicated += 2 * h  # input and post-attention norms
        if kind == "linear_attention":
            # in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, dt_bias, A_log, out_proj
            split += h * dims.conv_channels + h * value_width + 2 * h * hv
            split += dims.conv_channels * dims.linear_conv_kernel_dim + 2 * hv + value_width * h
            replicated += dims.linear_value_head_dim  # the gated norm's weight
        else:
            # q_proj (query and output gate), o_proj; q_norm, k_norm; k_proj, v_proj; with
            # attention_bias, biases on all four (o_proj's added after the reduction: replicated)
            bias = 1 if dims.attention_bias else 0
            split += (h + bias) * dims.num_attention_heads * d * 2 + dims.num_attention_heads * d * h
            replicated += 2 * d + bias * h
            kv += 2 * (h + bias) * dims.num_key_value_heads * d
        if dims.is_moe_layer(index):
            split += dims.num_experts * 3 * h * dims.moe_intermediate_size
            split += 3 * h * dims.shared_expert_intermediate_size
            replicated += dims.num_experts * h + h  # router, shared-expert gate (there even at size 0)
        else:
            split += 3 * h * dims.intermediate_size
    return WeightCount(split=split, replicated=replicated, kv_projections=kv)


def count_fp8_weights(dims: ModelDims, block_size: tuple[int, int]) -> tuple[int, int]:
    """``(elements, blocks)`` of the text decoder's weights a block-FP8 checkpoint quantizes
    (:data:`vllm_gdn_neuron.model.fp8.QUANTIZED_PROJECTIONS` and every routed expert), and of their
    block scales (``ceil(N / Bn) * ceil(K / Bk)`` per weight), layer by layer as the checkpoint holds them."""
    h, d = dims.hidden_size, dims.head_dim
    value_width = dims.linear_num_value_heads * dims.linear_value_head_dim
    weights: list[tuple[int, int, int]] = []  # (count, N, K)
    for index, kind in enumerate(dims.layer_types):
        if kind == "linear_attention":  # in_proj_qkv, in_proj_z, out_proj
            weights += [(1, dims.conv_channels, h), (1, value_width, h), (1, h, value_width)]
        else:  # q_proj (query and gate), k_proj, v_proj, o_proj
            kv = dims.num_key_value_heads * d
            weights += [(1, 2 * dims.num_attention_heads * d, h), (2, kv, h), (1, h, dims.num_attention_heads * d)]
        if dims.is_moe_layer(index):
            for count, inner in ((dims.num_experts, dims.moe_intermediate_size), (1, dims.shared_expert_intermediate_size)):
                weights += [(2 * count, inner, h), (count, h, inner)]  # gate, up | down
        else:
            weights += [(2, dims.intermediate_size, h), (1, h, dims.intermediate_size)]
    rows, cols = block_size
    elements = sum(count * n * k for count, n, k in weights)
    blocks = sum(count * -(-n // rows) * -(-k // cols) for count, n, k in weights if n and k)
    return elements, blocks


def count_vision_weights(vision_config) -> int:
    """Parameters of the vision tower (:class:`vllm_gdn_neuron.model.vision.VisionTower`),
    from a ``vision_config`` (an object or a dict with its fields), as the checkpoint holds them."""
    get = vision_config.get if isinstance(vision_config, dict) else lambda key: getattr(vision_config, key)
    e, i, out = get("hidden_size"), get("intermediate_size"), get("out_hidden_size")
    patch = get("in_channels") * get("temporal_patch_size") * get("patch_size") ** 2
    merged = e * get("spatial_merge_size") ** 2
    embed = patch * e + e + get("num_position_embeddings") * e
    # norm1, norm2 (weight + bias); qkv, proj; fc1, fc2 (all with biases)
    block = 4 * e + (3 * e * e + 3 * e) + (e * e + e) + (e * i + i) + (i * e + e)
    merger = 2 * e + (merged * merged + merged) + (merged * out + out)
    return embed + get("depth") * block + merger
