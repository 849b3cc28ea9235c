"""The Qwen3.5 / Qwen3-Next hybrid decoder, built once for both shells.

Every layer is a token mixer (GatedDeltaNet for ``linear_attention`` layers, gated full
attention for ``full_attention`` layers, per ``config.layer_types``) followed by a
feed-forward block (dense SwiGLU, or the routed experts + shared expert on the layers the
config marks sparse), each behind a zero-centred RMSNorm with the residual added in the norm:

```
x = embed(ids)
for layer:  h, r = norm_in(x, r); h = mixer(h, step); h, r = norm_post(h, r); x = reduce(ffn(h))
hidden = norm(x, r)                   # -> the LM head (model/causal_lm.py)
```

What differs between engines is injected by a shell's :class:`DecoderParts`: the embedding,
the norms' dtype, the two mixers over the engine's cache, the feed-forward blocks with their
sharding, the collective after the feed-forward (vLLM's row-parallel linears reduce inside;
the Neuron shell all-reduces here), and the LM head with its logits. The per-step inputs the
mixers read (positions, the engine's metadata, ...) travel as one shell-defined ``step``
object, so the layer's forward is one function for every engine.
"""

from collections.abc import Callable

import torch
from torch import nn

from vllm_gdn_neuron.model.dims import is_sparse_layer

#: The values ``config.layer_types`` may hold.
LAYER_TYPES = ("linear_attention", "full_attention")


class DecoderParts:
    """The engine-specific modules a shell builds for :class:`DecoderLayer` and :class:`TextModel`.

    Each ``prefix`` is the module's dotted name in the model (``model.layers.3.self_attn``):
    the key of the layer's cache and metadata in the engine. The mixers' ``forward`` takes
    ``(hidden [T, H], step)``, the feed-forward blocks' ``(hidden [T, H])``.
    """

    #: Applied to each feed-forward block's output (a tensor-parallel all-reduce), or None.
    feed_forward_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None

    def embedding(self, config) -> nn.Module:
        raise NotImplementedError

    def norm(self, hidden_size: int, eps: float) -> nn.Module:
        """A :class:`~vllm_gdn_neuron.model.norms.ZeroCentredRMSNorm` in the shell's dtype."""
        raise NotImplementedError

    def linear_attention(self, config, prefix: str) -> nn.Module:
        raise NotImplementedError

    def full_attention(self, config, prefix: str) -> nn.Module:
        raise NotImplementedError

    def dense_mlp(self, config, prefix: str) -> nn.Module:
        raise NotImplementedError

    def sparse_moe(self, config, prefix: str) -> nn.Module:
        raise NotImplementedError

    def replicated_linear(self, in_features: int, out_features: int, prefix: str) -> nn.Module:
        """A bias-free linear layer whose ``[T, out]`` output is whole on every rank (the MTP head's ``fc``)."""
        raise NotImplementedError

    def lm_head(self, config, tied_embedding: nn.Module | None) -> nn.Module:
        """The LM head (``lm_head.weight`` in the checkpoint), sharing ``tied_embedding``'s weight
        where the shell can (or loading a copy of it), or its own weight when that is None."""
        raise NotImplementedError

    def logits_processor(self, config) -> nn.Module:
        """The module whose ``forward(lm_head, hidden [R, H])`` returns the ``[R, V]`` logits over the
        whole vocabulary."""
        raise NotImplementedError


class DecoderLayer(nn.Module):
    """One block: token mixer + feed-forward, pre-norm, the residual added in the norms.

    Args:
        config: the Hugging Face text config.
        layer_idx: the layer's index (its ``layer_types`` entry and feed-forward rule).
        prefix: the layer's dotted name (``model.layers.{layer_idx}``).
        parts: the shell's :class:`DecoderParts`.
        layer_type: overrides ``config.layer_types[layer_idx]`` (the MTP head's layer is
            full attention with layer 0's feed-forward rule).

    Raises:
        ValueError: naming ``layer_types``, for a type other than :data:`LAYER_TYPES`.
    """

    def __init__(self, config, layer_idx: int, prefix: str, parts: DecoderParts,
                 layer_type: str | None = None) -> None:
        super().__init__()
        self.layer_type = layer_type or config.layer_types[layer_idx]
        if self.layer_type not in LAYER_TYPES:
            raise ValueError(f"layer_types[{layer_idx}] must be one of {LAYER_TYPES}; got {self.layer_type!r}")
        self.is_linear = self.layer_type == "linear_attention"
        if self.is_linear:
            self.linear_attn = parts.linear_attention(config, f"{prefix}.linear_attn")
        else:
            self.self_attn = parts.full_attention(config, f"{prefix}.self_attn")
        if is_sparse_layer(config, layer_idx):
            self.mlp = parts.sparse_moe(config, f"{prefix}.mlp")
        else:
            self.mlp = parts.dense_mlp(config, f"{prefix}.mlp")
        self.feed_forward_reduce = parts.feed_forward_reduce
        self.input_layernorm = parts.norm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = parts.norm(config.hidden_size, config.rms_norm_eps)

    @property
    def mixer(self) -> nn.Module:
        """The layer's token mixer (``linear_attn`` or ``self_attn``)."""
        return self.linear_attn if self.is_linear else self.self_attn

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, step) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, H]`` hidden states and residual (None before the first layer) in, the same out
        (the residual not yet added to the output); ``step`` is the shell's per-step object."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.mixer(hidden, step)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        hidden = self.mlp(hidden)
        if self.feed_forward_reduce is not None:
            hidden = self.feed_forward_reduce(hidden)
        return hidden, residual


class TextModel(nn.Module):
    """Embeddings, the decoder layers and the final norm (``model.*`` in the checkpoint).

    Args:
        config: the Hugging Face text config.
        parts: the shell's :class:`DecoderParts`.
        prefix: the dotted name of the model (``model``).
    """

    def __init__(self, config, parts: DecoderParts, prefix: str = "model") -> None:
        super().__init__()
        self.embed_tokens = parts.embedding(config)
        self.layers = nn.ModuleList(
            DecoderLayer(config, idx, f"{prefix}.layers.{idx}", parts) for idx in range(config.num_hidden_layers)
        )
        self.norm = parts.norm(config.hidden_size, config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` token embeddings of ``[T]`` ids."""
        return self.embed_tokens(input_ids)

    def forward(self, hidden: torch.Tensor, step) -> torch.Tensor:
        """``[T, H]`` input embeddings -> ``[T, H]`` final hidden states (normed)."""
        residual = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, step)
        hidden, _ = self.norm(hidden, residual)
        return hidden

