"""The KV-cache half of the runner stand-in: specs, hybrid page alignment, the planner, allocation.

Facts read (not copied) from whn09/vllm-neuron @ ``7ea992789fa624ea6b0d7ad4cb0789e784863904``:

- ``vllm_neuron/vllm/platform.py``, ``NeuronPlatform.update_block_size_for_backend`` and
  ``_align_hybrid_page_sizes``: block size 32 unless the user set one, then vLLM's
  ``Platform._align_hybrid_block_size`` with a backend whose kernel block sizes are
  ``[MultipleOf(32)]``: the attention block grows to ``32 * cdiv(state_page, 32 * token_page)``
  tokens and ``cache_config.mamba_page_size_padded`` becomes that attention page.
- ``vllm_neuron/vllm/worker/neuron_model_runner.py``, ``get_kv_cache_spec``: a
  ``FullAttentionSpec(block_size, num_kv_heads, head_size, kv_cache_dtype)`` per
  ``KVSpec.layers`` entry, a ``MambaSpec(shapes, dtypes, block_size=mamba_block_size,
  page_size_padded=mamba_page_size_padded)`` per ``KVSpec.recurrent_layers`` entry;
  ``initialize_kv_cache``: one ``torch.zeros(tensor.size + 2 * page_bytes, dtype=int8)`` per
  ``KVCacheTensor`` (the model is ``kv_cache_page_major``), bound to every layer in its
  ``shared_by``; ``raw.view(dtype)`` made once per (buffer, dtype); attention layers get
  ``[P, 2, Hkv, B, D]`` of it, recurrent layers ``[P, page_bytes // widest]`` in their widest
  state dtype; then ``model.bind_kv_cache(kv_caches)``.

The planner is vLLM's hybrid rule (``vllm/v1/core/kv_cache_utils.py``,
``_get_kv_cache_groups_uniform_page_size`` and ``get_kv_cache_config_from_groups``): layers of
one spec type in groups of ``group_size`` layers, one ``KVCacheTensor`` per position in a
group shared by that position's layer of every group, ``num_blocks`` pages each.
"""

import dataclasses
import math

import torch

# Neuron's default block size and the kernel block alignment the platform declares.
NEURON_BLOCK_ALIGNMENT = 32
# Pages the runner appends past num_blocks for a kv_cache_page_major model.
RESERVED_PAGES = 2


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """vLLM's ``FullAttentionSpec`` fields the runner sets."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """vLLM's ``MambaSpec`` fields the runner sets."""

    shapes: tuple
    dtypes: tuple
    block_size: int
    page_size_padded: int | None

    @property
    def real_page_size_bytes(self) -> int:
        return sum(math.prod(s) * d.itemsize for s, d in zip(self.shapes, self.dtypes))

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded if self.page_size_padded is not None else self.real_page_size_bytes


def align_hybrid_pages(kv_spec, user_block_size: int | None, kv_cache_dtype: torch.dtype) -> tuple[int, int | None]:
    """``(block_size, mamba_page_size_padded)`` after the platform's hybrid alignment.

    Args:
        kv_spec: the model's ``get_kv_spec()``.
        user_block_size: ``--block-size`` or None (then 32).
        kv_cache_dtype: the attention cache dtype (the model dtype for ``kv-cache-dtype auto``).
    """
    block_size = user_block_size or NEURON_BLOCK_ALIGNMENT
    if not kv_spec.recurrent_layers:
        return block_size, None
    layer = kv_spec.layers[0]
    token_page = AttentionSpec(1, layer.num_kv_heads, layer.head_size, kv_cache_dtype).page_size_bytes
    first = kv_spec.recurrent_layers[0]
    state_page = StateSpec(tuple(first.shapes), tuple(first.dtypes), -1, None).real_page_size_bytes
    alignment = max(NEURON_BLOCK_ALIGNMENT, block_size)
    block_size = max(block_size, alignment * math.ceil(state_page / (alignment * token_page)))
    return block_size, block_size * token_page


