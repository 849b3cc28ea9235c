"""Torch mirror of the recurrent step kernel: same API and step order (see ``recurrent_step``)."""

import torch


def gdn_recurrent_step_torch(query, key, value, g_log, beta, state, state_indices, scale=1.0):
    """``out [N, Hv, Dv]``; rows ``state[state_indices]`` advanced one token in place (fp32 math)."""
    ratio = value.shape[1] // query.shape[1]
    q = query.float().repeat_interleave(ratio, dim=1)
    k = key.float().repeat_interleave(ratio, dim=1)
    slots = torch.as_tensor(state_indices, dtype=torch.long)
    s = state[slots]
    decay = torch.exp(g_log)[..., None]
    k_s = torch.einsum("nhk,nhkv->nhv", k, s)
    v_new = beta[..., None] * (value.float() - decay * k_s)
    s = decay[..., None] * s + k[..., :, None] * v_new[..., None, :]
    state[slots] = s
    return (scale * torch.einsum("nhk,nhkv->nhv", q, s)).to(query.dtype)
