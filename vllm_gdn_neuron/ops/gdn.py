"""Public Gated DeltaNet ops: chunked prefill and one-token decode.

Packed varlen layout: the tokens of all sequences end to end, sequence n spanning
``cu_seqlens[n]:cu_seqlens[n + 1]``. States are float32, K-major ``[.., Dk, Dv]``
(see docs/gdn-math.md).
"""

import torch

from .dispatch import select_backend
from .validation import (
    F32,
    check_cu_seqlens,
    check_decay,
    check_qkv,
    check_same_device,
    check_state_indices,
    check_tensor,
    resolve_scale,
)



def gdn_prefill(q, k, v, g, beta, cu_seqlens, *, initial_state=None, scale=None, use_qk_l2norm=False,
                backend="auto"):
    """Gated DeltaNet over packed prompts (chunked).

    Dimensions:
        T: packed tokens, N: sequences, Hk / Hv: query-key / value heads, Dk / Dv: head sizes.

    Args:
        q, k: ``[T, Hk, Dk]`` float32 or bfloat16.
        v: ``[T, Hv, Dv]``, q's dtype; ``Hv % Hk == 0``.
        g: ``[T, Hv]`` float32 natural-log decay, <= 0.
        beta: ``[T, Hv]`` float32.
        cu_seqlens: ``[N + 1]`` int32 or int64 sequence boundaries.
        initial_state: ``[N, Hv, Dk, Dv]`` float32, or None for zeros.
        scale: output scale, None for ``Dk ** -0.5``.
        use_qk_l2norm: L2-normalise q and k per head (float32) first.
        backend: ``"auto"``, ``"torch"`` or ``"nki"``.

    Returns:
        ``(o, final_state)``: ``[T, Hv, Dv]`` in q's dtype, ``[N, Hv, Dk, Dv]`` float32.
    """
    tokens, _, dim_k, num_v_heads, dim_v = check_qkv(q, k, v, "T")
    check_tensor("g", g, (("T", tokens), ("Hv", num_v_heads)), F32)
    check_tensor("beta", beta, (("T", tokens), ("Hv", num_v_heads)), F32)
    bounds = check_cu_seqlens(cu_seqlens, tokens)
    if initial_state is not None:
        check_tensor("initial_state", initial_state,
                     (("N", bounds.numel() - 1), ("Hv", num_v_heads), ("Dk", dim_k), ("Dv", dim_v)), F32)
    device = check_same_device(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    scale = resolve_scale(scale, dim_k)
    check_decay("g", g)
    module = select_backend(backend, "gdn_prefill", device)
    return module.gdn_prefill(q, k, v, g, beta, bounds, initial_state, scale, bool(use_qk_l2norm))


def gdn_decode(q, k, v, g, beta, state, state_indices, *, scale=None, use_qk_l2norm=False, backend="auto"):
    """One Gated DeltaNet step for N sequences, advancing their cache rows in place.

    Args:
        q, k: ``[N, Hk, Dk]`` float32 or bfloat16.
        v: ``[N, Hv, Dv]``, q's dtype.
        g, beta: ``[N, Hv]`` float32 (g <= 0).
        state: ``[num_slots, Hv, Dk, Dv]`` float32; rows ``state_indices`` are updated in place.
        state_indices: ``[N]`` int32 or int64 distinct slots; ``-1`` (vLLM's PAD_SLOT_ID) marks
            a padded row: its output is zeros and no state row is touched.
        scale, use_qk_l2norm, backend: as in ``gdn_prefill``.

    Returns:
        ``o``: ``[N, Hv, Dv]`` in q's dtype.
    """
    rows, _, dim_k, num_v_heads, dim_v = check_qkv(q, k, v, "N")
    check_tensor("g", g, (("N", rows), ("Hv", num_v_heads)), F32)
    check_tensor("beta", beta, (("N", rows), ("Hv", num_v_heads)), F32)
    check_tensor("state", state, (("num_slots", None), ("Hv", num_v_heads), ("Dk", dim_k), ("Dv", dim_v)), F32)
    device = check_same_device(q=q, k=k, v=v, g=g, beta=beta, state=state)
    indices, keep = check_state_indices(state_indices, rows, state.shape[0], device)
    scale = resolve_scale(scale, dim_k)
    check_decay("g", g)
    module = select_backend(backend, "gdn_decode", device)
    if keep is None:
        return module.gdn_decode(q, k, v, g, beta, state, indices, scale, bool(use_qk_l2norm))
    o = torch.zeros(rows, num_v_heads, dim_v, dtype=q.dtype, device=device)
    o[keep] = module.gdn_decode(q[keep], k[keep], v[keep], g[keep], beta[keep], state, indices[keep], scale,
                                bool(use_qk_l2norm))
    return o
