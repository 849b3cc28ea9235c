"""``gdn_cte``: chunked Gated DeltaNet prefill (context encoding) as an NKI kernel.

Math: ``docs/gdn-math.md`` sections 3-4; design: ``docs/kernels/gdn_cte.md``;
torch mirror of the same steps: ``gdn_cte_torch.py``.

Per value head ``h`` (key head ``h // (Hv // Hk)``) and chunk of ``C`` tokens, on chip:

1. gates: ``G = cumsum(g)`` (a matmul with the causal ones mask), ``D^T[s, r] =
   exp(sum_{s<t<=r} g_t)`` from one matmul of the gates themselves (never a difference of
   large cumsums, never the exp of a positive number);
2. ``E^T = (K K^T) * D^T`` strictly causal, ``P^T = (K Q^T) * D^T`` causal;
3. ``T^T = ((I + diag(beta) E)^-1)^T``: "schur" (C = 128) runs the blocked Schur complement
   level-major over ``group_size`` chunks, its level matmuls in the compute dtype; "neumann"
   (C = 64) Neumann products on the 16 x 16 diagonal blocks, then two Schur levels between
   them, all in fp32 (powers of A grow without bound on correlated keys);
4. ``U = T (beta V)``, ``W^T = (beta e^G K)^T T^T``;
5. sequential over chunks: ``V' = U - W S``, ``O = scale (e^G Q S + P V')``,
   ``S <- e^{G_C} S + (e^{G_C - G} K)^T V'``.

The state ``S`` lives in SBUF (fp32) for the whole sequence; it is read from its cache row once
(when there is one) and written back once.
"""

from . import tiles as tl
import numpy as np
import torch

from .checks import (FLOAT_DTYPES, MAX_HEAD_DIM, check_at_most, check_choice, check_dtype, check_multiple,
                     check_positive_int, check_rank, check_same_dtype, check_shape, check_slots)
from .chunked import Masks, advance, schur_levels
from .l2norm import L2NORM_EPS  # x * rsqrt(sum(x^2) + eps), docs/gdn-math.md section 1
from .mask_pack import BLOCK_DIAG_16, CHUNK, IDENTITY, N_MASKS, STRICT_LOWER, STRICT_UPPER, UPPER, build_mask_pack
from .nki_call import NkiOp, device_constant, index_tensor
from .nki_compat import nki, nisa, nl

ALGORITHMS = ("schur", "neumann")
CHUNK_OF = {"schur": CHUNK, "neumann": 64}
NEUMANN_FIRST_SCHUR_LEVEL = 4  # the 16 x 16 blocks come from Neumann products; levels 16, 32 remain
MAX_GROUP_SIZE = 16  # 16 chunks in flight: ~136 KiB of 192 KiB SBUF per partition at Dk = Dv = 128, fp32


class _Chunk(nl.NKIObject):
    """The on-chip tiles of one chunk that outlive its preparation (see the module steps):
    ``rows, beta, e_t, p_t, t, t_t, bv, kb, q_g_t, k_decay, state_decay, u, w_t``."""


def _l2_normalised(x, eps, dtype):
    """Rows of ``x`` ``[C, D]`` times ``rsqrt(sum(x^2) + eps)`` (fp32 math), stored in ``dtype``."""
    sum_sq = tl.reduce(tl.binary(x, x, nl.multiply), nl.add, axis=1)
    return tl.scaled_copy(x, tl.activation(sum_sq, nl.rsqrt, bias=eps), dtype)


