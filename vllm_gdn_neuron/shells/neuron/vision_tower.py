"""The vision tower under vllm-neuron's runner: one static graph per vision bucket, writing the encoder cache.

What the runner does with it (read, not run: whn09/vllm-neuron @ ``7ea99278`` for the runner;
the Qwen3-VL model, the worker's vision warm-up and ``EncoderCacheBlocks`` in later revisions of
the same line, ``docs/neuron-vision.md`` says which):

1. ``load_model`` compiles ``model.visual`` beside the model (same backend, ``fullgraph``);
2. the worker warms up each ``num_vision_tokens_buckets`` entry ``B``:
   ``visual(**model.build_vision_synthetic_inputs(B, vision_neuron_config, device),
   encoder_cache_buffer=cache.buffer, write_block_ids=zeros(NB))``;
3. a prefill step with uncached images calls ``model.embed_multimodal(encoder_cache=,
   mm_hashes=, pixel_values=, image_grid_thw=)``, which allocates the images' cache blocks,
   packs them on the host and runs the compiled ``visual``; its graph writes the merged rows
   into the cache buffer, nothing returns to the host. The runner then marks them written and
   the text step reads them as ``vision_embedding_blocks`` (:mod:`.vision`).

Layout of one call (all static for a bucket ``B``):

- ``NB = ceil(ceil(B / A) / dp) * dp`` attention blocks of ``A = vision_attention_block_size``
  patch rows (``dp``: the vision config's ``dp_size``; the worker computes ``NB`` the same way
  for ``write_block_ids``);
- one image per block (the cache holds one item per block), at rows ``[0, h * w)``, in the
  processor's merge-block order; the rest of the block is padding;
- per row: its patch row / column (2-D rotary), the four position-table taps and weights, and
  ``[bound_lo, bound_hi)``, the rows of its block it attends to (its image; a padding row only
  itself, so no row has an empty softmax);
- the graph: :meth:`vllm_gdn_neuron.model.vision.VisionTower.encode` over ``[NB, A]`` with the
  bounds as a bool mask, merger to ``[NB, A / m^2, out_hidden_size]``, then one ``index_put_``
  of block ``i``'s merged rows into rows ``[0, A / m^2)`` of cache block ``write_block_ids[i]``
  (the scratch block for empty blocks).

The cache's ``block_size`` is ``A // merge_factor`` with the runner's factor looked up by
architecture name (``spatial_merge_size ** 2``, or 1 for a name outside vllm-neuron's list,
such as this plugin's): either way at least ``A / m^2``, the rows a block's image can have.

Vision parallelism: the tower is replicated (vision ``tp_size`` 1). Under vision DP
(``dp_size`` > 1, the runner's default split) every rank encodes all ``NB`` blocks into its own
cache copy: correct, with no DP speed-up.
"""

import dataclasses
import math

import torch
from torch import nn

from vllm_gdn_neuron.model.vision import VisionTower, check_grid_thw, vision_grid_inputs

# The graph inputs built on the host (with the runner's ``encoder_cache_buffer`` and
# ``write_block_ids``, the keywords of :meth:`NeuronVisionTower.forward`).
PACKED_INPUTS = ("pixel_values", "rows", "cols", "pos_embed_index", "pos_embed_weight", "bound_lo", "bound_hi")


def vision_blocks(bucket: int, block_size: int, dp_size: int) -> int:
    """``NB``: attention blocks of a bucket of ``bucket`` patches, a multiple of ``dp_size``."""
    return math.ceil(math.ceil(bucket / block_size) / dp_size) * dp_size


