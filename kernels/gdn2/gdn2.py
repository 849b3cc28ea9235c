"""GDN-2 (channel-wise g / beta per key channel, w per value channel): a chunked NKI kernel
over packed varlen sequences.

Math: ``docs/gdn-math.md`` section 2; design: ``docs/kernels/gdn2.md``; torch
mirror: ``gdn2_torch.py``. Per sequence, value head and chunk of ``C = 64`` tokens (the last
chunk of a sequence is zero-filled: k = v = w = 0, g = 0, beta = 0 is exact), with
``G = cumsum(g)`` per channel (``[C, Dk]``)::

    A[t, s] = sum_d beta_td k_td k_sd exp(G_td - G_sd)          s < t
    P[t, s] = sum_d q_td k_sd exp(G_td - G_sd)                   s <= t
    T = (I + A)^-1                       blocked Schur complement (shared with gdn_cte)
    U = T (w v),  W = T (beta e^G k),  V' = U - W S
    O = scale ((q e^G) S + P V')
    S <- diag(e^{G_C}) S + (k e^{G_C - G})^T V'

Per-channel decay does not factor into a row and a column scaling without exponentiating
positive numbers, so ``A`` and ``P`` are built one source token ``s`` at a time: the exponent
``G_t - G_s = sum_{s < t' <= t} g_t'`` comes from one matmul of the gates themselves
(``[Dk, C]``, channels on partitions), is clamped at 0 (only ``t < s`` could be positive and
is masked afterwards), exponentiated, multiplied by ``(beta k)^T`` / ``q^T`` and contracted
with ``k_s`` on TensorE into column ``s`` of ``A`` / ``P``. Every matmul operand is fp32.
"""

from .. import tiles as tl
from ..checks import check_dtype, check_shape, check_token_major_qkv
from ..chunked import Masks, advance, schur_levels
from ..gdn_cte import MAX_HEAD_DIM, default_mask_pack
from ..mask_pack import STRICT_LOWER, STRICT_UPPER, UPPER
from ..nki_call import NkiOp
from ..nki_compat import nki, nisa, nl

GDN2_CHUNK = 64
SOURCE_BATCH = 8  # source tokens per exponent matmul: 8 x 64 = 512 columns, one PSUM bank


class _Chunk(nl.NKIObject):
    """Tiles of one GDN-2 chunk read by the inverse (``schur_levels``) and the state step (``advance``):
    ``start, length, e_t, beta, t, t_t, p_t, wv, kg, q_g_t, k_decay, state_decay, u, w_t``."""


def _load_rows(src, length, chunk):
    """HBM rows ``src`` (``[length, W]``) as a ``[chunk, W]`` fp32 tile, zero below ``length``."""
    tile = tl.sbuf((chunk, src.shape[1]))
    if length < chunk:
        nisa.memset(dst=tile, value=0.0)
    nisa.dma_copy(dst=tile[0:length, :], src=src)
    return tile


