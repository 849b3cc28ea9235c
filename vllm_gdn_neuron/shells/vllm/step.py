"""The per-step state the vLLM shell's mixers share: the positions, and the ops' metadata of the step."""

import torch

#: The key of the shell's per-forward store in vLLM's ``ForwardContext.additional_kwargs``.
GDN_PARTS_KEY = "vllm_gdn_neuron.gdn_parts"


class EngineStep:
    """One forward's inputs beyond the hidden states, built inside the traced forward.

    Attributes:
        positions: ``[T]`` (or ``[3, T]`` M-RoPE) token positions, for the attention layers.
    """

    def __init__(self, positions: torch.Tensor) -> None:
        self.positions = positions


def step_gdn_parts(forward_context, metadata, num_pages: int, build):
    """``build(metadata, num_pages)``, once per metadata object of one forward.

    vLLM hands every GatedDeltaNet layer of a kv-cache group the same metadata object; the
    ops' metadata built from it (:func:`.gated_deltanet.engine_step`, host-checked) is kept
    in the forward's own ``ForwardContext`` (vLLM makes one per forward) for the other layers
    of the step, and dropped with it. The mixers' cores run eagerly (a custom op), so this
    runs on the host in compiled mode too.
    """
    store = forward_context.additional_kwargs.setdefault(GDN_PARTS_KEY, {})
    entry = store.get(id(metadata))
    if entry is None or entry[0] is not metadata:
        entry = store[id(metadata)] = (metadata, build(metadata, num_pages))
    return entry[1]
