"""Chunked prefill of GDN (scalar gates), float32 throughout; the scan GDN-2 (``ops.gdn2``) shares.

Per chunk of C tokens with state S0 at its start (docs/gdn-math.md, section 3), with
``G = cumsum(g)`` and the writes ``V' = U - W S0`` the chunk actually makes:

    A    strictly lower C x C (beta_r k_r . k_s decayed from s to r), T = (I + A)^-1
    P    lower-inclusive C x C (q_r . k_s decayed from s to r): the intra-chunk attention
    U    = T (beta V)        [GDN-2: T (w V)]          O  = exp(G) Q S0 + P V'
    W    = T (beta exp(G) K) [GDN-2: T (exp(G) beta K)] S1 = exp(G_C) S0 + (exp(G_C - G) K)^T V'

The per-chunk tensors are built for a block of chunks at once (``_scalar_intra``, and
``ops.gdn2.chunked``'s for channel-wise gates); the sequential part (``_scan``) is three batched matmuls per chunk step
over all sequences and heads (``V'``, ``exp(G) Q S0`` and the state update); ``P V'`` is then
one batched matmul over the whole block. With scalar gates beta folds into the C x C inverse
instead of the C x D operands, and under GQA the value heads of one key head share one matmul
against that key head's K.

Every exponent is <= 0: pairwise decays are masked to -inf above the diagonal before the exp;
with channel-wise gates the off-diagonal sub-chunk blocks factor through a reference position
between the two tokens, ``exp(G_r - G_s) = exp(G_r - G_ref) exp(G_ref - G_s)`` with both
factors <= 1, and the diagonal sub-chunk blocks take the pairwise exp per channel.
"""

import torch

from vllm_gdn_neuron.kernels.l2norm import l2norm_factor

from .chunk_layout import ChunkLayout, VarlenChunkLayout
from .triangular import unit_lower_inverse

#: Chunk size C: with scalar gates 32 is faster than 64 (less C x C work, C x D operands of the
#: same total size per block); GDN-2's channel-wise gates keep 64 (``ops.gdn2.chunked``).
GDN_CHUNK_SIZE = 32
#: Chunks whose intra-chunk tensors are built together: bounds the temporaries (and keeps them
#: closer to cache; 8 chunks x 16 heads x 32 x 128 fp32 = 2 MiB a tensor).
GDN_BLOCK_CHUNKS = 8


def masked_exp_(diff, mask):
    """exp of pairwise log-decays, -inf (-> 0) where ``mask`` is set, before the exp; in place."""
    return diff.masked_fill_(mask, float("-inf")).exp_()


def per_value_head(x, group):
    """``[m, Hk, ...]`` -> ``[m, Hk, group, ...]`` broadcast view (no copy)."""
    return x.unsqueeze(2).expand(x.shape[0], x.shape[1], group, *x.shape[2:])


def _scaledper_value_head(x, factor):
    """``x [m, Hk, C, D]`` times ``factor [m, Hk, G, C]`` -> ``[m, Hk * G, C, D]``.

    The output is allocated contiguous up front: left to broadcasting, torch picks a slow
    iteration order for this [m, Hk, 1, C, D] x [m, Hk, G, C, 1] product.
    """
    m, num_k_heads, group, size = factor.shape
    out = x.new_empty(m, num_k_heads, group, size, x.shape[-1])
    return torch.mul(x.unsqueeze(2), factor[..., None], out=out).view(m, num_k_heads * group, size, -1)


def _scalar_intra(q, k, v, g, beta, group):
    """Per-chunk tensors for scalar gates.

    With ``B = (I + A)^-1 diag(beta)``: ``U = B V`` and ``W = (B diag(exp(G))) K``, the value
    heads of one key head stacked along the rows of one matmul against its K under GQA.

    Args:
        q, k: ``[m, Hk, C, Dk]`` (q scaled, both normalised); v: ``[m, Hv, C, Dv]``;
        g, beta: ``[m, Hv, C]``.

    Returns:
        ``(U, W, exp(G) Q, P, exp(G_C - G) K, chunk_decay)`` for ``_scan``, each ``[m, Hv, ...]``;
        chunk_decay is ``[m, Hv, 1, 1]``.
    """
    m, num_k_heads, size, dim_k = q.shape
    hv = num_k_heads * group
    cum = g.cumsum(-1).unflatten(1, (num_k_heads, group))                      # [m, Hk, G, C]
    beta = beta.unflatten(1, (num_k_heads, group))
    upper = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)
    decay = masked_exp_(cum[..., :, None] - cum[..., None, :], upper)        # [m, Hk, G, C, C]
    k_t = k.transpose(-1, -2)
    by_beta = unit_lower_inverse((decay * beta[..., :, None]).mul_((k @ k_t).unsqueeze(2))).mul_(beta[..., None, :])
    p = decay.mul_((q @ k_t).unsqueeze(2))
    u = by_beta.view(m, hv, size, size) @ v
    head_decay = cum.exp()
    w = by_beta.mul_(head_decay[..., None, :]).view(m, num_k_heads, group * size, size) @ k
    return (u, w.view(m, hv, size, dim_k), _scaledper_value_head(q, head_decay), p.view(m, hv, size, size),
            _scaledper_value_head(k, (cum[..., -1:] - cum).exp_()), cum[..., -1].exp().view(m, hv, 1, 1))