def _pairwise(g, k_t, bk_t, q_t, masks, upper, length, chunk):
    """``(A^T, P^T)`` of one chunk: ``[C, C]`` fp32, orientation ``[s, t]``, strictly / inclusively causal.

    Source tokens go ``SOURCE_BATCH`` at a time: their exponent tiles come from one matmul
    (``SOURCE_BATCH x C`` moving columns) and are clamped, exponentiated and weighted by
    ``(beta k)^T`` / ``q^T`` (side by side in one ``[Dk, 2, C]`` tile) in one instruction each;
    one matmul (``M = 2C``) per source token then gives column ``s`` of ``A`` (rows ``0..C-1``)
    and of ``P`` (rows ``C..2C-1``). ``upper``: the causal mask as a root ``[C, C]`` tile.
    """
    dk = g.shape[1]
    stacked = tl.sbuf((dk, 2, chunk))
    nisa.tensor_copy(dst=stacked[:, 0, :], src=bk_t)
    nisa.tensor_copy(dst=stacked[:, 1, :], src=q_t)
    columns = nl.ndarray((2 * chunk, chunk), dtype=nl.float32, buffer=nl.psum)  # columns >= length stay unwritten
    for s0 in range(0, length, SOURCE_BATCH):
        n = min(SOURCE_BATCH, length - s0)
        # since[t', i, t] = [t' <= t] - [t' <= s0 + i]: +1 exactly on s < t' <= t
        since = tl.binary(upper.ap(pattern=[[chunk, chunk], [0, n], [1, chunk]]),
                          upper.ap(pattern=[[chunk, chunk], [1, n], [0, chunk]], offset=s0), nl.subtract)
        exponent = tl.scalar(tl.matmul(g, since), nl.minimum, 0.0)       # [d, (i, t)]: G_td - G_sd, t >= s
        decay = tl.activation(exponent, nl.exp)
        weighted = tl.binary(stacked.ap(pattern=[[2 * chunk, dk], [0, n], [chunk, 2], [1, chunk]]),
                             decay.ap(pattern=[[n * chunk, dk], [chunk, n], [0, 2], [1, chunk]]), nl.multiply)
        for i in range(n):
            nisa.nc_matmul(columns[:, s0 + i:s0 + i + 1], weighted[:, i, :, :], k_t[:, s0 + i:s0 + i + 1])
    both = tl.filled((2 * chunk, chunk), 0.0)
    nisa.tensor_copy(dst=both[:, 0:length], src=columns[:, 0:length])
    e_t = tl.binary(tl.transpose(both[0:chunk, :]), masks.plane(STRICT_UPPER), nl.multiply)
    p_t = tl.binary(tl.transpose(both[chunk:2 * chunk, :]), upper, nl.multiply)
    return e_t, p_t


def _prepare_chunk(q, k, v, g_gate, beta, w, n_tok, h, hk, masks, upper, ones_col, chunk):
    """Load one (possibly partial) chunk of tokens ``n_tok = (start, length)`` and form its tiles."""
    start, length = n_tok
    rows = nl.ds(start, length)
    ch = _Chunk()
    ch.start = start
    ch.length = length
    qt = _load_rows(q[rows, hk, :], length, chunk)
    kt = _load_rows(k[rows, hk, :], length, chunk)
    g = _load_rows(g_gate[rows, h, :], length, chunk)
    bt = _load_rows(beta[rows, h, :], length, chunk)
    ch.wv = _load_rows(v[rows, h, :], length, chunk)
    if w is not None:
        ch.wv = tl.binary(ch.wv, _load_rows(w[rows, h, :], length, chunk), nl.multiply)
    bk = tl.binary(bt, kt, nl.multiply)
    k_t = tl.transpose(kt)
    e_t, p_t = _pairwise(g, k_t, tl.transpose(bk), tl.transpose(qt), masks, upper, length, chunk)
    ch.e_t = e_t
    ch.p_t = p_t
    e_g = tl.activation(tl.mask_matmul(upper, g), nl.exp)                          # [t, d] e^{G_td}
    ch.kg = tl.binary(bk, e_g, nl.multiply)
    ch.q_g_t = tl.transpose(tl.binary(qt, e_g, nl.multiply))
    to_end = tl.activation(tl.mask_matmul(masks.plane(STRICT_LOWER), g), nl.exp)    # e^{G_C - G_t} per channel
    ch.k_decay = tl.binary(kt, to_end, nl.multiply)
    ch.state_decay = tl.activation(tl.matmul(g, ones_col), nl.exp)            # [Dk, 1] e^{G_C}
    ch.beta = ones_col                                                        # beta already inside A
    ch.t = None  # schur_levels starts from the identity
    ch.t_t = None
    return ch


def _chunks_of(start, end, chunk):
    """``(start, length)`` of each chunk of the tokens ``start .. end - 1``."""
    chunks = []
    for c0 in range(start, end, chunk):
        chunks.append((c0, min(chunk, end - c0)))
    return chunks