@dataclasses.dataclass
class VisionLayout:
    """The tower's static layout, from the vision config and the checkpoint's ``vision_config``.

    Attributes:
        buckets: ``num_vision_tokens_buckets``, ascending.
        block_size: A, patch rows per attention block.
        dp_size: the vision DP degree (``NB`` is a multiple of it).
        merge: m, ``spatial_merge_size``.
        patch_elements: C * Tp * P * P.
        num_grid_per_side: side of the learned position table.
        out_hidden_size: F, the width of a merged row (the cache's ``fat_dim``: no deep stack).
    """

    buckets: list[int]
    block_size: int
    dp_size: int
    merge: int
    patch_elements: int
    num_grid_per_side: int
    out_hidden_size: int

    @property
    def merged_rows(self) -> int:
        """Merged rows a block writes: ``A / m^2``."""
        return self.block_size // self.merge**2

    @classmethod
    def of(cls, vision_neuron_config, vision_config) -> "VisionLayout":
        return cls(sorted(vision_neuron_config.num_vision_tokens_buckets),
                   vision_neuron_config.vision_attention_block_size, getattr(vision_neuron_config, "dp_size", 1) or 1,
                   vision_config.spatial_merge_size,
                   vision_config.in_channels * vision_config.temporal_patch_size * vision_config.patch_size**2,
                   int(vision_config.num_position_embeddings**0.5), vision_config.out_hidden_size)


def check_vision_layout(vision_neuron_config, vision_config) -> None:
    """Refuse a ``vision_neuron_config`` the tower's graphs cannot be built for (at start-up).

    Raises:
        ValueError: naming the ``vision_neuron_config`` field, what it must be and its value.
    """
    name = "additional_config.vision_neuron_config"
    buckets = getattr(vision_neuron_config, "num_vision_tokens_buckets", None)
    if not buckets or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in buckets):
        raise ValueError(f"{name}.num_vision_tokens_buckets must be a non-empty list of integers >= 1 (patches "
                         f"per vision graph); got {buckets!r}")
    block = getattr(vision_neuron_config, "vision_attention_block_size", None)
    unit = vision_config.spatial_merge_size**2
    if not isinstance(block, int) or block < unit or block % unit:
        raise ValueError(f"{name}.vision_attention_block_size must be a positive multiple of spatial_merge_size**2="
                         f"{unit} (whole merged tokens per block); got {block!r}")
    tp = getattr(vision_neuron_config, "tp_size", 1)
    if tp != 1:
        raise ValueError(f"{name}.tp_size must be 1 (the vision tower is replicated on every rank); got {tp!r}: "
                         "remove tp_size")


def pack_images(layout: VisionLayout, num_blocks: int, pixel_values: torch.Tensor, grids: list,
                dtype: torch.dtype) -> dict:
    """The host-side graph inputs of one call: image ``i`` in block ``i``, padding elsewhere.

    Args:
        layout: the tower's layout.
        num_blocks: NB of the chosen bucket (at least ``len(grids)``).
        pixel_values: ``[sum(h * w), C*Tp*P*P]`` the images' patches, in ``grids`` order.
        grids: ``(1, h, w)`` per image, each ``h * w <= A``.
        dtype: the tower's dtype (the pixels' graph input dtype).

    Returns:
        The :data:`PACKED_INPUTS` tensors: ``pixel_values [NB, A, C*Tp*P*P]`` in ``dtype``,
        ``rows`` / ``cols`` / ``bound_lo`` / ``bound_hi`` ``[NB, A]`` int64,
        ``pos_embed_index [NB, A, 4]`` int64, ``pos_embed_weight [NB, A, 4]`` float32.
    """
    rows_per_block = layout.block_size
    shape = (num_blocks, rows_per_block)
    packed = dict(pixel_values=torch.zeros(*shape, layout.patch_elements, dtype=dtype),
                  rows=torch.zeros(shape, dtype=torch.int64), cols=torch.zeros(shape, dtype=torch.int64),
                  pos_embed_index=torch.zeros(*shape, 4, dtype=torch.int64),
                  pos_embed_weight=torch.zeros(*shape, 4, dtype=torch.float32))
    own_row = torch.arange(rows_per_block).expand(shape)
    packed["bound_lo"], packed["bound_hi"] = own_row.clone(), own_row + 1
    if not grids:
        return packed
    grid = vision_grid_inputs(torch.tensor(grids), layout.merge, layout.num_grid_per_side)
    start = 0
    for block, length in enumerate(grid.segment_lengths):
        items = slice(start, start + length)
        packed["pixel_values"][block, :length] = pixel_values[items].to(dtype)
        packed["rows"][block, :length] = grid.rows[items]
        packed["cols"][block, :length] = grid.cols[items]
        packed["pos_embed_index"][block, :length] = grid.table_index[items]
        packed["pos_embed_weight"][block, :length] = grid.table_weight[items]
        packed["bound_lo"][block, :length] = 0
        packed["bound_hi"][block, :length] = length
        start += length
    return packed


