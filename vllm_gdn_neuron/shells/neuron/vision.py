"""The runner's image embeddings in a prefill step: encoder-cache blocks scattered into the tokens.

vllm-neuron's runner (pinned in :mod:`.contract`) keeps every encoded image in an on-device
encoder cache of fixed-size blocks and, on a prefill step of a multimodal model, passes the
text model

- ``vision_embedding_blocks``: a tuple of ``NB`` block views ``[BS, F]`` of that cache
  (bfloat16), always ``NB = max_vision_blocks_per_request`` of them, unused slots padded
  with the cache's scratch block, and
- ``vision_positions [NB, BS]`` int64: the step's token index each cached row replaces,
  or the sentinel ``T`` (the step's token count) for rows that replace nothing (block
  padding, rows of an image outside this prefill chunk, scratch blocks).

Decode steps carry neither (an image's contribution is already in the caches). Each
prefill bucket is one graph: ``NB`` and ``BS`` are fixed by the vision config, so the
shapes never depend on how many images a prompt has.

The merge is one scatter into ``T + 1`` rows, the extra row taking every sentinel, so
it is static and reads nothing back to the host. Row values outside ``[0, T]`` cannot be
checked in the graph; they are sent to the sentinel row rather than to memory out of
range (the runner never produces them).

``F`` is the cache's row width, ``out_hidden_size * (1 + deep-stack levels)``. Qwen3.5's
vision tower has no deep-stack mergers (``deepstack_visual_indexes`` is empty), so
``F`` must equal the text hidden size; wider rows are refused.
"""

import torch


def check_vision_inputs(blocks, positions, num_tokens: int, hidden_size: int, is_decode: bool) -> None:
    """Refuse vision inputs the merge cannot use (trace-time shapes and dtypes only).

    Args:
        blocks: ``vision_embedding_blocks`` (a tuple of ``[BS, F]`` tensors) or None.
        positions: ``vision_positions [NB, BS]`` int64 or None.
        num_tokens: T, the step's token count.
        hidden_size: H, the text hidden size.
        is_decode: whether the step is a decode step.

    Raises:
        ValueError: naming the argument, the expected and the actual value.
    """
    if (blocks is None) != (positions is None):
        raise ValueError("vision_embedding_blocks and vision_positions must be passed together; got "
                         f"vision_embedding_blocks={'None' if blocks is None else 'given'}, "
                         f"vision_positions={'None' if positions is None else 'given'}")
    if is_decode:
        raise ValueError("vision_embedding_blocks were passed on a decode step: images are merged in prefill "
                         "steps only (the runner passes none on decode)")
    if not isinstance(blocks, (tuple, list)) or not blocks or not all(isinstance(b, torch.Tensor) for b in blocks):
        raise ValueError(f"vision_embedding_blocks must be a non-empty tuple of [block_size, {hidden_size}] "
                         f"tensors; got {type(blocks).__name__}")
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2 or positions.dtype != torch.int64 \
            or positions.shape[0] != len(blocks):
        raise ValueError(f"vision_positions must be a [{len(blocks)}, block_size] int64 tensor (one row per "
                         f"block); got {_describe(positions)}")
    block_size = positions.shape[1]
    for index, block in enumerate(blocks):
        if tuple(block.shape) != (block_size, hidden_size) or not block.dtype.is_floating_point:
            raise ValueError(
                f"vision_embedding_blocks[{index}] must be a [{block_size}, {hidden_size}] float tensor "
                f"(block_size of vision_positions, the text hidden size: Qwen3.5 has no deep-stack levels); "
                f"got {list(block.shape)} {block.dtype}")


def _describe(value) -> str:
    return f"{list(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__


def merge_vision_embeddings(hidden: torch.Tensor, blocks, positions: torch.Tensor) -> torch.Tensor:
    """Replace the image tokens' embeddings by their encoder-cache rows.

    Dimensions:
        T: tokens of the step; H: hidden size; NB: blocks; BS: rows per block.

    Args:
        hidden: ``[T, H]`` token embeddings in the model dtype.
        blocks: ``NB`` tensors ``[BS, H]`` (any float dtype; cast to ``hidden``'s).
        positions: ``[NB, BS]`` int64, the token each row replaces, or ``T`` for none.

    Returns:
        ``[T, H]``: ``hidden`` with ``hidden[positions[i, j]] = blocks[i][j]`` wherever
        ``positions[i, j] < T``.
    """
    tokens, hidden_size = hidden.shape
    rows = torch.stack(tuple(blocks)).reshape(-1, hidden_size).to(hidden.dtype)
    target = positions.reshape(-1)
    target = torch.where((target >= 0) & (target < tokens), target, tokens)
    padded = torch.cat([hidden, hidden.new_zeros(1, hidden_size)])
    return padded.index_put((target,), rows)[:tokens]
