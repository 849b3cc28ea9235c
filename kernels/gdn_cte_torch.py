"""Torch mirror of the ``gdn_cte`` NKI kernel: same contract, layout and step order.

Every intermediate the kernel forms on chip is formed here with the same orientation, the
same masks from the mask pack and the same operand dtypes, so a kernel bug can be located by
comparing the two step by step. It is a debugging aid and a second implementation, not the
oracle: both are tested against ``vllm_gdn_neuron.kernels.reference``.

``_mm(stationary, moving)`` models ``nisa.nc_matmul``: ``stationary^T @ moving`` with the
operands rounded to the compute dtype and fp32 accumulation. Operand precision, as in the
kernel: q/k/v, the schur levels, ``T^T`` (for U and W) and the state (for ``W S`` and
``Q S``) in the compute dtype; neumann's inverse and the corrected values ``V'`` with the two
matmuls that consume them in fp32 (``V'`` is amplified by ``T`` on correlated keys: bf16 there misses the 2e-2 tolerance). Orientation ``[s, r]`` means
source token on the partition axis, destination token on the free axis (see mask_pack.py).
"""

import torch

from .l2norm import l2norm
from .mask_pack import BLOCK_DIAG_16, CHUNK, IDENTITY, LEVEL_MASK, STRICT_LOWER, STRICT_UPPER, UPPER, build_mask_pack

NEUMANN_CHUNK = 64


def _mm(stationary, moving, dtype=torch.float32):
    """``stationary^T @ moving`` in fp32 from operands rounded to ``dtype`` (TensorE)."""
    return stationary.to(dtype).float().T @ moving.to(dtype).float()


def chunk_gates(g, pack):
    """Gate tiles of one chunk.

    Args:
        g: ``[C]`` fp32 log decay of the chunk's tokens.
        pack: the mask pack.

    Returns:
        ``(G, decay_t)``: ``G = cumsum(g)`` ``[C]`` and ``decay_t[s, r] = exp(sum_{s<t<=r} g_t)``
        ``[C, C]``, which is ``exp(G_r - G_s)`` for ``s <= r`` and 1 elsewhere (masked later).

    Notes:
        The exponent comes from one matmul, ``[t > s]^T @ (g_t [t <= r])``, whose terms are the
        gates themselves: no difference of two large rounded cumsums (g down to -20 makes
        ``|G|`` reach thousands, whose fp32 rounding would show in ``exp(G_r - G_s)``), and no
        positive exponent for ``g <= 0``.
    """
    c = g.shape[0]
    upper, strict_lower = pack[UPPER, :c, :c], pack[STRICT_LOWER, :c, :c]
    G = _mm(upper, g[:, None])[:, 0]
    return G, torch.exp(_mm(strict_lower, upper * g[:, None]))


def schur_inverse_t(e_t, beta, pack, first_level=0, t=None, t_t=None, dtype=torch.float32):
    """``T^T = ((I + A)^-1)^T`` by the blocked Schur complement, block size doubling.

    Args:
        e_t: ``[C, C]`` fp32 ``(K K^T * D)`` strictly causal, transposed ``[s, r]``.
        beta: ``[C]`` fp32; ``A = diag(beta) E``.
        pack: the mask pack (top-left ``C x C`` corner used).
        first_level: first level to run (neumann starts at 4, after its 16 x 16 blocks).
        t, t_t: the block-diagonal inverse reached so far and its transpose (identity if None).
        dtype: operand dtype of the level matmuls (the kernel's compute dtype for "schur").

    Returns:
        ``[C, C]`` fp32 ``T^T``.

    Notes:
        Level ``j`` (block ``b = 2**j``): ``T <- T - T (A * M_j) T``; three matmuls
        (``Y = (A * M_j) T``, ``T Y``, ``Y^T T^T``), two at the last level (only ``T^T`` is used).
    """
    c = e_t.shape[0]
    eye = pack[IDENTITY, :c, :c]
    t = eye.clone() if t is None else t
    t_t = eye.clone() if t_t is None else t_t
    last = (c.bit_length() - 1) - 1
    for j in range(first_level, last + 1):
        y = (beta[:, None] * _mm(e_t * pack[LEVEL_MASK[j], :c, :c], t, dtype)).to(dtype).float()
        if j < last:
            t = t - _mm(t_t, y, dtype)
        t_t = t_t - _mm(y, t_t, dtype)
    return t_t


