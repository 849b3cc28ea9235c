"""Causal depthwise conv1d prefill over packed sequences, and its one-token decode step.

Prefill lays every sequence out behind its K-column incoming state in one extended row
``[state_0 | x_0 | state_1 | x_1 | ...]`` and runs one depthwise ``conv1d`` over it; the outputs
at token positions are exactly the per-sequence convolutions (each reads at most K - 1 columns
back, never past its own state), and each final state is the K columns ending at the
sequence's last token.
"""

import torch
import torch.nn.functional as F


def _activate(y, activation):
    return F.silu(y) if activation == "silu" else y


def conv1d_prefill(x, weight, cu_seqlens, initial_state, activation):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``."""
    tokens, channels = x.shape
    width = weight.shape[1]
    num_seqs = cu_seqlens.numel() - 1
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs), cu_seqlens[1:] - cu_seqlens[:-1])
    token_pos = torch.arange(tokens) + (seq_of_token + 1) * width
    state_start = cu_seqlens[:-1] + torch.arange(num_seqs) * width
    state_pos = state_start[:, None] + torch.arange(width)
    extended = x.new_zeros(channels, tokens + num_seqs * width, dtype=torch.float32)
    extended[:, token_pos.to(x.device)] = x.float().T
    if initial_state is not None:
        extended[:, state_pos.reshape(-1).to(x.device)] = initial_state.float().permute(1, 0, 2).reshape(channels, -1)
    conv = F.conv1d(extended[None], weight.float()[:, None, :], groups=channels)[0]
    y = _activate(conv[:, (token_pos - width + 1).to(x.device)], activation).T.to(x.dtype)
    last = cu_seqlens[1:] + (torch.arange(num_seqs) + 1) * width - 1
    final_state = extended[:, (last[:, None] - width + 1 + torch.arange(width)).to(x.device)].permute(1, 0, 2)
    return y, final_state.contiguous()


def conv1d_decode(x, weight, state, state_indices, activation):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``."""
    window = torch.cat([state.index_select(0, state_indices)[..., 1:].float(), x.float()[..., None]], -1)
    y = _activate((window * weight.float()).sum(-1), activation)
    state.index_copy_(0, state_indices, window.to(state.dtype))
    return y.to(x.dtype)
