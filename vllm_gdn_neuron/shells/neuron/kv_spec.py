"""vllm-neuron's cache spec classes: the real ones when vllm-neuron is installed, else stand-ins.

The stand-ins carry exactly the fields of the pinned ``vllm_neuron/model/kv_cache.py``
(see :mod:`.contract`), in the same order and with the same defaults, so a spec
built here reads the same to the runner as one built from the real classes.
"""

from dataclasses import dataclass, field

import torch

try:  # on a Neuron host
    from vllm_neuron.model.kv_cache import KVSpec, LayerSpec, RecurrentLayerSpec

    STAND_INS = False
except ImportError:
    STAND_INS = True

    @dataclass
    class LayerSpec:
        """One attention layer's paged KV cache (pinned fields)."""

        name: str
        num_kv_heads: int
        head_size: int
        dtype: torch.dtype
        sliding_window_size: int | None = None
        chunk_size: int | None = None

    @dataclass
    class RecurrentLayerSpec:
        """One recurrent layer's fixed-size per-sequence states (pinned fields).

        ``shapes`` and ``dtypes`` are per tensor-parallel rank, one entry per state.
        """

        name: str
        shapes: tuple[tuple[int, ...], ...]
        dtypes: tuple[torch.dtype, ...]

    @dataclass
    class KVSpec:
        """The whole model's cache needs (pinned fields)."""

        layers: list[LayerSpec]
        recurrent_layers: list[RecurrentLayerSpec] = field(default_factory=list)


__all__ = ["KVSpec", "LayerSpec", "RecurrentLayerSpec", "STAND_INS"]
