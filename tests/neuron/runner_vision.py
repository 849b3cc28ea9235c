"""The runner stand-in's multimodal path: vision config, on-device encoder cache, vision inputs.

Read (facts only, no code copied) at whn09/vllm-neuron @
``7ea992789fa624ea6b0d7ad4cb0789e784863904``:

- ``vllm_neuron/model/neuron_config.py``: ``VisionNeuronConfig`` (``from_dict`` keys
  ``num_vision_tokens_buckets``, ``vision_attention_block_size`` (2048), ``tp_size``,
  ``dp_size``, ``max_vision_seq_len``, ``encoder_cache_num_blocks``,
  ``encoder_cache_min_hold_time_ms``; ``resolve_tp_dp(world_size)``);
- ``vllm_neuron/vllm/worker/neuron_model_runner.py``: ``__init__`` (the vision config, and
  the encoder cache when vLLM's multimodal registry says the model takes multimodal
  inputs), ``_init_encoder_cache`` (rows ``out_hidden_size * (1 + deep-stack levels)``
  wide, bfloat16, blocks of ``vision_attention_block_size // merge_factor`` rows,
  ``max_vision_blocks_per_request = ceil(max bucket // merge_factor / block)``, one
  scratch block), ``_execute_mm_encoder`` (uncached items of the step encoded into the
  cache; ``prompt_embeds`` items written with ``encoder_cache.put``),
  ``_gather_mm_embeddings`` (one request per prefill step; the blocks of every item
  overlapping the step's window, each row's token index or the sentinel ``T``; unused
  slots the scratch block), ``_build_prefill_synthetic_inputs`` (warm-up: zero blocks,
  all-sentinel positions), ``_build_decode_synthetic_inputs`` (decode passes no vision
  input), ``_init_mrope_positions`` / ``_calc_mrope_positions`` (the model's
  ``get_mrope_input_positions`` once per request; decode tokens ``delta + position`` on
  all axes) and ``_create_padded_inputs`` / ``_pad_to_compiled_shapes`` (padding tokens
  get M-RoPE positions 0);
- ``vllm_neuron/model/registry.py``: ``get_models()``, which the runner's merge factor is
  looked up in by ``hf_config.architectures[0]`` (``vllm_neuron/utils/vision_utils.py``,
  read in jinhuang12/vllm-neuron @ ``ed3580d0``: a name outside that list gets factor 1).

Not in the pin's stored snapshot, read in later revisions of the same line (facts only):
``vllm_neuron/vllm/worker/encoder_cache_blocks.py`` (``EncoderCacheBlocks``; found by content in
the search index, which names no repository for it): ``buffer [num_blocks, block_size, fat_dim]``,
the last block the scratch block (never allocated), a free queue of the others,
``allocate(mm_hash, tokens_per_block)`` (one block per entry; an allocated hash returns its
blocks; ``RuntimeError`` when full), ``dense_tokens_per_block(n, block_size)`` (``[block_size,
..., remainder]``), ``mark_written`` after ``embed_multimodal``, ``put`` (allocate densely, write,
zero each block's tail) for precomputed embeddings, ``free`` (held for
``min_hold_time_ms`` after the write; the stand-in frees at once). The worker's vision warm-up
(jinhuang12/vllm-neuron @ ``03bd80a2`` ``neuron_worker.py`` ``_warmup_vision_encoder``): after the
text warm-up, per bucket ascending, ``model.visual(**model.build_vision_synthetic_inputs(bucket,
vision_neuron_config, device), encoder_cache_buffer=encoder_cache.buffer,
write_block_ids=zeros(NB))`` with ``NB = ceil(bucket / vision_attention_block_size)`` rounded
up to a multiple of ``dp_size``.
"""

import collections
import dataclasses
import math
import types

import torch

ENCODER_CACHE_DTYPE = torch.bfloat16
# vllm-neuron's own model list at the pin whose factories report a spatial merge factor.
SPATIAL_MERGE_ARCHITECTURES = ("Qwen3VLForConditionalGeneration", "Qwen3_5ForConditionalGeneration")


@dataclasses.dataclass
class VisionNeuronConfigStandIn:
    """``VisionNeuronConfig.from_dict`` and ``resolve_tp_dp`` (the fields the runner reads)."""

    num_vision_tokens_buckets: list | None = None
    vision_attention_block_size: int = 2048
    tp_size: int = 1
    dp_size: int = 1
    max_vision_seq_len: int | None = None
    encoder_cache_num_blocks: int | None = None
    encoder_cache_min_hold_time_ms: float | None = None

    @classmethod
    def from_dict(cls, values: dict) -> "VisionNeuronConfigStandIn":
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})

    def resolve_tp_dp(self, world_size: int) -> None:
        """Both at 1 -> ``dp_size = world_size``; one set -> the other fills the world."""
        if self.tp_size == 1 and self.dp_size == 1:
            self.dp_size = world_size
        elif self.dp_size == 1:
            self.dp_size = world_size // self.tp_size
        elif self.tp_size == 1:
            self.tp_size = world_size // self.dp_size


