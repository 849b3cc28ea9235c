"""Chunked prefill of GDN (scalar gates) and GDN-2 (channel-wise gates), float32 throughout.

Per chunk of C tokens with state S0 at its start (shared/docs/gdn-math.md, section 3), both
variants reduce to the same five tensors, built for many chunks at once:

    A    strictly lower C x C: how much each earlier write in the chunk changes a token's v_new
    P    lower-inclusive C x C: the intra-chunk attention of the output
    U    = (I + A)^-1 (value side)           V' = U - W S0     (the writes actually made)
    W    = (I + A)^-1 (decayed key side)     O  = P U + (exp(G) Q - P W) S0
    Kd   = exp(G_C - G) K                    S1 = exp(G_C) S0 + Kd^T V'

so the sequential part (``_scan``) is two batched matmuls per chunk step over all sequences
and heads. Every exponent is <= 0: pairwise decays are masked to -inf above the diagonal
before the exp; with channel-wise gates the off-diagonal sub-chunk blocks factor through a
reference position between the two tokens, ``exp(G_r - G_s) = exp(G_r - G_ref) exp(G_ref - G_s)``
with both factors <= 1, and the diagonal sub-chunk blocks take the pairwise exp per channel.
"""

import torch

from .chunk_layout import ChunkLayout, pad_token_row
from .common import prepare_qk

CHUNK_SIZE = 64
#: Sub-chunk size of the GDN-2 intra-chunk matrices (diagonal blocks use a [B, B, Dk] exp).
SUB_CHUNK_SIZE = 16
#: Chunks whose intra-chunk tensors are built together (bounds the temporaries' memory).
GDN_BLOCK_CHUNKS = 32
GDN2_BLOCK_CHUNKS = 8


def _masked_exp(diff, mask):
    """exp of pairwise log-decays, -inf (-> 0) where ``mask`` is set, before the exp."""
    return diff.masked_fill(mask, float("-inf")).exp()


def _expand_heads(x, group):
    """``[m, Hk, ...]`` -> ``[m, Hk * group, ...]``, value head h reading key head h // group."""
    if group == 1:
        return x
    return x.unsqueeze(2).expand(x.shape[0], x.shape[1], group, *x.shape[2:]).flatten(1, 2)


def _scalar_intra(q, k, v, g, beta, group):
    """Intra-chunk tensors for scalar gates.

    Args:
        q, k: ``[m, Hk, C, Dk]``; v: ``[m, Hv, C, Dv]``; g, beta: ``[m, Hv, C]``.

    Returns:
        ``(A, P, rhs_v, rhs_k, q_decayed, Kd, chunk_decay)``, see the module docstring;
        chunk_decay is ``[m, Hv, 1, 1]``.
    """
    m, num_k_heads, size, _ = q.shape
    cum = g.cumsum(-1)
    upper = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)
    decay = _masked_exp(cum[..., :, None] - cum[..., None, :], upper).unflatten(1, (num_k_heads, group))
    kk = (k @ k.transpose(-1, -2)).unsqueeze(2)
    qk = (q @ k.transpose(-1, -2)).unsqueeze(2)
    a = (kk * decay).flatten(1, 2) * beta[..., :, None]
    p = (qk * decay).flatten(1, 2)
    k, q = _expand_heads(k, group), _expand_heads(q, group)
    head_decay = cum.exp()[..., None]
    beta = beta[..., None]
    return (a, p, beta * v, beta * head_decay * k, head_decay * q, (cum[..., -1:] - cum).exp()[..., None] * k,
            cum[..., -1].exp()[..., None, None])