class NeuronVisionTower(nn.Module):
    """``visual``: the tower on ``[NB, A]`` packed blocks, written into the encoder cache.

    Parameters: ``tower.*``, the checkpoint's ``visual.*`` names
    (:class:`vllm_gdn_neuron.model.vision.VisionTower`).
    """

    def __init__(self, vision_config, dtype: torch.dtype) -> None:
        super().__init__()
        self.tower = VisionTower(vision_config).to(dtype)
        self.merge = vision_config.spatial_merge_size
        self.out_hidden_size = vision_config.out_hidden_size

    @torch.no_grad()
    def forward(self, pixel_values, rows, cols, pos_embed_index, pos_embed_weight, bound_lo, bound_hi,
                encoder_cache_buffer, write_block_ids) -> torch.Tensor:
        """Encode the packed blocks and write their merged rows into the cache (static shapes, no host read).

        Dimensions:
            NB: attention blocks; A: rows per block; NC: cache blocks; BS: cache rows per block
            (``>= A / m^2``); F: ``out_hidden_size``.

        Args:
            pixel_values: ``[NB, A, C*Tp*P*P]`` patches (the tower's dtype).
            rows, cols: ``[NB, A]`` int64 patch row / column within its image.
            pos_embed_index, pos_embed_weight: ``[NB, A, 4]`` int64 taps / float32 weights.
            bound_lo, bound_hi: ``[NB, A]`` int64: row ``r`` of a block attends to rows
                ``[bound_lo[r], bound_hi[r])`` of that block.
            encoder_cache_buffer: ``[NC, BS, F]`` the runner's cache (bfloat16), written in place.
            write_block_ids: ``[NB]`` int64, the cache block each attention block's rows go to.

        Returns:
            ``encoder_cache_buffer`` (rows ``[0, A / m^2)`` of each ``write_block_ids`` block
            now hold that block's merged rows, cast to the cache dtype).
        """
        rows_per_block = pixel_values.shape[1]
        column = torch.arange(rows_per_block, device=bound_lo.device)
        mask = (column >= bound_lo[..., None]) & (column < bound_hi[..., None])
        merged = self.tower.encode(pixel_values, rows, cols, pos_embed_index, pos_embed_weight, mask)
        merged_rows = merged.shape[1]
        cache_rows = torch.arange(merged_rows, device=write_block_ids.device)
        encoder_cache_buffer.index_put_((write_block_ids[:, None], cache_rows[None, :]),
                                        merged.to(encoder_cache_buffer.dtype))
        return encoder_cache_buffer


def synthetic_vision_inputs(layout: VisionLayout, bucket: int, dtype: torch.dtype, device) -> dict:
    """``build_vision_synthetic_inputs``: a bucket's packed inputs with no image (every row padding),
    from the same packer as a real call, so warm-up and serving trace the same shapes and dtypes."""
    packed = pack_images(layout, vision_blocks(bucket, layout.block_size, layout.dp_size), None, [], dtype)
    return {key: value.to(device) for key, value in packed.items()}


