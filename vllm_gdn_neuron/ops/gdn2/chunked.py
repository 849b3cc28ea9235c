"""GDN-2's chunked prefill in torch (channel-wise gates), float32 throughout: the per-chunk tensors
of channel-wise gates, on the scan ``ops.backends.torch.chunked`` runs for GDN (docs/gdn-math.md,
section 3).
"""

import torch

from ..backends.torch.chunked import chunked_scan, masked_exp_, per_value_head
from ..backends.torch.triangular import unit_lower_inverse

#: Chunk size C (channel-wise gates keep 64) and chunks built together per block.
GDN2_CHUNK_SIZE = 64
GDN2_BLOCK_CHUNKS = 8
#: Sub-chunk size of the intra-chunk matrices (diagonal blocks use a [B, B, Dk] exp).
SUB_CHUNK_SIZE = 16


def channel_intra(q, k, v, g, beta, w, group):
    """Per-chunk tensors for channel-wise gates (GDN-2).

    Args:
        q, k: ``[m, Hk, C, Dk]``; v: ``[m, Hv, C, Dv]``; g, beta: ``[m, Hv, C, Dk]``;
        w: ``[m, Hv, C, Dv]`` or None.

    Returns:
        ``(U, W, exp(G) Q, P, exp(G_C - G) K, chunk_decay)`` for ``_scan``, each
        ``[m, Hv, ...]``; chunk_decay is ``[m, Hv, Dk, 1]`` (per key channel).
    """
    size, sub = q.shape[2], SUB_CHUNK_SIZE
    k = per_value_head(k, group).flatten(1, 2)
    q = per_value_head(q, group).flatten(1, 2)
    cum = g.cumsum(-2)
    beta_k = beta * k
    a = q.new_zeros(q.shape[:2] + (size, size))
    p = torch.zeros_like(a)
    upper = torch.ones(sub, sub, dtype=torch.bool, device=q.device).triu(1)[..., None]
    for lo in range(0, size, sub):
        rows = slice(lo, lo + sub)
        cum_i, k_i = cum[..., rows, :], k[..., rows, :]
        pair_decay = masked_exp_(cum_i[..., :, None, :] - cum_i[..., None, :, :], upper)
        a[..., rows, rows] = (beta_k[..., rows, None, :] * k_i[..., None, :, :] * pair_decay).sum(-1)
        p[..., rows, rows] = (q[..., rows, None, :] * k_i[..., None, :, :] * pair_decay).sum(-1)
        if lo:
            ref = cum[..., lo - 1:lo, :]
            to_ref = (cum_i - ref).exp()
            from_ref = (k[..., :lo, :] * (ref - cum[..., :lo, :]).exp()).transpose(-1, -2)
            a[..., rows, :lo] = (beta_k[..., rows, :] * to_ref) @ from_ref
            p[..., rows, :lo] = (q[..., rows, :] * to_ref) @ from_ref
    inverse = unit_lower_inverse(a)
    head_decay = cum.exp()
    u = inverse @ (v if w is None else w * v)
    w_keys = inverse @ (head_decay * beta_k)
    return u, w_keys, head_decay * q, p, (cum[..., -1:, :] - cum).exp() * k, cum[..., -1, :].exp()[..., None]


def gdn2_prefill(q, k, v, g, beta, w, cu_seqlens, initial_state, scale, use_qk_l2norm):
    """GDN-2 over packed varlen tokens (arguments validated, ``cu_seqlens`` int64, ``scale`` resolved).

    Returns:
        ``(o [T, Hv, Dv] in q's dtype, final_state [N, Hv, Dk, Dv] float32)``.
    """
    return chunked_scan(q, k, v, (g, beta, w), cu_seqlens, initial_state, scale, use_qk_l2norm, channel_intra,
                    GDN2_CHUNK_SIZE, GDN2_BLOCK_CHUNKS)
