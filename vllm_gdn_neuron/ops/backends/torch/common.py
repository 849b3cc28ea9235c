"""Small helpers shared by the torch backend's ops."""

import torch

from vllm_gdn_neuron.kernels.l2norm import l2norm_factor


def prepare_qk(q, k, scale, use_qk_l2norm):
    """q and k in float32, L2-normalised if asked, q multiplied by the scale."""
    q, k = q.float(), k.float()
    if not use_qk_l2norm:
        return q * scale, k
    return q * l2norm_factor(q, scale), k * l2norm_factor(k)


def prepare_kq(q, k, scale, use_qk_l2norm):
    """``prepare_qk`` on k and q stacked, ``[..., 2, D]`` float32 (k, then q): the same numbers in
    fewer dispatched ops (one stack, one normalisation pass), for the per-call decode step."""
    k_q = torch.stack([k, q], dim=-2).float()
    if not use_qk_l2norm:
        k_q.select(-2, 1).mul_(scale)
        return k_q
    factor = l2norm_factor(k_q)
    factor.select(-2, 1).mul_(scale)
    return k_q.mul_(factor)