def merge_factor_of(hf_config) -> int:
    """The runner's vision-token merge factor: ``spatial_merge_size ** 2`` for an architecture of
    vllm-neuron's own list, else 1 (how ``get_vision_token_merge_factor`` resolves it)."""
    if hf_config.architectures[0] in SPATIAL_MERGE_ARCHITECTURES:
        return hf_config.vision_config.spatial_merge_size**2
    return 1


class EncoderCacheStandIn:
    """``EncoderCacheBlocks``: the on-device encoder cache, ``buffer [num_blocks, block_size, fat_dim]``
    bfloat16, the last block the scratch block, one item per block run (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, fat_dim: int) -> None:
        self.num_blocks, self.block_size, self.fat_dim, self.dtype = num_blocks, block_size, fat_dim, ENCODER_CACHE_DTYPE
        self.buffer = torch.zeros(num_blocks, block_size, fat_dim, dtype=self.dtype)
        self.scratch_block_id = num_blocks - 1
        self.free_queue = collections.deque(range(num_blocks - 1))
        self.items: dict[str, tuple[list[int], list[int]]] = {}
        self.written: set[str] = set()

    @staticmethod
    def dense_tokens_per_block(num_tokens: int, block_size: int) -> list[int]:
        return [min(block_size, num_tokens - start) for start in range(0, num_tokens, block_size)]

    def contains(self, mm_hash: str) -> bool:
        return mm_hash in self.items

    def allocate(self, mm_hash: str, tokens_per_block: list[int]) -> list[int]:
        """Reserve one block per entry of ``tokens_per_block`` (nothing written)."""
        if mm_hash in self.items:
            return self.items[mm_hash][0]
        if len(tokens_per_block) > len(self.free_queue):
            raise RuntimeError(f"Encoder cache full: {mm_hash!r} needs {len(tokens_per_block)} blocks, "
                               f"{len(self.free_queue)} free")
        block_ids = [self.free_queue.popleft() for _ in tokens_per_block]
        self.items[mm_hash] = (block_ids, list(tokens_per_block))
        return block_ids

    def mark_written(self, mm_hash: str) -> None:
        if mm_hash in self.items:
            self.written.add(mm_hash)

    def put(self, mm_hash: str, embedding: torch.Tensor) -> None:
        """Allocate densely and write an item's ``[N, fat_dim]`` rows (precomputed embeddings)."""
        if mm_hash in self.items:
            return
        counts = self.dense_tokens_per_block(embedding.shape[0], self.block_size)
        start = 0
        for block, count in zip(self.allocate(mm_hash, counts), counts):
            self.buffer[block, :count] = embedding[start:start + count].to(self.dtype)
            self.buffer[block, count:] = 0
            start += count
        self.mark_written(mm_hash)

    def get_block_ids(self, mm_hash: str):
        return self.items[mm_hash][0] if mm_hash in self.items else None

    def get_tokens_per_block(self, mm_hash: str):
        return self.items[mm_hash][1] if mm_hash in self.items else None

    def free(self, mm_hash: str) -> None:
        block_ids, _ = self.items.pop(mm_hash)
        self.written.discard(mm_hash)
        self.free_queue.extend(block_ids)


@dataclasses.dataclass
class ImageFeature:
    """One image of a prompt, with the names of vLLM's ``MultiModalFeatureSpec`` the runner and
    the model read (``modality``, ``identifier``, ``mm_position.offset`` / ``.length``,
    ``data["image_grid_thw"].data``), and its processor output ``pixel_values [t*h*w, C*Tp*P*P]``
    (what ``_execute_mm_encoder`` hands ``embed_multimodal``), or, for a precomputed item, its
    ``embedding [length, fat_dim]`` (written with ``encoder_cache.put``).

    ``length``: the placeholder tokens, ``t*h*w / spatial_merge_size**2``.
    """

    identifier: str
    offset: int
    grid_thw: tuple[int, int, int]
    length: int
    pixel_values: torch.Tensor | None = None
    embedding: torch.Tensor | None = None
    modality: str = "image"

    @property
    def mm_position(self):
        return types.SimpleNamespace(offset=self.offset, length=self.length, is_embed=None)

    @property
    def data(self):
        return {"image_grid_thw": types.SimpleNamespace(data=torch.tensor(self.grid_thw))}


