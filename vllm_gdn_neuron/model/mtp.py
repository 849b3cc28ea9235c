"""The multi-token-prediction (MTP) head of Qwen3.5 / Qwen3-Next.

A speculative drafter: one extra full-attention decoder layer (with the MLP or MoE block of
layer 0's rule) that reads the target model's final hidden state at position i and the
embedding of the token at i + 1, and predicts the token at i + 2 through the target's
``lm_head``:

```
x = fc([pre_fc_norm_embedding(embed(t[i+1])) | pre_fc_norm_hidden(h[i])])   # [T, 2H] -> [T, H]
x, r = decoder layer(position i, x)        # full attention over the head's own KV cache
draft hidden = norm(x, r)                  # -> lm_head (shared with the target)
```

Checkpoints keep it under ``mtp.`` (``mtp.fc``, ``mtp.pre_fc_norm_embedding``,
``mtp.pre_fc_norm_hidden``, ``mtp.layers.0.*``, ``mtp.norm``) beside the target's tensors,
whose embedding (and ``lm_head``) the head shares. :class:`MultiTokenPredictor` is the head,
built from a shell's :class:`~vllm_gdn_neuron.model.decoder.DecoderParts`.
"""

import torch
from torch import nn

from vllm_gdn_neuron.model.decoder import DecoderLayer, DecoderParts
from vllm_gdn_neuron.model.norms import ZeroCentredRMSNorm

#: The MTP layer counts this head serves (the published checkpoints ship one).
SUPPORTED_MTP_LAYERS = (1,)


def mtp_num_layers(text_config) -> int:
    """The MTP decoder layers a config declares (``mtp_num_hidden_layers`` for Qwen3.5,
    ``num_nextn_predict_layers`` for Qwen3-Next; 0 when neither is set)."""
    for key in ("mtp_num_hidden_layers", "num_nextn_predict_layers"):
        value = getattr(text_config, key, None)
        if value is not None:
            return int(value)
    return 0


def check_mtp_config(text_config) -> None:
    """Refuse a config whose MTP head this model definition cannot build.

    Raises:
        ValueError: naming the config field, what is supported and what was given.
    """
    layers = mtp_num_layers(text_config)
    if layers not in SUPPORTED_MTP_LAYERS:
        key = "num_nextn_predict_layers" if hasattr(text_config, "num_nextn_predict_layers") else \
            "mtp_num_hidden_layers"
        raise ValueError(
            f"speculative method 'mtp' needs the checkpoint's MTP head: {key} must be one of "
            f"{SUPPORTED_MTP_LAYERS} (a checkpoint without mtp.* tensors has none); got {key}={layers}"
        )


class MTPInputNorms(nn.Module):
    """The two norms in front of ``fc`` and their concatenation.

    Dimensions:
        T: tokens; H: hidden size.

    Parameters: ``pre_fc_norm_embedding.weight``, ``pre_fc_norm_hidden.weight`` [H]
    (zero-centred RMSNorms, checkpoint names under ``mtp.``).
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.pre_fc_norm_embedding = ZeroCentredRMSNorm(hidden_size, eps=eps)
        self.pre_fc_norm_hidden = ZeroCentredRMSNorm(hidden_size, eps=eps)

    def forward(self, embeds: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """``embeds`` [T, H] of the tokens at i + 1 and the target's ``hidden_states`` [T, H] at i
        -> ``fc``'s input [T, 2H] (embedding half first), in the activation dtype.

        Raises:
            ValueError: naming the argument, when the shapes disagree.
        """
        if embeds.shape != hidden_states.shape:
            raise ValueError(
                f"hidden_states: expected the shape of the token embeddings {tuple(embeds.shape)}, "
                f"got {tuple(hidden_states.shape)}"
            )
        return torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden_states)], dim=-1)


class MultiTokenPredictor(nn.Module):
    """The MTP head (``mtp.*`` in the checkpoint) with the embedding it reads.

    Dimensions:
        T: tokens; H: hidden size.

    Args:
        config: the Hugging Face text config (checked by :func:`check_mtp_config`).
        parts: the shell's :class:`~vllm_gdn_neuron.model.decoder.DecoderParts`.
        prefix: the head's dotted name (``mtp``).
    """

    def __init__(self, config, parts: DecoderParts, prefix: str) -> None:
        super().__init__()
        check_mtp_config(config)
        self.embed_tokens = parts.embedding(config)
        self.input_norms = MTPInputNorms(config.hidden_size, config.rms_norm_eps)
        self.fc = parts.replicated_linear(2 * config.hidden_size, config.hidden_size, prefix=f"{prefix}.fc")
        self.layers = nn.ModuleList(
            DecoderLayer(config, idx, f"{prefix}.layers.{idx}", parts, layer_type="full_attention")
            for idx in range(mtp_num_layers(config))
        )
        self.norm = parts.norm(config.hidden_size, config.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, hidden_states: torch.Tensor, step) -> torch.Tensor:
        """``embeds`` [T, H] of the tokens at i + 1, the target's [T, H] final hidden states at i
        and the shell's step object (positions i) -> [T, H] draft hidden states."""
        x = self.fc(self.input_norms(embeds, hidden_states))
        x, residual = self.layers[0](x, None, step)
        x, _ = self.norm(x, residual)
        return x
