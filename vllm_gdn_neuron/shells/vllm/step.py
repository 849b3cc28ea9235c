"""The per-step object the vLLM shell's mixers read (one per model forward)."""

import torch


class EngineStep:
    """One forward's inputs beyond the hidden states.

    Attributes:
        positions: ``[T]`` (or ``[3, T]`` M-RoPE) token positions, for the attention layers.

    vLLM hands every GatedDeltaNet layer of a kv-cache group the same metadata object; the
    ops' metadata built from it (:func:`.gated_deltanet.engine_step`, host-checked) is kept
    here for the other layers of the step, and dropped with the step.
    """

    def __init__(self, positions: torch.Tensor) -> None:
        self.positions = positions
        self._gdn_parts: dict[int, tuple[object, object]] = {}

    def gdn_parts(self, metadata, num_pages: int, build):
        """``build(metadata, num_pages)``, once per metadata object of this step."""
        entry = self._gdn_parts.get(id(metadata))
        if entry is None or entry[0] is not metadata:
            entry = self._gdn_parts[id(metadata)] = (metadata, build(metadata, num_pages))
        return entry[1]
