"""Small helpers shared by the torch backend's ops."""

from vllm_gdn_neuron.kernels.l2norm import l2norm_factor


def prepare_qk(q, k, scale, use_qk_l2norm):
    """q and k in float32, L2-normalised if asked, q multiplied by the scale."""
    q, k = q.float(), k.float()
    if not use_qk_l2norm:
        return q * scale, k
    return q * l2norm_factor(q, scale), k * l2norm_factor(k)