def neumann_inverse_t(e_t, beta, pack):
    """``T^T`` for a 64-token chunk: Neumann products on the 16 x 16 diagonal blocks, then the
    two Schur levels (blocks 16 and 32) that substitute between them.

    Args and Returns: as ``schur_inverse_t`` with ``C = 64``.

    Notes:
        With ``N = -A`` on the diagonal blocks (nilpotent, ``N^16 = 0``),
        ``(I - N)^-1 = (I + N)(I + N^2)(I + N^4)(I + N^8)``. Each product ``X Y`` is formed
        with its transpose from ``(X^T, Y)``: ``X Y = mm(X^T, Y)``, ``(X Y)^T = mm(Y, X^T)``.
    """
    c = e_t.shape[0]
    eye = pack[IDENTITY, :c, :c]
    block = pack[BLOCK_DIAG_16, :c, :c]
    a_t = e_t * beta[None, :]
    n, n_t = -(a_t.T * block), -(a_t * block)

    def pair(x_t, y):
        return _mm(x_t, y), _mm(y, x_t)

    n2, n2_t = pair(n_t, n)
    n4, n4_t = pair(n2_t, n2)
    n8 = _mm(n4_t, n4)
    f, f_t = pair(eye + n_t, eye + n2)
    f, f_t = pair(f_t, eye + n4)
    f, f_t = pair(f_t, eye + n8)
    return schur_inverse_t(e_t, beta, pack, first_level=4, t=f, t_t=f_t)


def gdn_cte_torch(query, key, value, g_log, beta, scale=1.0, algorithm="schur", mask_pack=None,
                  group_size=8, recurrent_state=None, use_qk_l2norm=False):
    """Chunked GDN prefill in torch, the kernel's contract (see ``gdn_cte.gdn_cte``).

    Dimensions:
        B batch, Hk / Hv key / value heads, S tokens (a multiple of the chunk), Dk / Dv.

    Args:
        query, key: ``[B, Hk, S, Dk]``, L2-normalised, the compute dtype.
        value: ``[B, Hv, S, Dv]``.
        g_log, beta: ``[B, Hv, S]`` fp32.
        scale: output scale.
        algorithm: ``"schur"`` (chunk 128) or ``"neumann"`` (chunk 64).
        mask_pack: ``[N_MASKS, 128, 128]`` or None to build one.
        group_size: accepted for signature parity; the torch order does not depend on it.
        recurrent_state: ``[B, Hv, Dk, Dv]`` fp32 initial state, updated in place, or None.
        use_qk_l2norm: normalise q and k per token first (fp32 math, back in the compute dtype).

    Returns:
        ``(out [B, Hv, S, Dv] in the compute dtype, final_state [B, Hv, Dk, Dv] fp32)``.
    """
    del group_size
    cdt = query.dtype
    if use_qk_l2norm:
        query, key = (l2norm(x) for x in (query, key))
    pack = torch.as_tensor(build_mask_pack() if mask_pack is None else mask_pack, dtype=torch.float32)
    chunk = CHUNK if algorithm == "schur" else NEUMANN_CHUNK
    b_size, hk, s_len, dk = query.shape
    hv, dv = value.shape[1], value.shape[3]
    ratio = hv // hk
    out = torch.empty(b_size, hv, s_len, dv, dtype=cdt)
    final = torch.zeros(b_size, hv, dk, dv) if recurrent_state is None else recurrent_state
    strict, upper = pack[STRICT_UPPER, :chunk, :chunk], pack[UPPER, :chunk, :chunk]
    for b in range(b_size):
        for h in range(hv):
            state = final[b, h].float().clone()
            for c0 in range(0, s_len, chunk):
                rows = slice(c0, c0 + chunk)
                q, k, v = query[b, h // ratio, rows], key[b, h // ratio, rows], value[b, h, rows]
                gl, bt = g_log[b, h, rows].float(), beta[b, h, rows].float()
                G, decay_t = chunk_gates(gl, pack)
                e_t = _mm(k.T, k.T, cdt) * decay_t * strict
                if algorithm == "schur":
                    t_t = schur_inverse_t(e_t, bt, pack, dtype=cdt)
                else:
                    t_t = neumann_inverse_t(e_t, bt, pack)
                u = _mm(t_t, bt[:, None] * v.float(), cdt)
                w_t = _mm((bt * torch.exp(G))[:, None] * k.float(), t_t, cdt)
                v_new = u - _mm(w_t, state, cdt)
                p_t = _mm(k.T, q.T, cdt) * decay_t * upper
                o = torch.exp(G)[:, None] * _mm(q.T, state, cdt) + _mm(p_t, v_new)
                out[b, h, rows] = (scale * o).to(cdt)
                k_decay = decay_t[:, -1:] * k.float()
                state = torch.exp(G[-1]) * state + _mm(k_decay, v_new)
            final[b, h] = state
    return out, final
