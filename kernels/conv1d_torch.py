"""Torch mirror of the conv1d kernels: same contracts and layouts (``[B, C, T]``, state ``[B, C, K]``),
same step order (extend by the K - 1 previous raw inputs, sum the taps in fp32, activate)."""

import torch


def _activate(acc, activation, dtype):
    return (torch.nn.functional.silu(acc) if activation == "silu" else acc).to(dtype)


def gdn_conv1d_prefill_torch(mixed, conv_weight, conv_state=None, activation="silu"):
    """See ``conv1d.gdn_conv1d_prefill``: ``(out [B, C, T], conv_state [B, C, K] fp32)``."""
    b_size, channels, t_len = mixed.shape
    width = conv_weight.shape[1]
    if conv_state is None:
        halo = torch.zeros(b_size, channels, width - 1)
    else:
        halo = conv_state[..., 1:].float()
    x_ext = torch.cat([halo, mixed.float()], dim=-1)
    weight = conv_weight.float()
    acc = sum(weight[None, :, j:j + 1] * x_ext[..., j:j + t_len] for j in range(width))
    return _activate(acc, activation, mixed.dtype), x_ext[..., -width:].clone()


def gdn_conv1d_decode_torch(x, conv_state, conv_weight, activation="silu"):
    """See ``conv1d.gdn_conv1d_decode``: ``(out [B, C, 1], new_state [B, C, K])``."""
    window = torch.cat([conv_state[..., 1:].float(), x.float()], dim=-1)
    acc = (window * conv_weight.float()[None]).sum(-1, keepdim=True)
    return _activate(acc, activation, x.dtype), window.to(conv_state.dtype)