def _prepare_chunk(query, key, value, g_log, beta, b, h, hk, c0, chunk, masks, ones, eps, cdt):
    """Load one chunk and form everything that needs neither the inverse nor the state.

    ``eps``: a ``[C, 1]`` tile of the L2-norm epsilon to normalise q and k on chip, or None.
    """
    dk = query.shape[3]
    ch = _Chunk()
    ch.rows = nl.ds(c0, chunk)
    q = tl.load(query[b, hk, ch.rows, :])
    k = tl.load(key[b, hk, ch.rows, :])
    if eps is not None:
        q, k = _l2_normalised(q, eps, cdt), _l2_normalised(k, eps, cdt)
    v = tl.load(value[b, h, ch.rows, :])
    g = tl.load(g_log[b, h, ch.rows].reshape((chunk, 1)))
    ch.beta = tl.load(beta[b, h, ch.rows].reshape((chunk, 1)))
    q_t, k_t = tl.transpose(q, cdt), tl.transpose(k, cdt)
    upper = masks.plane(UPPER)

    g_up = tl.scalar(upper, nl.multiply, g)                                    # [t, r] g_t [t <= r]
    decay_t = tl.activation(tl.mask_matmul(masks.plane(STRICT_LOWER), g_up), nl.exp)  # [s, r] exp(sum_{s<t<=r} g)
    g_cum = tl.copy(tl.mask_matmul(upper, g))                                  # [C, 1]  G_s
    g_rows = tl.scaled_copy(tl.mask_matmul(ones, g_up))                        # [max(C, Dk), C]  G_r per row
    ch.e_t = tl.binary(tl.matmul(k_t, k_t), tl.binary(decay_t, masks.plane(STRICT_UPPER), nl.multiply),
                       nl.multiply)
    ch.p_t = tl.binary(tl.matmul(k_t, q_t), tl.binary(decay_t, upper, nl.multiply), nl.multiply)

    e_g = tl.activation(g_cum, nl.exp)
    ch.k_decay = tl.gpsimd_scaled(k, decay_t[:, chunk - 1:chunk])               # e^{G_C - G_s} k_s
    ch.kb = tl.gpsimd_scaled(k, tl.binary(ch.beta, e_g, nl.multiply), dtype=cdt)
    ch.bv = tl.gpsimd_scaled(v, ch.beta, dtype=cdt)
    ch.q_g_t = tl.binary(q_t, tl.activation(g_rows[0:dk, :], nl.exp), nl.multiply, dtype=cdt)
    ch.state_decay = tl.activation(g_rows[0:dk, chunk - 1:chunk], nl.exp)     # [Dk, 1]  e^{G_C}
    ch.t = None  # schur_levels starts from the identity
    ch.t_t = None
    return ch


def _product(x_t, y):
    """``(X Y, (X Y)^T)`` from ``X^T`` and ``Y``."""
    return tl.copy(tl.matmul(x_t, y)), tl.copy(tl.matmul(y, x_t))


def _neumann_blocks(ch, masks):
    """``T`` and ``T^T`` on the 16 x 16 diagonal blocks: ``(I + N)(I + N^2)(I + N^4)(I + N^8)``, ``N = -A``."""
    eye = masks.plane(IDENTITY)
    block = masks.plane(BLOCK_DIAG_16)
    a = tl.scalar(tl.transpose(ch.e_t), nl.multiply, ch.beta)                  # A [r, s]
    n = tl.scalar(tl.binary(a, block, nl.multiply), nl.multiply, -1.0)
    n_t = tl.transpose(n)
    n2, n2_t = _product(n_t, n)
    n4, n4_t = _product(n2_t, n2)
    n8 = tl.copy(tl.matmul(n4_t, n4))
    f, f_t = _product(tl.binary(eye, n_t, nl.add), tl.binary(eye, n2, nl.add))
    f, f_t = _product(f_t, tl.binary(eye, n4, nl.add))
    t, t_t = _product(f_t, tl.binary(eye, n8, nl.add))
    ch.t = t
    ch.t_t = t_t


def _finish_chunk(ch, cdt):
    """``U = T (beta V)`` (fp32) and ``W^T`` (compute dtype) from ``T^T``."""
    t_t = ch.t_t if ch.t_t.dtype == cdt else tl.copy(ch.t_t, cdt)
    ch.u = tl.scaled_copy(tl.matmul(t_t, ch.bv))
    ch.w_t = tl.scaled_copy(tl.matmul(ch.kb, t_t), dtype=cdt)
    ch.t_t = None
    ch.bv = None
    ch.kb = None


