"""L2 normalisation as the GDN layers apply it to q and k."""

import torch

from ..l2norm import L2NORM_EPS
from ._common import as_float64


def l2norm(x, eps=L2NORM_EPS):
    """``x * rsqrt(sum(x**2, -1) + eps)`` over the last axis, in float64.

    Args:
        x: ``[..., D]``, any float dtype.
        eps: added to the sum of squares (not to the norm), 1e-6 as in fla and HF.

    Returns:
        ``[..., D]`` float64.
    """
    x = as_float64(x)
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)