def build_encoder_cache(vision_config: VisionNeuronConfigStandIn, hf_config, largest_prefill_bucket: int):
    """``(cache, max_vision_blocks_per_request)`` as ``_init_encoder_cache`` sizes them.

    The block count stands in for vLLM's ``MultiModalBudget.encoder_cache_size`` with
    ``max(largest prefill bucket, largest merged item)`` rows, plus the scratch block.
    """
    merge = merge_factor_of(hf_config)
    vision = hf_config.vision_config
    fat_dim = vision.out_hidden_size * (1 + len(getattr(vision, "deepstack_visual_indexes", None) or []))
    if vision_config.vision_attention_block_size % merge:
        raise ValueError(f"vision_attention_block_size ({vision_config.vision_attention_block_size}) must be "
                         f"divisible by merge_factor ({merge})")
    block_size = vision_config.vision_attention_block_size // merge
    largest = max(vision_config.num_vision_tokens_buckets)
    max_blocks = math.ceil(largest // merge / block_size)
    needed = math.ceil(max(largest_prefill_bucket, largest // merge) / block_size) + 1
    num_blocks = max(vision_config.encoder_cache_num_blocks or 0, needed)
    return EncoderCacheStandIn(num_blocks, block_size, fat_dim), max_blocks


def warm_up_vision_tower(model, vision_config: VisionNeuronConfigStandIn, cache: EncoderCacheStandIn) -> None:
    """The worker's ``_warmup_vision_encoder``: each vision bucket, ascending, on the model's synthetic
    inputs, the cache buffer and all-zero ``write_block_ids``."""
    for bucket in sorted(vision_config.num_vision_tokens_buckets):
        blocks = math.ceil(math.ceil(bucket / vision_config.vision_attention_block_size) / vision_config.dp_size)
        inputs = model.build_vision_synthetic_inputs(bucket, vision_config, cache.buffer.device)
        model.visual(**inputs, encoder_cache_buffer=cache.buffer,
                     write_block_ids=torch.zeros(blocks * vision_config.dp_size, dtype=torch.int64))


def encode_into_cache(model, cache: EncoderCacheStandIn, features) -> None:
    """``_execute_mm_encoder`` for a step's uncached ``features``: precomputed embeddings with ``put``,
    images in one ``embed_multimodal`` call (one modality group), then marked written."""
    images = []
    for feature in features:
        if feature.embedding is not None:
            cache.put(feature.identifier, feature.embedding)
        else:
            images.append(feature)
    if not images:
        return
    model.embed_multimodal(encoder_cache=cache, mm_hashes=[f.identifier for f in images],
                           pixel_values=torch.cat([f.pixel_values for f in images]),
                           image_grid_thw=torch.tensor([f.grid_thw for f in images]))
    for feature in images:
        cache.mark_written(feature.identifier)


def warmup_vision_inputs(cache: EncoderCacheStandIn, max_blocks: int, num_tokens: int) -> dict:
    """The prefill warm-up's vision keywords: zero blocks, every row the sentinel."""
    blocks = tuple(torch.zeros(cache.block_size, cache.fat_dim, dtype=cache.dtype) for _ in range(max_blocks))
    return dict(vision_embedding_blocks=blocks,
                vision_positions=torch.full((max_blocks, cache.block_size), num_tokens, dtype=torch.int64))


def gather_vision_inputs(cache: EncoderCacheStandIn, max_blocks: int, features, computed: int, scheduled: int,
                         num_tokens: int) -> dict:
    """``_gather_mm_embeddings`` for one request's prefill chunk ``[computed, computed + scheduled)``
    padded to ``num_tokens``."""
    positions = torch.full((max_blocks, cache.block_size), num_tokens, dtype=torch.int64)
    block_ids = []
    for feature in features:
        start, end = feature.mm_position.offset, feature.mm_position.offset + feature.mm_position.length
        if end <= computed or start >= computed + scheduled or not cache.contains(feature.identifier):
            continue
        first, last = max(start, computed), min(end, computed + scheduled)
        item_start, item_end, step_start = first - start, last - start, first - computed
        item_row = 0
        for block, count in zip(cache.get_block_ids(feature.identifier),
                                cache.get_tokens_per_block(feature.identifier)):
            if len(block_ids) >= max_blocks:
                raise RuntimeError(f"vision block truncation: more cached blocks than "
                                   f"max_vision_blocks_per_request={max_blocks}")
            rows = torch.arange(item_row, item_row + cache.block_size)
            used = (rows >= item_start) & (rows < item_end) & (rows < item_row + count)
            positions[len(block_ids)] = torch.where(used, step_start + rows - item_start, num_tokens)
            block_ids.append(block)
            item_row += count
    block_ids += [cache.scratch_block_id] * (max_blocks - len(block_ids))
    return dict(vision_embedding_blocks=tuple(cache.buffer[b] for b in block_ids), vision_positions=positions)
