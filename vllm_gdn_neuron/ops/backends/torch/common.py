"""Small helpers shared by the torch backend's ops."""

import torch

from vllm_gdn_neuron.kernels.reference.norms import L2NORM_EPS


def l2norm(x):
    """``x * rsqrt(sum(x^2) + 1e-6)`` over the last axis, float32 in, float32 out."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def prepare_qk(q, k, scale, use_qk_l2norm):
    """q and k in float32, L2-normalised if asked, q multiplied by the scale."""
    q, k = q.float(), k.float()
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    return q * scale, k
