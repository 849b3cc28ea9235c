"""``(I + L)^-1`` for a batch of strictly lower triangular L, by matmuls only.

Batched ``torch.linalg.solve_triangular`` on many small (64 x 64) systems runs one small
triangular solve after another; this builds the inverse from batched matmuls instead:
forward substitution inside 16 x 16 diagonal blocks (16 row steps, every block of every
matrix at once), then block doubling ``inv([[P, 0], [R, Q]]) = [[P^-1, 0], [-Q^-1 R P^-1, Q^-1]]``
up to the full size. The inverse of a unit lower triangular matrix is unit lower triangular;
no power of L is formed, so correlated keys are as safe as with a triangular solve.
"""

import torch

BASE_BLOCK = 16


def _diagonal_blocks(x, size, pick_row=0, pick_col=0, step=1):
    """Blocks ``(step * i + pick_row, step * i + pick_col)`` of size ``size`` of ``x [..., n, n]``.

    Returns ``[..., n / (size * step), size, size]``.
    """
    count = x.shape[-1] // (size * step)
    tiles = x.unflatten(-1, (count, step, size)).unflatten(-4, (count, step, size))
    picked = tiles[..., :, pick_row, :, :, pick_col, :]               # [..., count, size, count, size]
    # A stack of slices, not diagonal(): torch-mlir has no StableHLO lowering of aten.diagonal.
    return torch.stack([picked[..., i, :, i, :] for i in range(count)], -3)  # [..., count, size, size]


def unit_lower_inverse(lower):
    """``(I + strict_lower(lower))^-1``.

    Args:
        lower: ``[..., n, n]`` float32; only the strictly lower triangle is read. n is a power
            of two times a divisor of 16 (32 and 64 in this backend).

    Returns:
        ``[..., n, n]`` unit lower triangular.
    """
    n = lower.shape[-1]
    size = min(BASE_BLOCK, n)
    blocks = _diagonal_blocks(lower, size)
    inverse = torch.eye(size, dtype=lower.dtype, device=lower.device).expand(blocks.shape).clone()
    for row in range(1, size):
        inverse[..., row, :row] = -(blocks[..., row:row + 1, :row] @ inverse[..., :row, :row]).squeeze(-2)
    while size < n:
        upper_inv, lower_inv = inverse[..., 0::2, :, :], inverse[..., 1::2, :, :]
        coupling = _diagonal_blocks(lower, size, pick_row=1, pick_col=0, step=2)
        off = -(lower_inv @ coupling @ upper_inv)
        top = torch.cat([upper_inv, torch.zeros_like(upper_inv)], -1)
        bottom = torch.cat([off, lower_inv], -1)
        inverse = torch.cat([top, bottom], -2)
        size *= 2
    return inverse.squeeze(-3)
