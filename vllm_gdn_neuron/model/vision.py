"""The vision tower of the Qwen3.5 vision-language checkpoints (Qwen3-VL style, no deep stack).

```
pixel patches [N, C*Tp*P*P] --patch_embed (linear over each flattened patch)--> [N, E]
  + learned positions (square table resampled bilinearly to each image's grid)
  -> depth x block: x += attn(LN(x)) (2-D rotary, attention within each frame); x += mlp(LN(x))
  -> merger: LN, each m x m block of patches concatenated [N/m^2, E*m^2] -> fc1 -> GELU -> fc2
  -> merged embeddings [N/m^2, out_hidden_size] (one per image / video placeholder token)
```

Qwen3.5 has no deep-stack features: transformers' Qwen3.5 removes Qwen3-VL's
``deepstack_visual_indexes`` / ``deepstack_merger_list``, and the published configs carry
none, so the tower's one output is the merged sequence that replaces the placeholder tokens.

Dimensions:
    N: patches of all items (images and video frame pairs) in the call, item after item,
        each item's patches in merge-block order (the processor's order: the ``m x m``
        patches of one merged token are consecutive); E: ``hidden_size``; m:
        ``spatial_merge_size``; C: ``in_channels``; Tp: ``temporal_patch_size``; P:
        ``patch_size``; M: items, ``grid_thw`` rows ``(t, h, w)`` in patches (t counts
        temporal patches: one for an image, frames / Tp for a video).

The grid-derived inputs (patch rows / columns, the position-table taps and weights, the
attention segments) are computed on the host from ``grid_thw`` by
:func:`vision_grid_inputs`; the tower's math is :meth:`VisionTower.forward_grid`, so a
static-shape runner can compute those once per bucket and feed them in.

Tensor parallelism: none. The tower is replicated on every rank: it runs once per image
(not per generated token), and its weights are small next to the text decoder's (see
:func:`vllm_gdn_neuron.model.dims.count_vision_weights`: about 0.45 B parameters for the published
tower, against 2-397 B in the text decoders).

Numerics follow transformers' ``Qwen3_5VisionModel``: layer norms, projections and
attention in the weights' dtype; rotary angles and the rotation in float32, cast back;
position-table interpolation in float32, cast to the activation dtype.
"""

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

#: Activation names of the vision configs' ``hidden_act`` -> the function.
ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "silu": F.silu,
}
LAYER_NORM_EPS = 1e-6


@dataclasses.dataclass
class VisionGridInputs:
    """What :func:`vision_grid_inputs` derives from ``grid_thw`` (host side, no weights).

    Attributes:
        rows, cols: ``[N]`` int64 patch row / column within its frame.
        table_index: ``[N, 4]`` int64 taps into the flattened position table (bilinear).
        table_weight: ``[N, 4]`` float32 weights of those taps.
        segment_lengths: patches of each attention segment (one per frame), in order.
        merged_lengths: merged tokens of each item (``t * h * w / m^2``), in order.
    """

    rows: torch.Tensor
    cols: torch.Tensor
    table_index: torch.Tensor
    table_weight: torch.Tensor
    segment_lengths: list[int]
    merged_lengths: list[int]


def check_grid_thw(grid_thw: torch.Tensor, spatial_merge_size: int) -> list[tuple[int, int, int]]:
    """``grid_thw`` as a list of ``(t, h, w)``, checked.

    Raises:
        ValueError: unless ``grid_thw`` is ``[M, 3]`` integer with every ``t >= 1`` and
            ``h``, ``w`` positive multiples of ``spatial_merge_size``.
    """
    if grid_thw.dim() != 2 or grid_thw.shape[1] != 3 or grid_thw.dtype.is_floating_point:
        raise ValueError(f"grid_thw must be an integer [M, 3] tensor (t, h, w per item); "
                         f"got {list(grid_thw.shape)} {grid_thw.dtype}")
    grids = [tuple(int(v) for v in row) for row in grid_thw.tolist()]
    for index, (t, h, w) in enumerate(grids):
        if t < 1 or h < 1 or w < 1 or h % spatial_merge_size or w % spatial_merge_size:
            raise ValueError(f"grid_thw[{index}] must have t >= 1 and h, w positive multiples of "
                             f"spatial_merge_size={spatial_merge_size}; got {(t, h, w)}")
    return grids


