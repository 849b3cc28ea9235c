"""The Gated DeltaNet recurrences, token by token in float64 (see docs/gdn-math.md).

State layout: K-major ``[Hv, Dk, Dv]`` per sequence. GQA: value head h reads query/key head
``h // (Hv // Hk)``.
"""

import torch

from ._common import as_float64, sequence_bounds
from .norms import l2norm


def _prepare(q, k, v, initial_state, cu_seqlens, scale, use_qk_l2norm):
    """float64 q/k/v with q, k expanded to the value heads; zero or copied states; scale."""
    q, k, v = as_float64(q), as_float64(k), as_float64(v)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    num_k_heads, dim_k = q.shape[1], q.shape[2]
    num_v_heads, dim_v = v.shape[1], v.shape[2]
    group = num_v_heads // num_k_heads
    q = q.repeat_interleave(group, dim=1)
    k = k.repeat_interleave(group, dim=1)
    bounds = sequence_bounds(cu_seqlens, q.shape[0])
    if initial_state is None:
        state = torch.zeros(len(bounds), num_v_heads, dim_k, dim_v, dtype=torch.float64)
    else:
        state = as_float64(initial_state).clone()
    scale = dim_k ** -0.5 if scale is None else float(scale)
    return q, k, v, state, bounds, scale


def gdn_recurrence(q, k, v, g, beta, cu_seqlens=None, initial_state=None, scale=None,
                   use_qk_l2norm=False):
    """Scalar-gated DeltaNet, one token at a time.

    Per value head and token: ``S <- exp(g) S``; ``v_new = beta (v - S^T k)``;
    ``S <- S + k v_new^T``; ``o = scale S^T q``.

    Dimensions:
        T: packed tokens of N sequences; Hk / Hv: key / value heads; Dk / Dv: head sizes.

    Args:
        q, k: ``[T, Hk, Dk]``.
        v: ``[T, Hv, Dv]``.
        g: ``[T, Hv]`` natural-log decay (<= 0).
        beta: ``[T, Hv]``.
        cu_seqlens: ``[N + 1]`` sequence boundaries, or None for one sequence.
        initial_state: ``[N, Hv, Dk, Dv]``, or None for zeros.
        scale: output scale, None for ``Dk ** -0.5``.
        use_qk_l2norm: L2-normalise q and k per head first.

    Returns:
        ``(o, final_state)``: ``[T, Hv, Dv]`` and ``[N, Hv, Dk, Dv]``, float64.
    """
    q, k, v, state, bounds, scale = _prepare(q, k, v, initial_state, cu_seqlens, scale, use_qk_l2norm)
    g, beta = as_float64(g), as_float64(beta)
    o = torch.zeros_like(v)
    for n, (start, end) in enumerate(bounds):
        s = state[n]
        for t in range(start, end):
            s = torch.exp(g[t])[:, None, None] * s
            v_new = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", s, k[t]))
            s = s + k[t][:, :, None] * v_new[:, None, :]
            o[t] = scale * torch.einsum("hkv,hk->hv", s, q[t])
        state[n] = s
    return o, state


def gdn2_recurrence(q, k, v, g, beta, w=None, cu_seqlens=None, initial_state=None, scale=None,
                    use_qk_l2norm=False):
    """GDN-2: channel-wise gates, one token at a time.

    Per value head and token: ``S <- diag(exp(g)) S``; ``v_new = w * v - S^T (beta * k)``;
    ``S <- S + k v_new^T``; ``o = scale S^T q``.

    Dimensions:
        T: packed tokens of N sequences; Hk / Hv: key / value heads; Dk / Dv: head sizes.

    Args:
        q, k: ``[T, Hk, Dk]``.
        v: ``[T, Hv, Dv]``.
        g: ``[T, Hv, Dk]`` natural-log decay per key channel (<= 0).
        beta: ``[T, Hv, Dk]`` write strength per key channel.
        w: ``[T, Hv, Dv]`` value weight per value channel, or None for ones.
        cu_seqlens: ``[N + 1]`` sequence boundaries, or None for one sequence.
        initial_state: ``[N, Hv, Dk, Dv]`` (K-major), or None for zeros.
        scale: output scale, None for ``Dk ** -0.5``.
        use_qk_l2norm: L2-normalise q and k per head first.

    Returns:
        ``(o, final_state)``: ``[T, Hv, Dv]`` and ``[N, Hv, Dk, Dv]``, float64.
    """
    q, k, v, state, bounds, scale = _prepare(q, k, v, initial_state, cu_seqlens, scale, use_qk_l2norm)
    g, beta = as_float64(g), as_float64(beta)
    w = torch.ones_like(v) if w is None else as_float64(w)
    o = torch.zeros_like(v)
    for n, (start, end) in enumerate(bounds):
        s = state[n]
        for t in range(start, end):
            s = torch.exp(g[t])[:, :, None] * s
            v_new = w[t] * v[t] - torch.einsum("hkv,hk->hv", s, beta[t] * k[t])
            s = s + k[t][:, :, None] * v_new[:, None, :]
            o[t] = scale * torch.einsum("hkv,hk->hv", s, q[t])
        state[n] = s
    return o, state
