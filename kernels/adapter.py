"""The engine-facing NKI entry points: bucketed inputs, page-major caches, slot-index tensors.

What a model shell calls (the ``nki`` op backend on CPU, the Neuron shell on trn2). Every
function launches one kernel through its :class:`~.nki_call.NkiOp` and does no host read:
slot indices and sequence lengths stay tensors on the caller's device, so inside a
``torch.compile`` graph one compiled kernel serves every batch composition of a shape
bucket. Arguments are checked from their metadata only (shapes and dtypes against the
kernels' limits, a ``ValueError`` naming the argument); their values (slot ranges, lengths)
are the op layer's to validate, once per step, on the host.

Caches (fp32, updated in place, returned by the kernels and by these functions):
    ``ssm_cache``  ``[pages, Hv, Dk, Dv]`` (K-major recurrent states),
    ``conv_cache`` ``[pages, C, K]`` (the last K raw conv inputs, oldest first).
Slots: ``[N]`` (or ``[B]``) integer tensors of cache rows, distinct; no padding rows (drop
them before the call, or point them at a reserved page).
"""

import torch

from .conv1d import CONV1D_DECODE, CONV1D_PREFILL
from .gdn2 import GDN2
from .checks import check_token_major_qkv
from .gdn_cte import GDN_CTE, MAX_HEAD_DIM, check_gdn_cte_args, default_mask_pack
from .nki_call import index_tensor
from .recurrent_step import RECURRENT_STEP

GDN_PREFILL_CHUNK = 128  # S of a gdn_prefill bucket is a multiple of this ("schur")


def gdn_prefill(q, k, v, g, beta, ssm_cache, slots, scale, use_qk_l2norm=False, initial_state=True, group_size=8):
    """Chunked GDN prefill of a bucket of right-padded sequences, states in the cache.

    Args:
        q, k: ``[B, Hk, S, Dk]`` (S a multiple of 128), v: ``[B, Hv, S, Dv]``, one dtype;
            padding tokens hold k = v = 0 (and any q).
        g, beta: ``[B, Hv, S]`` fp32; padding tokens hold g = 0, beta = 0, which leaves the
            state exact, so no sequence length is needed.
        ssm_cache: ``[pages, Hv, Dk, Dv]`` fp32; row ``slots[b]`` is sequence b's initial
            state (read only when ``initial_state``) and receives its final state.
        slots: ``[B]`` int tensor.
        scale: output scale; use_qk_l2norm: normalise q and k on chip.
        initial_state: False starts every sequence from zero without reading the cache.

    Returns:
        ``o [B, Hv, S, Dv]`` in q's dtype (padding rows meaningless).
    """
    check_gdn_cte_args(q, k, v, g, beta, scale, "schur", None, group_size, ssm_cache, cache_rows=True)
    o, _ = GDN_CTE(q, k, v, g, beta, default_mask_pack(q), ssm_cache, index_tensor(slots, q), scale=float(scale),
                   algorithm="schur", group_size=group_size, use_qk_l2norm=bool(use_qk_l2norm),
                   initial_state=bool(initial_state))
    return o


def gdn_decode(q, k, v, g, beta, ssm_cache, slots, scale):
    """One recurrent GDN step per sequence on its cache row, in place.

    Args:
        q, k: ``[N, Hk, Dk]`` L2-normalised, v: ``[N, Hv, Dv]`` (fp32 recommended: the step
            computes in fp32), g, beta: ``[N, Hv]`` fp32.
        ssm_cache: ``[pages, Hv, Dk, Dv]`` fp32; slots: ``[N]`` int tensor.

    Returns:
        ``o [N, Hv, Dv]`` in q's dtype.
    """
    check_token_major_qkv(("q", "k", "v"), q, k, v, "N", MAX_HEAD_DIM)
    o, _ = RECURRENT_STEP(q, k, v, g, beta, ssm_cache, index_tensor(slots, q), scale=float(scale))
    return o


def conv1d_prefill(x, weight, conv_cache, slots, seq_lens, activation="silu", initial_state=True):
    """Causal conv1d (+ activation) of a bucket of right-padded sequences, states in the cache.

    Args:
        x: ``[B, C, T]`` channel-major raw inputs; sequence b's first ``seq_lens[b]`` tokens real.
        weight: ``[C, K]``.
        conv_cache: ``[pages, C, K]``; row ``slots[b]`` holds sequence b's incoming state (read
            only when ``initial_state``) and receives its last K raw inputs.
        slots, seq_lens: ``[B]`` int tensors (lengths in 1..T).

    Returns:
        ``y [B, C, T]`` in x's dtype (padding columns meaningless).
    """
    y, _ = CONV1D_PREFILL(x, weight, conv_cache, index_tensor(slots, x), index_tensor(seq_lens, x),
                          activation=activation, initial_state=bool(initial_state))
    return y


def conv1d_decode(x, weight, conv_cache, slots, activation="silu"):
    """One conv step per sequence on its cache row, in place.

    Args:
        x: ``[N, C]`` (or ``[N, C, 1]``); weight: ``[C, K]``; conv_cache: ``[pages, C, K]``;
        slots: ``[N]`` int tensor.

    Returns:
        ``y`` shaped like ``x``, in x's dtype.
    """
    column = x if x.dim() == 3 else x.unsqueeze(-1)
    y, _ = CONV1D_DECODE(column.contiguous(), conv_cache, weight, index_tensor(slots, x), activation=activation)
    return y if x.dim() == 3 else y[..., 0]


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


__all__ = ["gdn_prefill", "gdn_decode", "conv1d_prefill", "conv1d_decode", "gdn2_prefill_bucket", "gdn2_prefill",
           "GDN_PREFILL_CHUNK"]