def _bilinear_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two taps and weights per target index along one axis, ``align_corners=True``."""
    source = index.to(torch.float32) * (side - 1) / max(size - 1, 1)
    floor = source.floor()
    taps = torch.stack((floor, floor + 1), dim=-1)
    weights = (1 - (source[:, None] - taps).abs()).clamp(min=0)
    return taps.long().clamp(0, side - 1), weights


def vision_grid_inputs(grid_thw: torch.Tensor, spatial_merge_size: int, num_grid_per_side: int) -> VisionGridInputs:
    """The grid-derived inputs of :meth:`VisionTower.forward_grid`.

    Args:
        grid_thw: ``[M, 3]`` integer ``(t, h, w)`` per item, in patches.
        spatial_merge_size: m.
        num_grid_per_side: side of the square learned position table (``sqrt(num_position_embeddings)``).

    Returns:
        :class:`VisionGridInputs` on the CPU.
    """
    merge = spatial_merge_size
    rows, cols, table_index, table_weight, segments, merged = [], [], [], [], [], []
    for t, h, w in check_grid_thw(grid_thw.cpu(), merge):
        within = torch.arange(h * w)
        block, inner = within // (merge * merge), within % (merge * merge)
        row = (block // (w // merge)) * merge + inner // merge
        col = (block % (w // merge)) * merge + inner % merge
        row_taps, row_weights = _bilinear_taps(row, h, num_grid_per_side)
        col_taps, col_weights = _bilinear_taps(col, w, num_grid_per_side)
        index = (row_taps[:, :, None] * num_grid_per_side + col_taps[:, None, :]).reshape(-1, 4)
        weight = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 4)
        rows.append(row.repeat(t))
        cols.append(col.repeat(t))
        table_index.append(index.repeat(t, 1))
        table_weight.append(weight.repeat(t, 1))
        segments += [h * w] * t
        merged.append(t * h * w // (merge * merge))
    return VisionGridInputs(torch.cat(rows), torch.cat(cols), torch.cat(table_index), torch.cat(table_weight),
                            segments, merged)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` of the two halves of the last dim."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def axial_rotary(rows: torch.Tensor, cols: torch.Tensor, head_dim: int, theta: float):
    """2-D rotary angles of each patch: ``(cos, sin)``, each ``[..., N, head_dim]`` float32
    (``rows`` / ``cols`` ``[..., N]``).

    The first quarter of the frequencies turns with the patch row, the second with the
    column; the two halves of the head repeat that ``[row | col]`` pattern (``rotate_half``).
    """
    spatial_dim = head_dim // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, spatial_dim, 2, dtype=torch.float32, device=rows.device) / spatial_dim)
    angles = torch.cat((rows.float()[..., None] * inv_freq, cols.float()[..., None] * inv_freq), dim=-1)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


class VisionAttention(nn.Module):
    """Bidirectional multi-head attention within each frame, 2-D rotary q and k.

    Parameters: ``qkv`` (E -> 3E, bias; per token ``[q | k | v]``, each head-major),
    ``proj`` (E -> E, bias).
    """

    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"vision hidden_size={hidden_size} must be a multiple of num_heads={num_heads}")
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size, bias=True)
        self.proj = nn.Linear(hidden_size, hidden_size, bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention):
        """``x`` ``[..., N, E]``, ``cos`` / ``sin`` ``[..., N, D]`` float32 -> ``[..., N, E]``.

        ``attention`` says which rows see each other: a list of segment lengths (``x`` is
        ``[N, E]``; each segment attends within itself), or a bool mask ``[..., N, N]``,
        True where row i may attend to row j (static shapes: a bucketed graph).
        """
        *lead, tokens, _ = x.shape
        q, k, v = self.qkv(x).view(*lead, tokens, 3, self.num_heads, self.head_dim).unbind(-3)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        q = (q.float() * cos + rotate_half(q.float()) * sin).to(x.dtype)
        k = (k.float() * cos + rotate_half(k.float()) * sin).to(x.dtype)
        q, k, v = (t.transpose(-3, -2) for t in (q, k, v))  # [..., H, N, D]
        if isinstance(attention, torch.Tensor):  # matmuls and a float32 softmax: no fused kernel in the graph
            scores = (q @ k.transpose(-1, -2)) * self.head_dim**-0.5
            scores = scores.masked_fill(~attention.unsqueeze(-3), float("-inf"))
            out = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype) @ v
        else:
            out = torch.cat([
                F.scaled_dot_product_attention(qs[None], ks[None], vs[None])[0]
                for qs, ks, vs in zip(q.split(attention, -2), k.split(attention, -2), v.split(attention, -2))
            ], dim=-2)
        return self.proj(out.transpose(-3, -2).reshape(*lead, tokens, -1))


class VisionMLP(nn.Module):
    """``fc2(act(fc1(x)))`` with biases (``linear_fc1`` E -> I, ``linear_fc2`` I -> E)."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str) -> None:
        super().__init__()
        if hidden_act not in ACTIVATIONS:
            raise ValueError(f"vision_config.hidden_act must be one of {sorted(ACTIVATIONS)}; got {hidden_act!r}")
        self.act = ACTIVATIONS[hidden_act]
        self.linear_fc1 = nn.Linear(hidden_size, intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(intermediate_size, hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nn.Module):
    """Pre-norm transformer block: ``x += attn(norm1(x)); x += mlp(norm2(x))``."""

    def __init__(self, config) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=LAYER_NORM_EPS)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=LAYER_NORM_EPS)
        self.attn = VisionAttention(config.hidden_size, config.num_heads)
        self.mlp = VisionMLP(config.hidden_size, config.intermediate_size, config.hidden_act)

    def forward(self, x, cos, sin, attention):
        x = x + self.attn(self.norm1(x), cos, sin, attention)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """LN over E, then each ``m x m`` block of consecutive patches -> one ``out_hidden_size`` token."""

    def __init__(self, config) -> None:
        super().__init__()
        self.merged_size = config.hidden_size * config.spatial_merge_size**2
        self.norm = nn.LayerNorm(config.hidden_size, eps=LAYER_NORM_EPS)
        self.linear_fc1 = nn.Linear(self.merged_size, self.merged_size, bias=True)
        self.linear_fc2 = nn.Linear(self.merged_size, config.out_hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., N, E]`` -> ``[..., N / m^2, out_hidden_size]``."""
        x = self.norm(x).view(*x.shape[:-2], -1, self.merged_size)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class PatchEmbed(nn.Module):
    """A linear map of each flattened ``[C, Tp, P, P]`` patch (the checkpoint's Conv3d, stride = kernel).

    Parameter ``proj.weight`` keeps the checkpoint's ``[E, C, Tp, P, P]`` shape; ``proj.bias`` ``[E]``.
    """

    def __init__(self, config) -> None:
        super().__init__()
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size,
                              kernel_size=(config.temporal_patch_size, config.patch_size, config.patch_size),
                              stride=(config.temporal_patch_size, config.patch_size, config.patch_size), bias=True)
        self.patch_elements = config.in_channels * config.temporal_patch_size * config.patch_size**2

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """``[..., N, C*Tp*P*P]`` (any float dtype) -> ``[..., N, E]`` in the weights' dtype."""
        weight = self.proj.weight
        return F.linear(patches.to(weight.dtype), weight.reshape(weight.shape[0], -1), self.proj.bias)


class VisionTower(nn.Module):
    """Qwen3.5's vision encoder (module doc). Parameters are named as in the checkpoint after
    ``visual.`` / ``model.visual.`` (:func:`vllm_gdn_neuron.model.checkpoint.vision_tensor_name`).

    Args:
        config: the checkpoint's ``vision_config`` (``depth``, ``hidden_size``, ``num_heads``,
            ``intermediate_size``, ``hidden_act``, ``in_channels``, ``patch_size``,
            ``temporal_patch_size``, ``spatial_merge_size``, ``out_hidden_size``,
            ``num_position_embeddings``, optional ``rope_parameters.rope_theta``).
    """

    def __init__(self, config) -> None:
        super().__init__()
        side = int(config.num_position_embeddings**0.5)
        if side * side != config.num_position_embeddings:
            raise ValueError(f"vision_config.num_position_embeddings must be a square; "
                             f"got {config.num_position_embeddings}")
        self.spatial_merge_size = config.spatial_merge_size
        self.num_grid_per_side = side
        self.head_dim = config.hidden_size // config.num_heads
        self.rope_theta = float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        self.patch_embed = PatchEmbed(config)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, config.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(config)

    @property
    def patch_elements(self) -> int:
        """C * Tp * P * P: the width of one pixel patch row."""
        return self.patch_embed.patch_elements

    def forward(self, pixel_patches: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Encode images / video.

        Args:
            pixel_patches: ``[N, C*Tp*P*P]`` float (the processor's ``pixel_values`` /
                ``pixel_values_videos``: normalised pixels, per patch channel-major then
                temporal, row, column), items concatenated in ``grid_thw`` order.
            grid_thw: ``[M, 3]`` integer ``(t, h, w)`` of each item, in patches.

        Returns:
            ``[N / m^2, out_hidden_size]`` merged embeddings in the weights' dtype, items in
            order (item i has ``t*h*w / m^2`` rows); split them with
            ``vision_grid_inputs(...).merged_lengths``.

        Raises:
            ValueError: if ``grid_thw`` is malformed or does not account for every patch row,
                or a patch row is not ``C*Tp*P*P`` wide.
        """
        grid = vision_grid_inputs(grid_thw, self.spatial_merge_size, self.num_grid_per_side)
        expected = (sum(grid.segment_lengths), self.patch_elements)
        if tuple(pixel_patches.shape) != expected:
            raise ValueError(f"pixel_patches must be {list(expected)} (the patches grid_thw counts, C*Tp*P*P); "
                             f"got {list(pixel_patches.shape)}")
        return self.forward_grid(pixel_patches, grid)

    def forward_grid(self, pixel_patches: torch.Tensor, grid: VisionGridInputs) -> torch.Tensor:
        """:meth:`forward` with the grid-derived inputs given (``[N, ...]`` as in :class:`VisionGridInputs`)."""
        device = pixel_patches.device
        return self.encode(pixel_patches, grid.rows.to(device), grid.cols.to(device), grid.table_index.to(device),
                           grid.table_weight.to(device), grid.segment_lengths)

    def encode(self, pixel_patches, rows, cols, table_index, table_weight, attention) -> torch.Tensor:
        """The tower on patches laid out in any leading shape (one sequence, or fixed attention blocks).

        Args:
            pixel_patches: ``[..., N, C*Tp*P*P]`` float.
            rows, cols: ``[..., N]`` integer patch row / column within its frame.
            table_index: ``[..., N, 4]`` int64 position-table taps; ``table_weight`` their
                ``[..., N, 4]`` float32 weights.
            attention: segment lengths or a ``[..., N, N]`` bool mask (:class:`VisionAttention`).

        Returns:
            ``[..., N / m^2, out_hidden_size]`` in the weights' dtype: each run of ``m^2``
            consecutive patches merged (an item's patches must start at a multiple of ``m^2``).
        """
        x = self.patch_embed(pixel_patches)
        positions = (self.pos_embed(table_index) * table_weight[..., None]).sum(-2)
        x = x + positions.to(x.dtype)
        cos, sin = axial_rotary(rows, cols, self.head_dim, self.rope_theta)
        for block in self.blocks:
            x = block(x, cos, sin, attention)
        return self.merger(x)


def mrope_positions(num_tokens: int, frame_groups: list[tuple[int, int, int]]) -> tuple[torch.Tensor, int]:
    """M-RoPE positions of a prompt whose vision tokens are ``frame_groups``.

    Text tokens take the next position on all three axes. The ``h' x w'`` merged tokens of
    one image (or of one temporal patch of a video, which Qwen3.5 prompts as its own
    ``<|vision_start|> ... <|vision_end|>`` group) sit on a grid that starts at the next
    position ``s``: temporal ``s``, height ``s + row``, width ``s + col``; the text after
    it continues at ``s + max(h', w')``.

    Args:
        num_tokens: prompt length.
        frame_groups: ``(offset, h', w')`` of each group of ``h' * w'`` vision tokens, by offset.

    Returns:
        ``(positions [3, num_tokens] int64, delta)``: ``delta`` is the last position + 1 minus
        ``num_tokens``, which decode steps add to their token index.

    Raises:
        ValueError: if groups overlap or run past the prompt.
    """
    rows, start, cursor = [], 0, 0
    for offset, height, width in sorted(frame_groups):
        if offset < cursor or offset + height * width > num_tokens:
            raise ValueError(f"frame group at offset {offset} ({height}x{width} tokens) overlaps the previous one "
                             f"or runs past the prompt of {num_tokens} tokens")
        rows.append(torch.arange(offset - cursor).expand(3, -1) + start)
        start += offset - cursor
        grid_rows = torch.arange(height).repeat_interleave(width)
        grid_cols = torch.arange(width).repeat(height)
        rows.append(torch.stack((torch.zeros_like(grid_rows), grid_rows, grid_cols)) + start)
        start += max(height, width)
        cursor = offset + height * width
    rows.append(torch.arange(num_tokens - cursor).expand(3, -1) + start)
    positions = torch.cat(rows, dim=1).to(torch.int64)
    return positions, int(positions.max()) + 1 - num_tokens if num_tokens else 0


def prompt_mrope_positions(input_tokens: list[int], mm_features, vision_token_ids: dict[str, int],
                           spatial_merge_size: int) -> tuple[torch.Tensor, int]:
    """``([3, L] int64 positions, delta)`` of a prompt of ``L`` tokens and its multimodal items
    (:func:`mrope_positions` of their frame groups): what both engines' ``get_mrope_input_positions`` return.

    Each run of an item's vision token inside its placeholder is one frame group: an image, or
    one temporal patch of a video (between its timestamp and markers).

    Args:
        input_tokens: the prompt's token ids.
        mm_features: vLLM ``MultiModalFeatureSpec``-like items, in any order: ``modality``,
            ``mm_position.offset`` / ``.length`` (the placeholder) and
            ``data[f"{modality}_grid_thw"].data`` (``[t, h, w]`` patches).
        vision_token_ids: the token id of each modality the engine serves (``{"image": id}``).
        spatial_merge_size: the vision config's ``spatial_merge_size`` (m).

    Returns:
        The positions and ``delta`` (see :func:`mrope_positions`).

    Raises:
        ValueError: naming the item, for a modality not in ``vision_token_ids``, a grid whose
            h or w m does not divide (or an image grid with t != 1), a placeholder past the
            prompt, or one that does not hold t runs of ``h * w / m^2`` vision tokens.
    """
    groups = []
    for feature in mm_features:
        modality = feature.modality
        if modality not in vision_token_ids:
            served = " and ".join(f"{name}s" for name in vision_token_ids) or "no vision items"
            raise ValueError(f"M-RoPE positions are implemented for {served} only; got a {modality!r} item "
                             f"(set limit-mm-per-prompt {modality} to 0)")
        key = f"{modality}_grid_thw"
        frames, height, width = (int(v) for v in feature.data[key].data.tolist())
        image = modality == "image"
        if (image and frames != 1) or height % spatial_merge_size or width % spatial_merge_size:
            raise ValueError(f"{key} must be [{'1' if image else 't'}, h, w] with h and w multiples of "
                             f"spatial_merge_size={spatial_merge_size}; got {[frames, height, width]}")
        start, length = feature.mm_position.offset, feature.mm_position.length
        if start + length > len(input_tokens):
            raise ValueError(f"{modality} placeholder at {start} ({length} tokens) runs past the prompt of "
                             f"{len(input_tokens)} tokens")
        tokens_per_frame = height * width // spatial_merge_size**2
        runs = token_runs(input_tokens[start:start + length], vision_token_ids[modality])
        if len(runs) != frames or any(count != tokens_per_frame for _, count in runs):
            raise ValueError(f"{modality} placeholder at {start} must hold {frames} runs of {tokens_per_frame} "
                             f"tokens; got run lengths {[count for _, count in runs]}")
        groups += [(start + offset, height // spatial_merge_size, width // spatial_merge_size)
                   for offset, _ in runs]
    return mrope_positions(len(input_tokens), groups)


def token_runs(tokens: list[int], token: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each maximal run of ``token`` in ``tokens``."""
    runs: list[tuple[int, int]] = []
    for index, value in enumerate(tokens):
        if value != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == index:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((index, 1))
    return runs
