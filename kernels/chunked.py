"""Chunk machinery shared by the chunked kernels (gdn_cte, gdn2): the mask tile, the blocked
Schur-complement inverse and the sequential state step.

``T = (I + A)^-1`` for a strictly lower triangular ``A = diag(beta) E`` of one chunk, block
size doubling 1, 2, 4, ...: ``T <- T - T (A * M_j) T`` at level ``j`` with the level mask
``M_j`` of the mask pack. See gdn-math.md sections 3-4 and ``kernels/docs/gdn_cte.md``.
"""

import numpy as np

from . import tiles as tl
from .mask_pack import LEVEL_MASK, N_MASKS
from .nki_compat import nisa, nl


def load_masks(mask_pack, chunk):
    """The mask pack's top-left ``chunk x chunk`` corners as one SBUF tile ``[chunk, N_MASKS, chunk]``."""
    masks = tl.sbuf((chunk, N_MASKS, chunk))
    for plane in range(N_MASKS):
        nisa.dma_copy(dst=masks[:, plane, :], src=mask_pack[plane, 0:chunk, 0:chunk])
    return masks


def schur_levels(chunks, masks, first_level, chunk):
    """Blocked Schur complement, level-major over ``chunks``: ``T <- T - T (A * M_j) T``.

    Each element of ``chunks`` carries ``e_t`` (``E^T``: ``[C, C]`` fp32, strictly causal,
    orientation ``[s, r]``), ``beta`` (``[C, 1]``, ``A = diag(beta) E``) and ``t`` / ``t_t``
    (the block-diagonal inverse reached before ``first_level`` and its transpose; the
    identity to start). Leaves ``T^T`` in ``ch.t_t``; the level-major order lets one chunk's
    dependency chain hide behind the others'. ``Y = diag(beta) (E * M_j) T``; ``T Y`` and ``Y^T T^T``; the
    last level skips ``T Y`` (only ``T^T`` is used afterwards).
    """
    last = int(np.log2(chunk)) - 1
    for level in range(first_level, last + 1):
        level_mask = masks[:, LEVEL_MASK[level], :]
        for ch in chunks:
            y = tl.scalar(tl.matmul(tl.binary(ch.e_t, level_mask, nl.multiply), ch.t), nl.multiply, ch.beta)
            if level < last:
                ch.t = tl.binary(ch.t, tl.matmul(ch.t_t, y), nl.subtract)
            ch.t_t = tl.binary(ch.t_t, tl.matmul(y, ch.t_t), nl.subtract)
    for ch in chunks:
        ch.t = None


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
    out = tl.scalar(o, nl.multiply, scale, dtype=out_dtype)
    update = tl.matmul(ch.k_decay, v_new)
    if state is None:
        return out, tl.copy(update)
    return out, tl.binary(tl.scalar(state, nl.multiply, ch.state_decay), update, nl.add)