def _channel_intra(q, k, v, g, beta, w, group):
    """Intra-chunk tensors for channel-wise gates (GDN-2).

    Args:
        q, k: ``[m, Hk, C, Dk]``; v: ``[m, Hv, C, Dv]``; g, beta: ``[m, Hv, C, Dk]``;
        w: ``[m, Hv, C, Dv]`` or None.

    Returns:
        as ``_scalar_intra``, with chunk_decay ``[m, Hv, Dk, 1]``.
    """
    size, sub = q.shape[2], SUB_CHUNK_SIZE
    k, q = _expand_heads(k, group), _expand_heads(q, group)
    cum = g.cumsum(-2)
    beta_k = beta * k
    a = q.new_zeros(q.shape[:2] + (size, size))
    p = torch.zeros_like(a)
    upper = torch.ones(sub, sub, dtype=torch.bool, device=q.device).triu(1)[..., None]
    for lo in range(0, size, sub):
        rows = slice(lo, lo + sub)
        cum_i, k_i = cum[..., rows, :], k[..., rows, :]
        pair_decay = _masked_exp(cum_i[..., :, None, :] - cum_i[..., None, :, :], upper)
        a[..., rows, rows] = (beta_k[..., rows, None, :] * k_i[..., None, :, :] * pair_decay).sum(-1)
        p[..., rows, rows] = (q[..., rows, None, :] * k_i[..., None, :, :] * pair_decay).sum(-1)
        if lo:
            ref = cum[..., lo - 1:lo, :]
            to_ref = (cum_i - ref).exp()
            from_ref = (k[..., :lo, :] * (ref - cum[..., :lo, :]).exp()).transpose(-1, -2)
            a[..., rows, :lo] = (beta_k[..., rows, :] * to_ref) @ from_ref
            p[..., rows, :lo] = (q[..., rows, :] * to_ref) @ from_ref
    head_decay = cum.exp()
    return (a, p, v if w is None else w * v, head_decay * beta_k, head_decay * q,
            (cum[..., -1:, :] - cum).exp() * k, cum[..., -1, :].exp()[..., None])


def _solve(a, p, rhs_v, rhs_k, q_decayed):
    """``U, W = (I + strict_lower(A))^-1 [rhs_v | rhs_k]``; returns U, [W; exp(G) Q - P W], P U."""
    solved = torch.linalg.solve_triangular(a, torch.cat([rhs_v, rhs_k], -1), upper=False, unitriangular=True)
    u, w = solved.split([rhs_v.shape[-1], rhs_k.shape[-1]], -1)
    return u, torch.cat([w, q_decayed - p @ w], -2), p @ u


def _scan(state, steps, lo, u, w_q, out, k_decayed, chunk_decay):
    """Advance the ranked states through the block's chunk steps; ``out`` (= P U) gains P' S0."""
    size = u.shape[2]
    for offset, active in steps:
        chunks = slice(offset - lo, offset - lo + active)
        s = state[:active]
        read = w_q[chunks] @ s
        written = u[chunks] - read[:, :, :size]
        out[chunks] += read[:, :, size:]
        state[:active] = chunk_decay[chunks] * s + k_decayed[chunks].transpose(-1, -2) @ written


def _chunked(q, k, v, gates, cu_seqlens, initial_state, scale, use_qk_l2norm, build, block_chunks):
    """Shared driver: pack into chunks, build intra-chunk tensors per block, scan, unpack."""
    num_v_heads, dim_v, dim_k = v.shape[1], v.shape[2], q.shape[2]
    group = num_v_heads // q.shape[1]
    q, k = prepare_qk(q, k, scale, use_qk_l2norm)
    layout = ChunkLayout(cu_seqlens, CHUNK_SIZE, q.device)
    rows = [pad_token_row(x) for x in (q, k, v)]
    gate_rows = [None if x is None else pad_token_row(x) for x in gates]
    num_seqs = cu_seqlens.numel() - 1
    if initial_state is None:
        state = q.new_zeros(num_seqs, num_v_heads, dim_k, dim_v)
    else:
        state = initial_state.index_select(0, layout.order).float()
    out = q.new_empty(layout.num_tokens + 1, num_v_heads, dim_v, dtype=v.dtype)
    for lo, hi, steps in layout.blocks(block_chunks):
        chunk_q, chunk_k, chunk_v = (layout.gather(x, lo, hi) for x in rows)
        chunk_gates = [None if x is None else layout.gather(x, lo, hi) for x in gate_rows]
        a, p, rhs_v, rhs_k, q_decayed, k_decayed, chunk_decay = build(chunk_q, chunk_k, chunk_v, *chunk_gates,
                                                                      group)
        u, w_q, o = _solve(a, p, rhs_v, rhs_k, q_decayed)
        _scan(state, steps, lo, u, w_q, o, k_decayed, chunk_decay)
        layout.scatter(out, o, lo, hi)
    final_state = torch.empty_like(state)
    final_state[layout.order] = state
    return out[:-1], final_state


def gdn_prefill(q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``."""
    return _chunked(q, k, v, (g, beta), cu_seqlens, initial_state, scale, use_qk_l2norm, _scalar_intra,
                    GDN_BLOCK_CHUNKS)


def gdn2_prefill(q, k, v, g, beta, w, cu_seqlens, initial_state, scale, use_qk_l2norm):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``."""
    return _chunked(q, k, v, (g, beta, w), cu_seqlens, initial_state, scale, use_qk_l2norm, _channel_intra,
                    GDN2_BLOCK_CHUNKS)
