"""Small helpers shared by the torch backend's ops."""

import torch

from vllm_gdn_neuron.kernels.l2norm import l2norm_factor


def qk_factors(x, scale, use_qk_l2norm):
    """The per-row factor that L2-normalises (if asked) and scales float32 ``x [..., D]``: ``[..., 1]``."""
    if not use_qk_l2norm:
        return torch.full_like(x[..., :1], scale)
    return l2norm_factor(x).mul_(scale)


def prepare_qk(q, k, scale, use_qk_l2norm):
    """q and k in float32, L2-normalised if asked, q multiplied by the scale."""
    q, k = q.float(), k.float()
    return q * qk_factors(q, scale, use_qk_l2norm), k * qk_factors(k, 1.0, use_qk_l2norm)