def _group(query, key, value, g_log, beta, out, state, b, h, hk, first_token, count, masks, ones, eps, scale,
           algorithm, zero_state=False):
    """``count`` consecutive chunks from token ``first_token`` of sequence ``b``, value head ``h``:
    prepared, inverted together, then advanced in order on ``state`` (updated in place;
    ``zero_state``: it holds nothing yet and is zero)."""
    cdt = query.dtype
    chunk = CHUNK_OF[algorithm]
    chunks = []
    for c in range(count):
        chunks.append(_prepare_chunk(query, key, value, g_log, beta, b, h, hk, first_token + c * chunk, chunk, masks,
                                     ones, eps, cdt))
    if algorithm == "schur":
        schur_levels(chunks, masks, 0, chunk, cdt)
    else:
        _neumann_blocks(chunks[0], masks)
        schur_levels(chunks, masks, NEUMANN_FIRST_SCHUR_LEVEL, chunk)
    for ch in chunks:
        _finish_chunk(ch, cdt)
    for i in range(count):
        tl.store(out[b, h, chunks[i].rows, :], advance(chunks[i], state, scale, cdt, cdt, zero_state and i == 0))


def _head(query, key, value, g_log, beta, out, state_cache, slot, b, h, hk, masks, ones, eps, scale, algorithm,
          group, initial):
    """The whole sequence ``b`` of value head ``h``; the state comes from / goes back to row ``slot``
    of ``state_cache``. Full groups of chunks are a device loop (``nl.sequential_range``: the
    state carries over), so the program holds a group or three whatever the length: the first
    group peeled when it starts from zero, the loop, a partial last group."""
    dk = query.shape[3]
    dv = value.shape[3]
    chunk = CHUNK_OF[algorithm]
    n_chunks = query.shape[2] // chunk
    first = 0
    if initial:
        state = tl.load(state_cache[slot, h])
    else:  # the first group starts from zero: peeled, without state terms
        state = tl.sbuf((dk, dv))
        first = min(group, n_chunks)
        _group(query, key, value, g_log, beta, out, state, b, h, hk, 0, first, masks, ones, eps, scale, algorithm,
               zero_state=True)
    full = (n_chunks - first) // group
    masks.levels(0, 1)  # the whole pack on chip before the device loop (its body runs on every iteration)
    for g in nl.sequential_range(full):
        _group(query, key, value, g_log, beta, out, state, b, h, hk, first * chunk + g * (group * chunk), group,
               masks, ones, eps, scale, algorithm)
    rest = n_chunks - first - full * group
    if rest > 0:
        _group(query, key, value, g_log, beta, out, state, b, h, hk, (n_chunks - rest) * chunk, rest, masks, ones,
               eps, scale, algorithm)
    tl.store(state_cache[slot, h], state)


