"""Chunk machinery shared by the chunked kernels (gdn_cte, gdn2): the mask tile, the blocked
Schur-complement inverse and the sequential state step.

``T = (I + A)^-1`` for a strictly lower triangular ``A = diag(beta) E`` of one chunk, block
size doubling 1, 2, 4, ...: ``T <- T - T (A * M_j) T`` at level ``j`` with the level mask
``M_j`` of the mask pack. See gdn-math.md sections 3-4 and ``kernels/docs/gdn_cte.md``.
"""

import numpy as np

from . import tiles as tl
from .mask_pack import N_MASKS
from .nki_compat import nisa, nl


def load_masks(mask_pack, chunk):
    """The mask pack's top-left ``chunk x chunk`` corners as one SBUF tile ``[chunk, N_MASKS, chunk]``.

    One DMA: element ``(p, plane, f)`` of the tile is ``mask_pack[plane, p, f]``.
    """
    full = mask_pack.shape[1]
    masks = tl.sbuf((chunk, N_MASKS, chunk))
    nisa.dma_copy(dst=masks, src=mask_pack.ap(pattern=[[full, chunk], [full * full, N_MASKS], [1, chunk]]))
    return masks


def half_columns(tile, block, odd):
    """The columns of the ``[C, C]`` root tile whose bit ``log2(block)`` is ``odd``, as ``[C, C / 2b, b]``.

    At the level with block size ``b``, the upper (lower) half of every ``2b`` pair of blocks.
    """
    chunk = tile.shape[0]
    pairs = tile.shape[1] // (2 * block)
    return tile.ap(pattern=[[tile.shape[1], chunk], [2 * block, pairs], [1, block]], offset=block if odd else 0)


def schur_levels(chunks, masks, first_level, chunk, dtype=nl.float32):
    """Blocked Schur complement, level-major over ``chunks``: ``T <- T - T (A * M_j) T``.

    Each element of ``chunks`` carries ``e_t`` (``E^T``: ``[C, C]`` fp32, strictly causal,
    orientation ``[s, r]``), ``beta`` (``[C, 1]``, ``A = diag(beta) E``) and ``t`` / ``t_t``
    (root ``[C, C]`` tiles in ``dtype``: the block-diagonal inverse reached before
    ``first_level`` and its transpose; the identity to start). They are updated in place and
    ``T^T`` is left in ``ch.t_t``; the level-major order lets one chunk's dependency chain hide
    behind the others'.

    Level ``j`` (block ``b = 2**j``): ``Y = diag(beta) (E * M_j) T``, ``T -= T Y``,
    ``T^T -= Y^T T^T``. ``Y`` and ``T Y`` live in the columns whose bit ``j`` is 0 and
    ``Y^T T^T`` in those whose bit ``j`` is 1, so every matmul streams half the columns
    (``half_columns``); the last level skips ``T Y`` (only ``T^T`` is used afterwards).

    ``dtype`` is the operand dtype of the level matmuls and the storage dtype of ``T`` /
    ``T^T`` / ``Y``. Storing them narrow rounds each entry once only: a level writes new
    blocks, disjoint from the ones it reads, so nothing accumulates across levels.
    """
    last = int(np.log2(chunk)) - 1
    levels = last + 1 - first_level
    for ch in chunks:
        # every level's blocks of E in one instruction: E^T broadcast over the level axis
        e_levels = ch.e_t.ap(pattern=[[chunk, chunk], [0, levels], [1, chunk]])
        ch.e_t = tl.binary(e_levels, masks[:, first_level:last + 1, :], nl.multiply, dtype=dtype)
    for level in range(first_level, last + 1):
        block = 2**level
        for ch in chunks:
            y = tl.sbuf((chunk, chunk), dtype)
            nisa.memset(dst=half_columns(y, block, odd=True), value=0.0, engine=nisa.engine.gpsimd)
            y_even = half_columns(y, block, odd=False)
            products = tl.matmul(ch.e_t[:, level - first_level, :], half_columns(ch.t, block, odd=False))
            nisa.activation(dst=y_even, op=nl.copy, data=products, scale=ch.beta)
            if level < last:
                t_even = half_columns(ch.t, block, odd=False)
                nisa.tensor_tensor(dst=t_even, data1=t_even, data2=tl.matmul(ch.t_t, y_even), op=nl.subtract)
            t_t_odd = half_columns(ch.t_t, block, odd=True)
            nisa.tensor_tensor(dst=t_t_odd, data1=t_t_odd, data2=tl.matmul(y, t_t_odd), op=nl.subtract)
    for ch in chunks:
        ch.t = ch.e_t = None


def advance(ch, state, scale, cdt, out_dtype):
    """One chunk's output tile (``[C, Dv]`` in ``out_dtype``) and the next state (``[Dk, Dv]`` fp32).

    ``ch`` carries ``u`` (``[C, Dv]`` fp32), ``w_t`` (``[Dk, C]``, cdt), ``q_g_t`` (``[Dk, C]``,
    cdt), ``p_t`` (``[C, C]`` fp32), ``k_decay`` (``[C, Dk]`` fp32) and ``state_decay``
    (``[Dk, 1]``). ``state`` None means zero: no load and no state terms. Computes
    ``V' = U - W S``, ``O = scale (e^G Q S + P V')`` (one PSUM accumulation) and
    ``S <- e^{G_C} S + (e^{G_C - G} K)^T V'``.
    """
    if state is None:
        v_new = ch.u
        o = tl.matmul(ch.p_t, v_new)
    else:
        s_c = state if cdt == nl.float32 else tl.copy(state, cdt)
        v_new = tl.binary(ch.u, tl.matmul(ch.w_t, s_c), nl.subtract)
        o = tl.matmul(ch.q_g_t, s_c)
        tl.matmul_accumulate(o, ch.p_t, v_new)
    out = tl.scaled_copy(o, scale, dtype=out_dtype)
    update = tl.matmul(ch.k_decay, v_new)
    if state is None:
        return out, tl.copy(update)
    return out, tl.binary(tl.scalar(state, nl.multiply, ch.state_decay), update, nl.add)
