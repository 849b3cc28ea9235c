"""Which request each token of a prefill step belongs to, from the runner's own per-layer fields.

vllm-neuron's runner (pinned in :mod:`.contract`) passes no ``query_start_loc`` or
``seq_lens``: a step is ``positions [T]`` and, per cache group, ``block_table_tensor [R, W]``
(one row per request, in batch order), ``slot_mapping [T]`` (``block * B + offset``; padding
tokens 0) and ``block_size`` B. Its scheduler puts one prompt in a prefill step (R = 1); a
packed step holds several requests' tokens end to end in batch-row order with the padding
after the last, which the same fields describe:

- token t belongs to the first row r whose block at column ``positions[t] // B`` is the block
  of ``slot_mapping[t]``. A block being written belongs to one request; rows past the step's
  requests are stale copies of earlier ones and come after every live row, so the first match
  is the token's own request. Padding tokens (``slot_mapping <= 0``) belong to no row (R).
- row r's tokens are then the contiguous range ``query_start_loc[r] .. query_start_loc[r + 1]``
  of the row counts' cumsum, and its first position is the smallest position among them.

:func:`prefill_rows` is static-shape tensor arithmetic (an ``[R, T]`` comparison, no host
read), traced into every prefill graph. :func:`check_prefill_rows` reads the same fields on
the host and refuses a step whose tokens do not have that layout, naming what is wrong; a
caller that builds steps (the runner stand-in of ``tests/neuron``) runs it before the
compiled forward.
"""

from dataclasses import dataclass

import torch


@dataclass
class PrefillRows:
    """The requests of one prefill step, over the R block-table rows.

    Attributes:
        token_row: ``[T]`` int64 row of each token, R for padding tokens.
        query_start_loc: ``[R + 1]`` int64 boundaries of the rows' token ranges.
        first_position: ``[R]`` int64 position of each row's first token (0 for a row with none).
    """

    token_row: torch.Tensor
    query_start_loc: torch.Tensor
    first_position: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        """``[R]`` int64 tokens of each row."""
        return self.query_start_loc[1:] - self.query_start_loc[:-1]


def prefill_rows(metadata: dict, positions: torch.Tensor) -> PrefillRows:
    """The rows of a prefill step's tokens from one layer's ``attn_metadata`` entry.

    Args:
        metadata: ``block_table_tensor [R, W]`` int32 (null blocks -1), ``slot_mapping [T]``
            int64 (padding 0), ``block_size`` (a Python int).
        positions: ``[T]`` int64 token positions.
    """
    table = metadata["block_table_tensor"].to(torch.int64)
    slots = metadata["slot_mapping"].to(torch.int64)
    block_size = metadata["block_size"]
    rows, width = table.shape
    positions = positions.to(torch.int64)
    # Non-negative positions and slots: truncation is floor (torch-mlir lowers a floor divide of
    # integers through float64).
    column = torch.div(positions, block_size, rounding_mode="trunc").clamp(0, width - 1)
    own_block = torch.div(slots, block_size, rounding_mode="trunc")
    row_ids = torch.arange(rows, dtype=torch.int64, device=table.device)[:, None]
    match = (table.index_select(1, column) == own_block[None, :]) & (slots > 0)[None, :]       # [R, T]
    token_row = torch.where(match, row_ids, rows).amin(0)
    counts = torch.zeros(rows + 1, dtype=torch.int64, device=table.device)
    counts.index_add_(0, token_row, torch.ones_like(token_row))
    query_start_loc = torch.cat([counts.new_zeros(1), counts[:rows].cumsum(0)])
    mine = token_row[None, :] == row_ids                                                          # [R, T]
    largest = torch.iinfo(torch.int64).max
    first = torch.where(mine, positions[None, :], largest).amin(1)
    return PrefillRows(token_row, query_start_loc, torch.where(counts[:rows] > 0, first, 0))


def check_prefill_rows(metadata: dict, positions: torch.Tensor) -> list[int]:
    """Refuse (ValueError) a prefill step whose tokens are not laid out as :func:`prefill_rows` reads them.

    Checks (host read of the step's index tensors): every live token (``slot_mapping > 0``)
    belongs to a row; the rows' tokens are contiguous and in row order, the padding after
    the last; within a row positions rise by one.

    Returns:
        The token count of each row.
    """
    rows = prefill_rows(metadata, positions)
    token_row = rows.token_row.tolist()
    live = (metadata["slot_mapping"] > 0).tolist()
    count = metadata["block_table_tensor"].shape[0]
    for token, (row, is_live) in enumerate(zip(token_row, live)):
        if is_live and row == count:
            raise ValueError(f"slot_mapping: expected every live token's block in its block-table row, got token "
                             f"{token} (slot {int(metadata['slot_mapping'][token])}) in no row of {count}")
    if token_row != sorted(token_row):
        raise ValueError(f"slot_mapping: expected the rows' tokens end to end in row order with the padding last, "
                         f"got token rows {token_row}")
    positions = positions.tolist()
    for token in range(1, len(token_row)):
        row = token_row[token]
        if row < count and row == token_row[token - 1] and positions[token] != positions[token - 1] + 1:
            raise ValueError(f"positions: expected consecutive positions within row {row}, got "
                             f"{positions[token - 1]} then {positions[token]} at token {token}")
    return rows.lengths.tolist()
