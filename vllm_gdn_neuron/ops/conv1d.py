"""Public causal depthwise conv1d ops (the short conv before the GDN recurrence).

Conv state ``[C, K]`` per sequence: the last K raw (pre-conv) inputs, oldest first.
"""

import torch

from .dispatch import select_backend
from .validation import (
    ACTIVATION_DTYPES,
    ACTIVATIONS,
    check_choice,
    check_conv_weight,
    check_cu_seqlens,
    check_same_device,
    check_state_indices,
    check_tensor,
    conv_state_dtypes,
)


def conv1d_prefill(x, weight, cu_seqlens, *, initial_state=None, activation="silu", backend="auto"):
    """Causal depthwise conv1d (+ SiLU) over packed prompts.

    ``y[t, c] = act(sum_j weight[c, j] * x[t - K + 1 + j, c])``, the missing left context of
    each sequence taken from its incoming conv state.

    Dimensions:
        T: packed tokens, N: sequences, C: channels, K: kernel width.

    Args:
        x: ``[T, C]`` float32 or bfloat16.
        weight: ``[C, K]`` float32 or bfloat16.
        cu_seqlens: ``[N + 1]`` int32 or int64 sequence boundaries.
        initial_state: ``[N, C, K]`` in float32 or x's dtype, or None for zeros.
        activation: ``"silu"`` or None.
        backend: ``"auto"``, ``"torch"`` or ``"nki"``.

    Returns:
        ``(y, final_state)``: ``[T, C]`` in x's dtype; ``[N, C, K]`` float32 = the last K raw
        inputs of each sequence (a sequence shorter than K keeps the tail of its incoming state
        in front).
    """
    tokens, channels = check_tensor("x", x, (("T", None), ("C", None)), ACTIVATION_DTYPES)
    width = check_conv_weight(weight, channels)
    bounds = check_cu_seqlens(cu_seqlens, tokens)
    if initial_state is not None:
        check_tensor("initial_state", initial_state, (("N", bounds.numel() - 1), ("C", channels), ("K", width)),
                     conv_state_dtypes(x))
    check_choice("activation", activation, ACTIVATIONS)
    device = check_same_device(x=x, weight=weight, initial_state=initial_state)
    module = select_backend(backend, "conv1d_prefill", device)
    return module.conv1d_prefill(x, weight, bounds, initial_state, activation)


def conv1d_decode(x, weight, state, state_indices, *, activation="silu", backend="auto"):
    """One conv1d step for N sequences, advancing their conv-state rows in place.

    Args:
        x: ``[N, C]`` float32 or bfloat16.
        weight: ``[C, K]`` float32 or bfloat16.
        state: ``[num_slots, C, K]`` in float32 or x's dtype; rows ``state_indices`` become the
            window (state shifted left by one, x appended).
        state_indices: ``[N]`` int32 or int64 distinct slots; ``-1`` (PAD_SLOT_ID) marks a padded
            row: its output is zeros and no state row is touched.
        activation: ``"silu"`` or None.
        backend: ``"auto"``, ``"torch"`` or ``"nki"``.

    Returns:
        ``y``: ``[N, C]`` in x's dtype.
    """
    rows, channels = check_tensor("x", x, (("N", None), ("C", None)), ACTIVATION_DTYPES)
    width = check_conv_weight(weight, channels)
    check_tensor("state", state, (("num_slots", None), ("C", channels), ("K", width)), conv_state_dtypes(x))
    check_choice("activation", activation, ACTIVATIONS)
    device = check_same_device(x=x, weight=weight, state=state)
    indices, keep = check_state_indices(state_indices, rows, state.shape[0], device)
    module = select_backend(backend, "conv1d_decode", device)
    if keep is None:
        return module.conv1d_decode(x, weight, state, indices, activation)
    y = torch.zeros_like(x)
    y[keep] = module.conv1d_decode(x[keep], weight, state, indices[keep], activation)
    return y
