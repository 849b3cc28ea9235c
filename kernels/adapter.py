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


__all__ = ["gdn_prefill", "gdn_decode", "conv1d_prefill", "conv1d_decode", "GDN_PREFILL_CHUNK"]
