"""Chunk machinery shared by the chunked kernels (gdn_cte, gdn2): the mask tile, the blocked
Schur-complement inverse and the sequential state step.

``T = (I + A)^-1`` for a strictly lower triangular ``A = diag(beta) E`` of one chunk, block
size doubling 1, 2, 4, ...: ``T <- T - T (A * M_j) T`` at level ``j`` with the level mask
``M_j`` of the mask pack. See ``docs/gdn-math.md`` sections 3-4 and ``docs/kernels/gdn_cte.md``.
"""

import math

from . import tiles as tl
from .mask_pack import IDENTITY, N_MASKS, NUM_LEVELS
from .nki_compat import nisa, nl

PSUM_BANK_FP32 = 512  # fp32 elements per partition in one PSUM bank


class Masks(nl.NKIObject):
    """The mask pack on chip (``[chunk, planes, chunk]`` fp32 SBUF tiles, one DMA each).

    The planes a chunk's preparation reads (triangles, identity, blocks) are loaded at once;
    the Schur level planes only at their first use, so the first chunk's loads do not queue
    behind them on the DMA bandwidth.
    """

    def __init__(self, mask_pack, chunk):
        self.pack = mask_pack
        self.chunk = chunk
        self.gate_tile = self._load(NUM_LEVELS, N_MASKS)
        self.level_tile = None

    def _load(self, first, stop):
        """Planes ``first .. stop-1``: element ``(p, i, f)`` of the tile is ``mask_pack[first + i, p, f]``."""
        full = self.pack.shape[1]
        tile = tl.sbuf((self.chunk, stop - first, self.chunk))
        nisa.dma_copy(dst=tile, src=self.pack.ap(pattern=[[full, self.chunk], [full * full, stop - first],
                                                          [1, self.chunk]], offset=first * full * full))
        return tile

    def plane(self, index):
        """Plane ``index`` of the pack (a mask_pack constant) as a ``[chunk, chunk]`` view."""
        if index < NUM_LEVELS:
            return self.levels(index, index + 1)[:, 0, :]
        return self.gate_tile[:, index - NUM_LEVELS, :]

    def levels(self, first, stop):
        """The level planes ``first .. stop-1`` as a ``[chunk, stop - first, chunk]`` view."""
        if self.level_tile is None:
            self.level_tile = self._load(0, NUM_LEVELS)
        return self.level_tile[:, first:stop, :]


def _half(tiles, first, count, block, odd):
    """Columns with bit ``log2(block)`` equal to ``odd`` of chunks ``first .. first+count-1`` of a
    group tile ``[C, G, C]``, as the view ``[C, count, C / 2b, b]``.

    At the level with block size ``b``: the upper (``odd=False``) or lower half of every
    ``2b`` pair of blocks.
    """
    chunk, group = tiles.shape[0], tiles.shape[1]
    pairs = chunk // (2 * block)
    return tiles.ap(pattern=[[group * chunk, chunk], [chunk, count], [2 * block, pairs], [1, block]],
                    offset=first * chunk + (block if odd else 0))


