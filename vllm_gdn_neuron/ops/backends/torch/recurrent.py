"""One-token GDN decode step over cache slots, batched over sequences and heads."""

from .common import prepare_qk


def gdn_decode(q, k, v, g, beta, state, state_indices, scale, use_qk_l2norm):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``.

    GQA runs on a ``[N, Hk, group, ...]`` view: q and k are broadcast over the group, never copied.
    """
    rows, num_k_heads, dim_k = q.shape
    num_v_heads, dim_v = v.shape[1:]
    group = num_v_heads // num_k_heads
    q, k = prepare_qk(q, k, scale, use_qk_l2norm)
    q, k = (x.view(rows, num_k_heads, 1, 1, dim_k) for x in (q, k))
    s = state.index_select(0, state_indices).view(rows, num_k_heads, group, dim_k, dim_v)
    s *= g.exp().view(rows, num_k_heads, group, 1, 1)
    v_new = beta.view(rows, num_k_heads, group, 1, 1) * (v.float().view(rows, num_k_heads, group, 1, dim_v) - k @ s)
    s += k.transpose(-1, -2) @ v_new
    o = q @ s
    state.index_copy_(0, state_indices, s.view(rows, num_v_heads, dim_k, dim_v))
    return o.view(rows, num_v_heads, dim_v).to(v.dtype)
