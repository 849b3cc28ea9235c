"""The per-step object the Neuron shell's mixers read (one per traced forward)."""

from dataclasses import dataclass

import torch


@dataclass
class NeuronStep:
    """One step's inputs beyond the hidden states.

    Attributes:
        positions: ``[T]`` int64 cache positions (context and causality).
        rope_positions: ``[T]`` positions, or ``[3, T]`` M-RoPE positions, the rotary embedding
            turns q and k by (they differ from ``positions`` for image tokens and after them).
        attn_metadata: the runner's per-layer dicts.
        is_decode: ``width`` tokens per block-table row (else the rows' prompts packed end to end).
        width: tokens per decode row: 1, or 1 + N in a verify step.
        pending: a verify step's list that takes each GDN layer's states to write once the
            drafts are judged (:mod:`.spec_decode`); None otherwise.
    """

    positions: torch.Tensor
    rope_positions: torch.Tensor
    attn_metadata: dict
    is_decode: bool
    width: int = 1
    pending: list | None = None

    def layer_metadata(self, name: str) -> dict:
        """The ``attn_metadata`` entry of layer ``name``.

        Raises:
            ValueError: naming the layer, when the step has no entry for it.
        """
        if name not in self.attn_metadata:
            raise ValueError(f"attn_metadata has no entry for layer {name!r}: the step cannot advance its cache")
        return self.attn_metadata[name]