def schur_levels(chunks, masks, first_level, chunk, dtype=nl.float32):
    """Blocked Schur complement, level-major over ``chunks``: ``T <- T - T (A * M_j) T``.

    ``masks`` is the :class:`Masks` of the kernel. Each element of ``chunks`` carries ``e_t`` (``E^T``: ``[C, C]`` fp32, strictly causal,
    orientation ``[s, r]``), ``beta`` (``[C, 1]``, ``A = diag(beta) E``) and optionally ``t`` /
    ``t_t``: the block-diagonal inverse reached before ``first_level`` and its transpose (None:
    the identity). ``T^T`` is left in ``ch.t_t`` (a ``[C, C]`` view of a group tile); the
    level-major order lets one chunk's dependency chain hide behind the others'.

    Level ``j`` (block ``b = 2**j``): ``Y = diag(beta) (E * M_j) T``, ``T -= T Y``,
    ``T^T -= Y^T T^T``. ``Y`` and ``T Y`` live in the columns whose bit ``j`` is 0 and
    ``Y^T T^T`` in those whose bit ``j`` is 1, so every matmul streams half the columns; the
    last level skips ``T Y`` (only ``T^T`` is used afterwards). ``T`` and ``T^T`` of all the
    chunks live in two group tiles ``[C, G, C]`` and the products of up to a PSUM bank of
    chunks land in one PSUM tile, so one VectorE instruction updates that many chunks (the
    fixed cost of an instruction exceeds the data time of a ``[C, C/2]`` update).

    ``dtype`` is the operand dtype of the level matmuls and the storage dtype of ``T`` /
    ``T^T`` / ``Y``. Storing them narrow rounds each entry once only: a level writes new
    blocks, disjoint from the ones it reads, so nothing accumulates across levels.
    """
    last = int(math.log2(chunk)) - 1
    levels = last + 1 - first_level
    group = len(chunks)
    per_bank = PSUM_BANK_FP32 // (chunk // 2)
    t_all = tl.sbuf((chunk, group, chunk), dtype)
    t_t_all = tl.sbuf((chunk, group, chunk), dtype)
    eye = masks.plane(IDENTITY)
    for i in range(group):
        ch = chunks[i]
        # every level's blocks of E in one instruction: E^T broadcast over the level axis
        e_levels = ch.e_t.ap(pattern=[[chunk, chunk], [0, levels], [1, chunk]])
        ch.e_t = tl.binary(e_levels, masks.levels(first_level, last + 1), nl.multiply, dtype=dtype)
        start_t, start_t_t = (eye, eye) if ch.t is None else (ch.t, ch.t_t)
        nisa.tensor_copy(dst=t_all[:, i, :], src=start_t, engine=nisa.engine.gpsimd)
        nisa.tensor_copy(dst=t_t_all[:, i, :], src=start_t_t, engine=nisa.engine.gpsimd)
    for level in range(first_level, last + 1):
        block = 2**level
        y_all = tl.sbuf((chunk, group, chunk), dtype)
        nisa.memset(dst=_half(y_all, 0, group, block, odd=True), value=0.0, engine=nisa.engine.gpsimd)
        for i in range(group):  # every chunk's Y first: TensorE never waits on one evacuation
            products = tl.matmul(chunks[i].e_t[:, level - first_level, :], _half(t_all, i, 1, block, odd=False))
            nisa.activation(dst=_half(y_all, i, 1, block, odd=False), op=nl.copy, data=products,
                            scale=chunks[i].beta)
        for first in range(0, group, per_bank):
            count = min(per_bank, group - first)
            if level < last:
                z = nl.ndarray((chunk, count, chunk // 2), dtype=nl.float32, buffer=nl.psum)
                for j in range(count):
                    nisa.nc_matmul(z[:, j, :], t_t_all[:, first + j, :], _half(y_all, first + j, 1, block, odd=False))
                t_even = _half(t_all, first, count, block, odd=False)
                nisa.tensor_tensor(dst=t_even, data1=t_even, data2=z, op=nl.subtract)
            z_t = nl.ndarray((chunk, count, chunk // 2), dtype=nl.float32, buffer=nl.psum)
            for j in range(count):
                nisa.nc_matmul(z_t[:, j, :], y_all[:, first + j, :], _half(t_t_all, first + j, 1, block, odd=True))
            t_t_odd = _half(t_t_all, first, count, block, odd=True)
            nisa.tensor_tensor(dst=t_t_odd, data1=t_t_odd, data2=z_t, op=nl.subtract)
    for i in range(group):
        ch = chunks[i]
        ch.t = None
        ch.e_t = None
        ch.t_t = t_t_all[:, i, :]


def advance(ch, state, scale, cdt, out_dtype, zero_state=False):
    """One chunk's output tile (``[C, Dv]`` in ``out_dtype``); ``state`` (``[Dk, Dv]`` fp32) advanced in place.

    ``ch`` carries ``u`` (``[C, Dv]`` fp32), ``w_t`` (``[Dk, C]``, cdt), ``q_g_t`` (``[Dk, C]``,
    cdt), ``p_t`` (``[C, C]`` fp32), ``k_decay`` (``[C, Dk]`` fp32) and ``state_decay``
    (``[Dk, 1]``). Computes ``V' = U - W S``, ``O = scale (e^G Q S + P V')`` (one PSUM
    accumulation) and ``S <- e^{G_C} S + (e^{G_C - G} K)^T V'``, the last into ``state``
    itself, so the state is one tile for the whole sequence (what a device loop over chunk
    groups needs: its body rewrites the tile instead of rebinding a name).

    ``zero_state``: the state is known to be zero (a sequence's first chunk without an
    incoming state): no state terms, and ``state`` is written, not read.
    """
    if zero_state:
        v_new = ch.u
        o = tl.matmul(ch.p_t, v_new)
    else:
        s_c = state if cdt == nl.float32 else tl.copy(state, cdt)
        v_new = tl.binary(ch.u, tl.matmul(ch.w_t, s_c), nl.subtract)
        o = tl.matmul(ch.q_g_t, s_c)
        tl.matmul_accumulate(o, ch.p_t, v_new)
    out = tl.scaled_copy(o, scale, dtype=out_dtype)
    update = tl.matmul(ch.k_decay, v_new)
    if zero_state:
        nisa.tensor_copy(dst=state, src=update)
    else:
        nisa.scalar_tensor_tensor(dst=state, data=state, op0=nl.multiply, operand0=ch.state_decay, op1=nl.add,
                                  operand1=update)
    return out