def _scan(state, steps, lo, u, w, decayed_q, keys, chunk_decay, out):
    """Advance the ranked states through the block's chunk steps.

    Per step: ``out = exp(G) Q S0``; ``written = U - W S0`` (in place in ``u``);
    ``S1 = chunk_decay * S0 + keys^T written``. ``out [m, Hv, C, Dv]``, ``u`` (then V') and
    ``state`` (ranked order) are written in place.
    """
    heads, size, dim_v = u.shape[1:]
    dim_k = w.shape[3]
    for offset, active in steps:
        chunks = slice(offset - lo, offset - lo + active)
        flat = active * heads
        s = state[:active].view(flat, dim_k, dim_v)
        torch.bmm(decayed_q[chunks].view(flat, size, dim_k), s, out=out[chunks].view(flat, size, dim_v))
        written = u[chunks].view(flat, size, dim_v).baddbmm_(w[chunks].view(flat, size, dim_k), s, alpha=-1)
        s.view(active, heads, dim_k, dim_v).mul_(chunk_decay[chunks])
        s.baddbmm_(keys[chunks].view(flat, size, dim_k).transpose(1, 2), written)


class _RankedStates:
    """The states of a step-major ``ChunkLayout``: one per rank, advanced in place."""

    def __init__(self, layout, initial):
        self.order = layout.order
        self.state = initial.index_select(0, layout.order).contiguous()

    def scan(self, steps, lo, *chunk_tensors):
        _scan(self.state, steps, lo, *chunk_tensors)

    def final(self):
        final_state = torch.zeros_like(self.state)  # not empty: XLA takes no tensor.empty
        final_state[self.order] = self.state
        return final_state


class _LaneStates:
    """The states of a ``VarlenChunkLayout``: one lane, restarted at each sequence's first chunk
    from its initial state and copied out after its last chunk (row N takes the copies of chunks
    that end no sequence)."""

    def __init__(self, layout, initial):
        self.layout = layout
        self.initial = torch.cat([initial, initial.new_zeros((1,) + initial.shape[1:])])
        self.states = self.initial.clone()
        self.lane = initial.new_zeros((1,) + initial.shape[1:])

    def scan(self, steps, lo, *chunk_tensors):
        layout = self.layout
        for offset, active in steps:
            here = slice(offset, offset + 1)
            fresh = self.initial.index_select(0, layout.chunk_seq[here])
            self.lane = torch.where(layout.starts[here].view(1, 1, 1, 1), fresh, self.lane).contiguous()
            _scan(self.lane, [(offset, active)], lo, *chunk_tensors)
            self.states.index_copy_(0, layout.final_index[here], self.lane)

    def final(self):
        return self.states[:-1]


def chunked_scan(q, k, v, gates, cu_seqlens, initial_state, scale, use_qk_l2norm, build, chunk_size, block_chunks,
             layout=None):
    """Shared driver: pack into chunks, build per-chunk tensors per block, scan, unpack.

    ``layout``: a prebuilt ``ChunkLayout`` or ``VarlenChunkLayout`` of ``chunk_size`` (then
    ``cu_seqlens`` is not read).
    """
    num_v_heads, dim_v, dim_k = v.shape[1], v.shape[2], q.shape[2]
    group = num_v_heads // q.shape[1]
    layout = ChunkLayout(cu_seqlens, chunk_size, q.device) if layout is None else layout
    if initial_state is None:
        initial_state = v.new_zeros(layout.num_seqs, num_v_heads, dim_k, dim_v, dtype=torch.float32)
    states = (_LaneStates if isinstance(layout, VarlenChunkLayout) else _RankedStates)(layout, initial_state.float())
    out = v.new_zeros(layout.num_tokens + 1, num_v_heads, dim_v)  # not empty: XLA takes no tensor.empty
    for lo, hi, steps in layout.blocks(block_chunks):
        chunk_q, chunk_k, chunk_v = (layout.gather(x, lo, hi) for x in (q, k, v))
        if use_qk_l2norm:
            chunk_q.mul_(l2norm_factor(chunk_q, scale))
            chunk_k.mul_(l2norm_factor(chunk_k))
        else:
            chunk_q.mul_(scale)
        chunk_gates = [None if x is None else layout.gather(x, lo, hi) for x in gates]
        u, w, decayed_q, p, keys, chunk_decay = build(chunk_q, chunk_k, chunk_v, *chunk_gates, group)
        o = torch.zeros_like(u)  # not empty: XLA takes no tensor.empty (the scan writes it by slices)
        states.scan(steps, lo, u, w, decayed_q, keys, chunk_decay, o)
        layout.scatter(out, o.flatten(0, 1).baddbmm_(p.flatten(0, 1), u.flatten(0, 1)).view(o.shape), lo, hi)
    return out[:-1], states.final()


def gdn_prefill(q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm, layout=None):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``; ``layout`` as in ``chunked_scan``
    (a ``ChunkLayout`` of ``GDN_CHUNK_SIZE``, for the trace-safe paged ops)."""
    return chunked_scan(q, k, v, (g, beta), cu_seqlens, initial_state, scale, use_qk_l2norm, _scalar_intra,
                    GDN_CHUNK_SIZE, GDN_BLOCK_CHUNKS, layout)
