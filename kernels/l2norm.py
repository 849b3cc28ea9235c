"""L2 normalisation of q and k as the GDN layers apply it: the one torch form.

``x * rsqrt(sum(x^2) + eps)`` over the head axis, in float32 (docs/gdn-math.md section 1).
The torch backend, the NKI backend's host side and ``gdn_cte_torch`` use these; ``gdn_cte``
computes the same on chip, and ``reference.norms`` keeps an independent float64 oracle.
"""

import torch

#: Added to the sum of squares (not to the norm), as in fla and Hugging Face.
L2NORM_EPS = 1e-6


def l2norm_factor(x, scale=1.0):
    """``scale * rsqrt(sum(x^2) + eps)`` over the last axis of float32 ``x [..., D]``: ``[..., 1]``
    float32 (a scale folds into the factor: one multiply of ``x``)."""
    factor = torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)
    return factor if scale == 1.0 else factor.mul_(scale)


def l2norm(x):
    """``x`` L2-normalised over its last axis (float32 math), back in ``x``'s dtype."""
    x32 = x.float()
    return (x32 * l2norm_factor(x32)).to(x.dtype)
