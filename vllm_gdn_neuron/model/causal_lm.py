"""The causal-LM head over a decoder, built once for both shells.

```
hidden = model(embed(ids), step)           # the TextModel, or the MTP head's decoder
logits = logits_processor(lm_head, hidden)  # [R, H] rows the engine samples -> [R, V]
```

The shell's :class:`~vllm_gdn_neuron.model.decoder.DecoderParts` builds the LM head (its
vocabulary sharding, tied to the embedding or not) and the module that turns hidden rows into
whole-vocabulary logits (vLLM's ``LogitsProcessor``; on Neuron, the matmul and the gather of
the vocabulary shards). How a tied head shares the embedding is the shell's: vLLM shares the
parameter; the Neuron shell, whose embedding is replicated while the head may be split by
vocabulary, loads a copy of it.
"""

import torch
from torch import nn

from vllm_gdn_neuron.model.decoder import DecoderParts


def ties_word_embeddings(hf_config) -> bool:
    """Whether the LM head is the embedding (``tie_word_embeddings`` of the checkpoint's config,
    or of its ``text_config`` for a vision-language checkpoint)."""
    text_config = getattr(hf_config, "text_config", None)
    return bool(getattr(hf_config, "tie_word_embeddings", False)
                or getattr(text_config, "tie_word_embeddings", False))


class CausalLM(nn.Module):
    """A decoder (``model``, with ``embed_tokens``) under the LM head.

    Args:
        config: the Hugging Face text config (``vocab_size``, ``hidden_size``).
        parts: the shell's :class:`DecoderParts` (``lm_head``, ``logits_processor``).
        model: the decoder, built from the same parts.
        tie_word_embeddings: whether the head is the embedding (:func:`ties_word_embeddings`).
    """

    def __init__(self, config, parts: DecoderParts, model: nn.Module, tie_word_embeddings: bool) -> None:
        super().__init__()
        self.config = config
        self.model = model
        self.tie_word_embeddings = tie_word_embeddings
        self.lm_head = parts.lm_head(config, model.embed_tokens if tie_word_embeddings else None)
        self.logits_processor = parts.logits_processor(config)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` token embeddings of ``[T]`` ids."""
        return self.model.embed_tokens(input_ids)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """``[R, V]`` logits over the whole vocabulary of ``[R, H]`` final hidden states."""
        return self.logits_processor(self.lm_head, hidden_states)