def encode_images(visual, layout: VisionLayout, dtype: torch.dtype, encoder_cache, mm_hashes, pixel_values,
                  image_grid_thw) -> None:
    """``embed_multimodal`` for images: checks, cache-block allocation, bucket choice, packing, the graph.

    Everything is checked before the first block is allocated, so a refused call leaves the
    cache as it was.

    Args:
        visual: the (compiled) :class:`NeuronVisionTower`.
        layout: its layout; dtype: its dtype.
        encoder_cache: the runner's ``EncoderCacheBlocks`` (``buffer``, ``block_size``,
            ``fat_dim``, ``scratch_block_id``, ``allocate``, ``dense_tokens_per_block``).
        mm_hashes: one identifier per image, in ``image_grid_thw`` order.
        pixel_values: ``[sum(h * w), C*Tp*P*P]`` the processor's patches, images concatenated.
        image_grid_thw: ``[M, 3]`` integer ``(1, h, w)`` per image.

    Raises:
        ValueError: naming the argument, what it must be and what it is.
    """
    grids = _check_images(layout, encoder_cache, mm_hashes, pixel_values, image_grid_thw)
    largest = vision_blocks(layout.buckets[-1], layout.block_size, layout.dp_size)
    if len(grids) > largest:
        raise ValueError(f"image_grid_thw: {len(grids)} images need {len(grids)} vision attention blocks (one image "
                         f"per block); the largest of num_vision_tokens_buckets={layout.buckets} has {largest}: "
                         "lower limit-mm-per-prompt image or add a larger bucket")
    bucket = next(b for b in layout.buckets if vision_blocks(b, layout.block_size, layout.dp_size) >= len(grids))
    num_blocks = vision_blocks(bucket, layout.block_size, layout.dp_size)
    block_ids = []
    for mm_hash, (_, h, w) in zip(mm_hashes, grids):
        merged = h * w // layout.merge**2
        block_ids += encoder_cache.allocate(mm_hash, encoder_cache.dense_tokens_per_block(merged,
                                                                                          encoder_cache.block_size))
    write_block_ids = torch.tensor(block_ids + [encoder_cache.scratch_block_id] * (num_blocks - len(block_ids)),
                                   dtype=torch.int64)
    device = encoder_cache.buffer.device
    packed = pack_images(layout, num_blocks, pixel_values, grids, dtype)
    visual(**{key: value.to(device) for key, value in packed.items()},
           encoder_cache_buffer=encoder_cache.buffer, write_block_ids=write_block_ids.to(device))


def _check_images(layout: VisionLayout, encoder_cache, mm_hashes, pixel_values, image_grid_thw) -> list:
    if not isinstance(pixel_values, torch.Tensor) or not isinstance(image_grid_thw, torch.Tensor):
        raise ValueError(f"embed_multimodal needs pixel_values and image_grid_thw tensors; got "
                         f"pixel_values={type(pixel_values).__name__}, image_grid_thw={type(image_grid_thw).__name__}")
    grids = check_grid_thw(image_grid_thw.cpu(), layout.merge)
    for index, (t, h, w) in enumerate(grids):
        if t != 1:
            raise ValueError(f"image_grid_thw[{index}] must have t = 1 (an image); got {(t, h, w)}")
        if h * w > layout.block_size:
            raise ValueError(f"image_grid_thw[{index}]: an image of h * w = {h * w} patches must fit one vision "
                             f"attention block of vision_attention_block_size={layout.block_size} patches; got "
                             f"{(t, h, w)}: raise vision_attention_block_size or lower the processor's max_pixels")
    patches = sum(h * w for _, h, w in grids)
    if tuple(pixel_values.shape) != (patches, layout.patch_elements) or not pixel_values.dtype.is_floating_point:
        raise ValueError(f"pixel_values must be a [{patches}, {layout.patch_elements}] float tensor (the patches "
                         f"image_grid_thw counts, C*Tp*P*P); got {list(pixel_values.shape)} {pixel_values.dtype}")
    if mm_hashes is None or len(mm_hashes) != len(grids):
        raise ValueError(f"mm_hashes must name each of the {len(grids)} images of image_grid_thw; got "
                         f"{None if mm_hashes is None else len(mm_hashes)}")
    if encoder_cache.block_size < layout.merged_rows:
        raise ValueError(f"encoder_cache.block_size must be at least vision_attention_block_size / "
                         f"spatial_merge_size**2 = {layout.merged_rows} (a block's merged rows); got "
                         f"{encoder_cache.block_size}")
    if encoder_cache.fat_dim != layout.out_hidden_size:
        raise ValueError(f"encoder_cache.fat_dim must be out_hidden_size={layout.out_hidden_size} (Qwen3.5's tower "
                         f"has no deep-stack levels); got {encoder_cache.fat_dim}")
    return grids
