"""Qwen3.5 / Qwen3-Next gating: the decay g and the write strength beta of each value head."""

import torch

from ._common import as_float64


def qwen35_gating(a, b, A_log, dt_bias):
    """``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)``, in float64.

    Dimensions:
        T: tokens, Hv: value heads.

    Args:
        a: ``[T, Hv]`` decay projection.
        b: ``[T, Hv]`` beta projection.
        A_log: ``[Hv]`` log of the per-head decay rate.
        dt_bias: ``[Hv]``.

    Returns:
        ``(g, beta)``, each ``[T, Hv]`` float64; g <= 0 is a natural-log decay, beta in (0, 1).

    Notes:
        softplus is evaluated exactly, ``log(1 + exp(x)) = logaddexp(x, 0)`` (no threshold).
    """
    a, b, A_log, dt_bias = (as_float64(t) for t in (a, b, A_log, dt_bias))
    softplus = torch.logaddexp(a + dt_bias, torch.zeros((), dtype=torch.float64))
    g = -torch.exp(A_log) * softplus
    beta = torch.sigmoid(b)
    return g, beta