@nki.jit
def gdn_cte_kernel(query, key, value, g_log, beta, mask_pack, state_cache, state_slots, scale=1.0,
                   algorithm="schur", group_size=8, use_qk_l2norm=False, initial_state=True):
    """The NKI kernel behind :func:`gdn_cte` (arguments already checked).

    Sequence ``b`` starts from row ``state_slots[b]`` of ``state_cache`` (``[pages, Hv, Dk, Dv]``
    fp32; zero instead when ``initial_state`` is False) and its final state is written back
    there: the slots are a ``[1, B]`` int32 tensor read into a register per sequence, so one
    compiled kernel serves every slot assignment. Sequences and key heads are device loops.

    Returns:
        ``(out [B, Hv, S, Dv] in the compute dtype, state_cache)`` (the cache updated in place).
    """
    b_size, hk_size, s_len, dk = query.shape
    hv_size = value.shape[1]
    dv = value.shape[3]
    ratio = hv_size // hk_size
    chunk = CHUNK_OF[algorithm]
    group = group_size if algorithm == "schur" else 1
    out = nl.ndarray((b_size, hv_size, s_len, dv), dtype=query.dtype, buffer=nl.shared_hbm)
    masks = Masks(mask_pack, chunk)
    ones = tl.filled((chunk, chunk if chunk > dk else dk), 1.0)  # G_r broadcast onto max(C, Dk) partitions
    eps = tl.filled((chunk, 1), L2NORM_EPS) if use_qk_l2norm else None
    slots = tl.load(state_slots)
    for b in nl.affine_range(b_size):
        slot = nisa.register_alloc(0)
        nisa.register_load(slot, slots[0:1, b:b + 1])
        for hk in nl.affine_range(hk_size):
            for r in range(ratio):
                _head(query, key, value, g_log, beta, out, state_cache, slot, b, hk * ratio + r, hk, masks, ones,
                      eps, scale, algorithm, group, initial_state)
    return out, state_cache


def check_gdn_cte_args(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state,
                       cache_rows=False):
    """Raise ``ValueError`` (argument, expected, actual) for anything the kernel cannot run.

    ``cache_rows``: ``recurrent_state`` is a state cache ``[pages, Hv, Dk, Dv]`` indexed by slots.
    """
    check_choice("algorithm", algorithm, ALGORITHMS)
    check_rank("query", query, 4, "[B, Hk, S, Dk]")
    check_rank("key", key, 4, "[B, Hk, S, Dk]")
    check_rank("value", value, 4, "[B, Hv, S, Dv]")
    check_dtype("query", query, FLOAT_DTYPES)
    check_same_dtype("key", key, "query", query)
    check_same_dtype("value", value, "query", query)
    b_size, hk, s_len, dq = query.shape
    dk = key.shape[3]
    if dq != dk:
        raise ValueError(f"query and key must have the same head size (Dq == Dk), got Dq={dq}, Dk={dk}")
    check_shape("key", key, (b_size, hk, s_len, dk), "[B, Hk, S, Dk]")
    hv, dv = value.shape[1], value.shape[3]
    check_shape("value", value, (b_size, hv, s_len, dv), "[B, Hv, S, Dv]")
    check_at_most("Dk (key.shape[3])", dk, MAX_HEAD_DIM, "one partition tile")
    check_at_most("Dv (value.shape[3])", dv, MAX_HEAD_DIM, "one partition tile")
    if hv % hk:
        raise ValueError(f"Hv (value.shape[1]) must be a multiple of Hk (key.shape[1]), got Hv={hv}, Hk={hk}")
    check_multiple("S (query.shape[2])", s_len, CHUNK_OF[algorithm], f"the {algorithm} chunk")
    for name, gate in (("g_log", g_log), ("beta", beta)):
        check_shape(name, gate, (b_size, hv, s_len), "[B, Hv, S]")
        check_dtype(name, gate, ("float32",))
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise ValueError(f"scale must be a Python float, got {scale!r}")
    check_positive_int("group_size", group_size)
    check_at_most("group_size", group_size, MAX_GROUP_SIZE, "chunks in flight that fit SBUF at Dk = Dv = 128, fp32")
    if mask_pack is not None:
        check_shape("mask_pack", mask_pack, (N_MASKS, CHUNK, CHUNK), "[N_MASKS, CHUNK, CHUNK]")
        check_dtype("mask_pack", mask_pack, ("float32",))
    if algorithm == "neumann":
        if hv != hk:
            raise ValueError(f"algorithm='neumann' needs Hk == Hv, got Hk={hk}, Hv={hv}")
        if recurrent_state is not None:
            raise ValueError("algorithm='neumann' supports no incoming state: recurrent_state must be None")
    if recurrent_state is not None:
        rows = recurrent_state.shape[0] if cache_rows else b_size
        check_shape("recurrent_state", recurrent_state, (rows, hv, dk, dv),
                    "[pages, Hv, Dk, Dv]" if cache_rows else "[B, Hv, Dk, Dv]")
        check_dtype("recurrent_state", recurrent_state, ("float32",))


