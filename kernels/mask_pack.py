"""The mask pack: every constant 0/1 mask the chunked GDN kernels multiply by, built once.

The kernels work in the *transposed* orientation ``[s, r]``: the partition axis is the
source token ``s``, the free axis the destination token ``r``; that is the orientation in
which a mask multiplies a TensorE stationary operand (``nc_matmul`` computes
``stationary^T @ moving``). All planes are ``CHUNK x CHUNK`` (CHUNK = 128); a kernel with a
smaller chunk (neumann, 64) uses the top-left corner, which is the same mask for that chunk.

Planes (index constants below):

- ``LEVEL_MASK[j]``, j = 0..6, block size ``b = 2**j``: 1 where ``s`` lies in the upper and
  ``r`` in the lower half of the same ``2b``-block. These select, at level ``j`` of the
  blocked Schur complement, the blocks ``R`` of ``[[P, 0], [R, Q]]`` (transposed).
- ``STRICT_UPPER``: ``s < r`` (the strictly causal mask of ``A``, transposed).
- ``UPPER``: ``s <= r`` (the causal mask of the output, transposed; also the cumsum matrix).
- ``STRICT_LOWER``: ``s > r`` (with ``UPPER``, forms the in-chunk decay exponents
  ``sum_{s < t <= r} g_t`` in one matmul, see ``gdn_cte_torch.chunk_gates``).
- ``IDENTITY``.
- ``BLOCK_DIAG_16``: ``s // 16 == r // 16`` (the neumann diagonal blocks).
"""

import numpy as np

CHUNK = 128
NUM_LEVELS = 7  # log2(CHUNK): block sizes 1, 2, 4, ..., 64
LEVEL_MASK = tuple(range(NUM_LEVELS))
STRICT_UPPER = NUM_LEVELS
UPPER = NUM_LEVELS + 1
IDENTITY = NUM_LEVELS + 2
BLOCK_DIAG_16 = NUM_LEVELS + 3
STRICT_LOWER = NUM_LEVELS + 4
N_MASKS = NUM_LEVELS + 5
NEUMANN_BLOCK = 16


def level_mask(block, chunk=CHUNK):
    """``[chunk, chunk]`` 0/1 mask ``[s, r]`` of the Schur level that merges blocks of size ``block``."""
    s = np.arange(chunk)[:, None]
    r = np.arange(chunk)[None, :]
    same_pair = (s // (2 * block)) == (r // (2 * block))
    return same_pair & ((s // block) % 2 == 0) & ((r // block) % 2 == 1)


def build_mask_pack(dtype=np.float32):
    """Build the mask pack.

    Returns:
        ``[N_MASKS, CHUNK, CHUNK]`` NumPy array of 0.0 / 1.0 in ``dtype`` (float32 for the
        kernels); plane meanings in the module docstring.
    """
    s = np.arange(CHUNK)[:, None]
    r = np.arange(CHUNK)[None, :]
    planes = [level_mask(2**j) for j in range(NUM_LEVELS)]
    planes.append(s < r)
    planes.append(s <= r)
    planes.append(s == r)
    planes.append((s // NEUMANN_BLOCK) == (r // NEUMANN_BLOCK))
    planes.append(s > r)
    return np.stack(planes).astype(dtype)
