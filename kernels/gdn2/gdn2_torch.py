"""Torch mirror of the GDN-2 kernel: same contract (packed varlen + ``cu_seqlens``), same chunk
size, the same per-source-token construction of ``A`` and ``P`` and the same Schur inverse
(``gdn_cte_torch.schur_inverse_t``), all in fp32. See ``gdn2.py`` for the math."""

import torch

from .gdn2 import GDN2_CHUNK
from ..gdn_cte_torch import schur_inverse_t
from ..mask_pack import STRICT_LOWER, STRICT_UPPER, UPPER, build_mask_pack


def _pairwise(g, k, bk, q, pack):
    """``(A^T, P^T)`` ``[C, C]`` of one zero-filled chunk, built one source token at a time."""
    c = g.shape[0]
    upper = pack[UPPER, :c, :c]
    a = torch.zeros(c, c)
    p = torch.zeros(c, c)
    for s in range(c):
        decay = torch.exp(torch.clamp((upper - upper[:, s:s + 1]).T @ g, max=0.0))  # [t, d] G_t - G_s
        a[:, s] = (bk * decay) @ k[s]
        p[:, s] = (q * decay) @ k[s]
    return a.T * pack[STRICT_UPPER, :c, :c], p.T * upper


def gdn2_chunked_torch(q, k, v, g, beta, w, cu_seqlens, scale=1.0, initial_state=None, mask_pack=None):
    """See ``gdn2.gdn2_chunked``: ``(o [T, Hv, Dv] in q's dtype, final_state [N, Hv, Dk, Dv] fp32)``."""
    pack = torch.as_tensor(build_mask_pack() if mask_pack is None else mask_pack, dtype=torch.float32)
    c = GDN2_CHUNK
    upper, strict_lower = pack[UPPER, :c, :c], pack[STRICT_LOWER, :c, :c]
    bounds = [int(b) for b in cu_seqlens]
    t_len, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    ratio = hv // hk
    w = torch.ones(v.shape) if w is None else w
    out = torch.zeros(t_len, hv, dv, dtype=q.dtype)
    final = torch.zeros(len(bounds) - 1, hv, dk, dv)
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        for h in range(hv):
            state = torch.zeros(dk, dv) if initial_state is None else initial_state[n, h].float()
            for c0 in range(start, end, c):
                length = min(c, end - c0)

                def rows(x, head):
                    tile = torch.zeros(c, x.shape[-1])
                    tile[:length] = x[c0:c0 + length, head].float()
                    return tile

                qc, kc = rows(q, h // ratio), rows(k, h // ratio)
                gc, bc, wv = rows(g, h), rows(beta, h), rows(v, h) * rows(w, h)
                bk = bc * kc
                e_t, p_t = _pairwise(gc, kc, bk, qc, pack)
                t_t = schur_inverse_t(e_t, torch.ones(c), pack)
                e_g = torch.exp(upper.T @ gc)
                u, w_t = t_t.T @ wv, (bk * e_g).T @ t_t
                v_new = u - w_t.T @ state
                o = (qc * e_g) @ state + p_t.T @ v_new
                out[c0:c0 + length, h] = (scale * o[:length]).to(q.dtype)
                k_decay = kc * torch.exp(strict_lower.T @ gc)
                state = torch.exp(gc.sum(0))[:, None] * state + k_decay.T @ v_new
            final[n, h] = state
    return out, final