def default_mask_pack(like):
    """``build_mask_pack()`` on ``like``'s device (a NumPy array when ``like`` is one), built once per device."""
    return device_constant("mask_pack", build_mask_pack, like)


GDN_CTE = NkiOp("gdn_cte", gdn_cte_kernel, mutates_args=("state_cache",))


def gdn_cte(query, key, value, g_log, beta, scale=1.0, algorithm="schur", mask_pack=None, group_size=8,
            recurrent_state=None, use_qk_l2norm=False, state_slots=None):
    """Chunked GDN prefill on the NKI kernel.

    Dimensions:
        B batch; Hk key/query heads; Hv value heads (a multiple of Hk); S tokens (a multiple
        of 128 for "schur", of 64 for "neumann"); Dk (= Dq), Dv <= 128.

    Args:
        query, key: ``[B, Hk, S, Dk]``, L2-normalised (or see ``use_qk_l2norm``), one dtype
            (fp32, bf16 or fp16) which sets the compute dtype (matmul operands, q/k/v tiles, out).
        value: ``[B, Hv, S, Dv]`` in the compute dtype.
        g_log: ``[B, Hv, S]`` fp32 natural-log decay (<= 0).
        beta: ``[B, Hv, S]`` fp32.
        scale: output scale, applied on device.
        algorithm: "schur" (default, chunk 128) or "neumann" (chunk 64); a trace-time constant.
        mask_pack: ``[N_MASKS, 128, 128]`` fp32 from :func:`build_mask_pack`, or None for the
            per-device default.
        group_size: chunks inverted together, level-major ("schur"); 1 to 16.
        recurrent_state: ``[B, Hv, Dk, Dv]`` fp32 initial state, updated in place and returned
            (with ``state_slots``: a cache ``[pages, Hv, Dk, Dv]`` whose rows ``state_slots`` are
            the sequences' states); None starts from zero without a load ("neumann" supports
            only None).
        use_qk_l2norm: normalise q and k per token on chip first (``x * rsqrt(sum(x^2) + 1e-6)``,
            fp32 math, the result in the compute dtype).
        state_slots: ``[B]`` int tensor (or sequence) of cache rows, or None for rows ``0..B-1``.

    Returns:
        ``(out, final_state)``: ``[B, Hv, S, Dv]`` un-normalised in the compute dtype, and the
        fp32 state (``recurrent_state`` itself when supplied).

    Raises:
        ValueError: for any constraint above, naming the argument, before any work.
    """
    check_gdn_cte_args(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state,
                       cache_rows=state_slots is not None)
    b_size = query.shape[0]
    cache = recurrent_state
    if state_slots is not None:
        if recurrent_state is None:
            raise ValueError("state_slots needs recurrent_state (the state cache the slots index)")
        check_slots("state_slots", state_slots,
                    recurrent_state.shape[0], b_size)
    if not isinstance(use_qk_l2norm, bool):
        raise ValueError(f"use_qk_l2norm must be a bool, got {use_qk_l2norm!r}")
    if mask_pack is None:
        mask_pack = default_mask_pack(query)
    if cache is None:
        shape = (b_size, value.shape[1], key.shape[3], value.shape[3])
        cache = torch.zeros(shape, dtype=torch.float32, device=query.device) if isinstance(query, torch.Tensor) \
            else np.zeros(shape, np.float32)
    slots = index_tensor(range(b_size) if state_slots is None else state_slots, query)
    out, cache = GDN_CTE(query, key, value, g_log, beta, mask_pack, cache, slots, scale=float(scale),
                         algorithm=algorithm, group_size=group_size, use_qk_l2norm=use_qk_l2norm,
                         initial_state=recurrent_state is not None)
    return out, cache