def cache_specs(kv_spec, block_size: int, mamba_block_size: int, mamba_page_size_padded: int | None,
                kv_cache_dtype: torch.dtype) -> dict:
    """The runner's ``get_kv_cache_spec``: layer name -> spec (attention layers first)."""
    specs = {layer.name: AttentionSpec(block_size, layer.num_kv_heads, layer.head_size, kv_cache_dtype)
             for layer in kv_spec.layers}
    for layer in kv_spec.recurrent_layers:
        specs[layer.name] = StateSpec(tuple(layer.shapes), tuple(layer.dtypes), mamba_block_size,
                                      mamba_page_size_padded)
    return specs


@dataclasses.dataclass
class CacheGroup:
    spec: object
    layer_names: list[str]

    @property
    def is_attention(self) -> bool:
        return isinstance(self.spec, AttentionSpec)


@dataclasses.dataclass
class CacheTensor:
    size: int
    shared_by: list[str]


def plan_groups(specs: dict, num_blocks: int) -> tuple[list[CacheGroup], list[CacheTensor]]:
    """vLLM's hybrid grouping and tensor sharing for ``num_blocks`` blocks per tensor."""
    by_type: dict = {}
    for name, spec in specs.items():
        by_type.setdefault(spec, []).append(name)
    sizes = {spec.page_size_bytes for spec in by_type}
    if len(sizes) != 1:
        raise ValueError(f"page sizes {sorted(sizes)} are not unified: the hybrid alignment failed")
    (page_bytes,) = sizes
    counts = [len(names) for names in by_type.values()]
    group_size = min(counts)
    if max(counts) < 1.25 * min(counts):  # vLLM pads the smaller types rather than split the larger ones
        group_size = max(counts)
    groups = [CacheGroup(spec, names[start:start + group_size])
              for spec, names in by_type.items() for start in range(0, len(names), group_size)]
    tensors = [CacheTensor(page_bytes * num_blocks, [g.layer_names[i] for g in groups if i < len(g.layer_names)])
               for i in range(group_size)]
    return groups, tensors


def initialize_kv_cache(model, groups: list[CacheGroup], tensors: list[CacheTensor]) -> dict:
    """The runner's page-major ``initialize_kv_cache``: shared int8 buffers, dtype views, ``bind_kv_cache``."""
    page_bytes = groups[0].spec.page_size_bytes
    raw_of = {}
    for tensor in tensors:
        raw = torch.zeros(tensor.size + RESERVED_PAGES * page_bytes, dtype=torch.int8)
        for name in tensor.shared_by:
            raw_of[name] = raw
    typed: dict = {}

    def dtype_view(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        key = (id(raw), dtype)
        if key not in typed:
            typed[key] = raw.view(dtype)
        return typed[key]

    kv_caches = {}
    for group in groups:
        spec = group.spec
        for name in group.layer_names:
            raw = raw_of[name]
            num_pages = raw.numel() // page_bytes
            if group.is_attention:
                used = spec.page_size_bytes
                if used != page_bytes:
                    raise NotImplementedError(f"{name}: K/V use {used} of a {page_bytes}-byte page")
                kv_caches[name] = [dtype_view(raw, spec.dtype).view(num_pages, 2, spec.num_kv_heads,
                                                                     spec.block_size, spec.head_size)]
            else:
                widest = max(spec.dtypes, key=lambda d: d.itemsize)
                if spec.real_page_size_bytes > page_bytes or page_bytes % widest.itemsize:
                    raise NotImplementedError(f"{name}: states of {spec.real_page_size_bytes} bytes in a "
                                              f"{page_bytes}-byte page")
                kv_caches[name] = [dtype_view(raw, widest).view(num_pages, page_bytes // widest.itemsize)]
    model.bind_kv_cache(kv_caches)
    return kv_caches
