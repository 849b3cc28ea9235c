"""Causal depthwise conv1d (+ optional SiLU) with a K-wide conv state, prefill and decode.

Conv state layout ``[C, K]``: the last K raw (pre-conv) inputs of the sequence, oldest first.
Each output reads K inputs: the K - 1 before it and itself, so prefill reads only the newest
K - 1 columns of the incoming state; the oldest column is kept so that the state always holds
K columns (a sequence shorter than K keeps the tail of its incoming state in front).
"""

import torch

from ._common import as_float64, sequence_bounds

ACTIVATIONS = ("silu", None)


def _activate(y, activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    return y * torch.sigmoid(y) if activation == "silu" else y


def causal_conv1d(x, weight, cu_seqlens=None, initial_state=None, activation="silu"):
    """Prefill, one token at a time: ``y[t, c] = act(sum_j weight[c, j] * x[t - K + 1 + j, c])``.

    Dimensions:
        T: packed tokens of N sequences, C: channels, K: kernel width.

    Args:
        x: ``[T, C]``.
        weight: ``[C, K]``.
        cu_seqlens: ``[N + 1]`` sequence boundaries, or None for one sequence.
        initial_state: ``[N, C, K]`` incoming conv state, or None for zeros.
        activation: ``"silu"`` or None.

    Returns:
        ``(y, final_state)``: ``[T, C]`` and ``[N, C, K]``, float64.
    """
    x, weight = as_float64(x), as_float64(weight)
    channels, width = weight.shape
    bounds = sequence_bounds(cu_seqlens, x.shape[0])
    if initial_state is None:
        state = torch.zeros(len(bounds), channels, width, dtype=torch.float64)
    else:
        state = as_float64(initial_state).clone()
    y = torch.zeros(x.shape[0], channels, dtype=torch.float64)
    for n, (start, end) in enumerate(bounds):
        for t in range(start, end):
            y[t], state[n] = causal_conv1d_step(x[t], weight, state[n], activation)
    return y, state


def causal_conv1d_step(x, weight, state, activation="silu"):
    """Decode one token: shift the state left by one, append x, dot with the weight.

    Args:
        x: ``[..., C]``.
        weight: ``[C, K]``.
        state: ``[..., C, K]`` the last K raw inputs.
        activation: ``"silu"`` or None.

    Returns:
        ``(y, new_state)``: ``[..., C]`` and ``[..., C, K]``, float64 (the input state is not modified).
    """
    x, weight, state = as_float64(x), as_float64(weight), as_float64(state)
    window = torch.cat([state[..., 1:], x.unsqueeze(-1)], dim=-1)
    return _activate((window * weight).sum(-1), activation), window
