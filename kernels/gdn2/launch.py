"""GDN-2's entry points, in the form of ``kernels.adapter``'s: bucketed or packed inputs, states in a
cache or returned. No model serves GDN-2; the public ``gdn2_prefill`` op's ``nki`` backend and the
tests call these.
"""

import torch

from ..gdn_cte import default_mask_pack
from .gdn2 import GDN2


def gdn2_prefill_bucket(q, k, v, g, beta, w, ssm_cache, slots, scale, initial_state=True):
    """GDN-2 over a bucket of right-padded sequences, states in the cache.

    Args:
        q, k: ``[B, S, Hk, Dk]``; v: ``[B, S, Hv, Dv]``; g, beta: ``[B, S, Hv, Dk]`` fp32;
            w: ``[B, S, Hv, Dv]`` fp32 or None. Padding tokens hold k = v = 0, g = 0, beta = 0
            (w any), which leaves the state exact: no lengths needed.
        ssm_cache: ``[pages, Hv, Dk, Dv]`` fp32; rows ``slots`` hold the initial states (read
            when ``initial_state``) and receive the final ones.
        slots: ``[B]`` int tensor.

    The sequence boundaries the kernel sees are multiples of S, a function of the bucket's
    shape only: one compiled kernel per bucket. The cache rows move with ``index_select`` /
    ``index_copy_`` (trace-safe torch ops).

    Returns:
        ``o [B, S, Hv, Dv]`` in q's dtype.
    """
    b_size, s_len = q.shape[0], q.shape[1]
    flat = [None if x is None else x.reshape((b_size * s_len,) + tuple(x.shape[2:])) for x in (q, k, v, g, beta, w)]
    index = slots.to(device=ssm_cache.device, dtype=torch.long)
    initial = ssm_cache.index_select(0, index).contiguous() if initial_state else None
    o, final = GDN2(*flat, default_mask_pack(q), initial, cu_seqlens=tuple(range(0, b_size * s_len + 1, s_len)),
                    scale=float(scale))
    ssm_cache.index_copy_(0, index, final)
    return o.reshape((b_size, s_len) + tuple(o.shape[1:]))


def gdn2_prefill(q, k, v, g, beta, w, cu_seqlens, initial_state, scale):
    """GDN-2 over packed varlen tokens. ``cu_seqlens`` is a Python sequence of ints here: this
    kernel still takes its boundaries at compile time (one kernel per composition).

    Returns:
        ``(o [T, Hv, Dv], final_state [N, Hv, Dk, Dv] fp32)``.
    """
    bounds = tuple(int(b) for b in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens))
    return GDN2(q, k, v, g, beta, w, default_mask_pack(q), initial_state, cu_seqlens=bounds, scale=float(scale))