@nki.jit
def gdn2_kernel(q, k, v, g, beta, w, mask_pack, initial_state=None, cu_seqlens=(), scale=1.0):
    """The NKI kernel behind :func:`gdn2_chunked` (arguments already checked)."""
    t_len, hk_size, dk = q.shape
    hv_size, dv = v.shape[1], v.shape[2]
    ratio = hv_size // hk_size
    chunk = GDN2_CHUNK
    n_seq = len(cu_seqlens) - 1
    out = nl.ndarray((t_len, hv_size, dv), dtype=q.dtype, buffer=nl.shared_hbm)
    final = nl.ndarray((n_seq, hv_size, dk, dv), dtype=nl.float32, buffer=nl.shared_hbm)
    masks = Masks(mask_pack, chunk)
    upper = tl.copy(masks.plane(UPPER))  # a root tile: _pairwise broadcasts it with access patterns
    ones_col = tl.filled((chunk, 1), 1.0)
    for n in range(n_seq):
        for h in range(hv_size):
            state = tl.filled((dk, dv), 0.0) if initial_state is None else tl.load(initial_state[n, h])
            fresh = initial_state is None
            for n_tok in _chunks_of(cu_seqlens[n], cu_seqlens[n + 1], chunk):
                ch = _prepare_chunk(q, k, v, g, beta, w, n_tok, h, h // ratio, masks, upper, ones_col, chunk)
                schur_levels([ch], masks, 0, chunk)
                ch.u = tl.copy(tl.matmul(ch.t_t, ch.wv))
                ch.w_t = tl.copy(tl.matmul(ch.kg, ch.t_t))
                o = advance(ch, state, scale, nl.float32, q.dtype, fresh)
                fresh = False
                tl.store(out[nl.ds(ch.start, ch.length), h, :], o[0:ch.length, :])
            tl.store(final[n, h], state)
    return out, final


# Sequence boundaries are still compile-time constants here (one kernel per composition).
GDN2 = NkiOp("gdn2_chunked", gdn2_kernel, static_args=("cu_seqlens",))


def gdn2_chunked(q, k, v, g, beta, w, cu_seqlens, scale=1.0, initial_state=None, mask_pack=None):
    """Chunked GDN-2 prefill of packed varlen sequences on the NKI kernel.

    Dimensions:
        T packed tokens of N sequences; Hk key heads; Hv value heads (a multiple of Hk);
        Dk, Dv <= 128.

    Args:
        q, k: ``[T, Hk, Dk]`` L2-normalised; v: ``[T, Hv, Dv]``; one dtype (fp32, bf16, fp16).
        g: ``[T, Hv, Dk]`` fp32 per-channel natural-log decay (<= 0).
        beta: ``[T, Hv, Dk]`` fp32 per key channel.
        w: ``[T, Hv, Dv]`` fp32 per value channel, or None for ones.
        cu_seqlens: ``N + 1`` sequence boundaries (0 first, T last, non-decreasing), trace-time
            constants (a Python sequence or a CPU tensor).
        scale: output scale.
        initial_state: ``[N, Hv, Dk, Dv]`` fp32 (K-major) or None for zeros (no load).
        mask_pack: from :func:`build_mask_pack`, or None to build one.

    Returns:
        ``(o [T, Hv, Dv] in q's dtype, final_state [N, Hv, Dk, Dv] fp32)``.
    """
    t_len, hk, dk, hv, dv = check_token_major_qkv(("q", "k", "v"), q, k, v, "T", MAX_HEAD_DIM)
    for name, gate in (("g", g), ("beta", beta)):
        check_shape(name, gate, (t_len, hv, dk), "[T, Hv, Dk]")
        check_dtype(name, gate, ("float32",))
    if w is not None:
        check_shape("w", w, (t_len, hv, dv), "[T, Hv, Dv]")
        check_dtype("w", w, ("float32",))
    bounds = [int(b) for b in (cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else cu_seqlens)]
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != t_len or any(b > a for b, a in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens must run from 0 to T = {t_len} without decreasing, got {bounds}")
    if initial_state is not None:
        check_shape("initial_state", initial_state, (len(bounds) - 1, hv, dk, dv), "[N, Hv, Dk, Dv]")
        check_dtype("initial_state", initial_state, ("float32",))
    if mask_pack is None:
        mask_pack = default_mask_pack(q)
    return GDN2(q, k, v, g, beta, w, mask_pack, initial_state, cu_seqlens=tuple(bounds), scale=float(scale))
