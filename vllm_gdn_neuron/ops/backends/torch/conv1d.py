"""Causal depthwise conv1d prefill over packed sequences, and its one-token decode step.

Prefill lays every sequence out behind its K-row incoming state in one token-major float32
buffer ``[state_0; x_0; state_1; x_1; ...]`` (rows are tokens, so every write is a whole-row
copy) and sums K shifted row ranges of it, each scaled by one tap of the weight: the outputs at
token rows are exactly the per-sequence convolutions (each reads at most K - 1 rows back, never
past its own state), and each final state is the K rows ending at the sequence's last token.
Token-major all the way, the output comes out row-major ``[T, C]`` and the q / k / v views the
layer takes of it need no copy (a channel-major ``F.conv1d`` would need a transposing scatter
and gather).
"""

import torch
import torch.nn.functional as F


def _activate(y, activation):
    return F.silu(y, inplace=True) if activation == "silu" else y


def conv_over_rows(rows, weight):
    """Depthwise convolution down token-major rows (trace-safe: static slices only).

    Args:
        rows: ``[L, C]`` float32, one row per time step.
        weight: ``[C, K]``, oldest tap first.

    Returns:
        ``[L - K + 1, C]`` float32: row r is ``sum_j weight[:, j] * rows[r + j]``, the window
        ending at row ``r + K - 1``.
    """
    taps = weight.float().t()                                            # [K, C]
    span = rows.shape[0] - taps.shape[0] + 1
    out = rows[:span] * taps[0]
    for j in range(1, taps.shape[0]):
        out.addcmul_(rows[j:j + span], taps[j])
    return out


def window_dot(window, weight):
    """Each channel's window dotted with its taps: ``sum_j window[..., c, j] * weight[c, j]``.

    Tap by tap (trace-safe: K static slices), far cheaper on CPU than torch's reduction over a
    trailing dimension of K = 4.

    Args:
        window: ``[..., C, K]`` float32; weight: ``[C, K]``, oldest tap first.

    Returns:
        ``[..., C]`` float32.
    """
    taps = weight.float()
    out = window[..., 0] * taps[:, 0]
    for j in range(1, taps.shape[1]):
        out = out + window[..., j] * taps[:, j]
    return out


def conv1d_prefill(x, weight, cu_seqlens, initial_state, activation):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``."""
    tokens, channels = x.shape
    width = weight.shape[1]
    num_seqs = cu_seqlens.numel() - 1
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs), cu_seqlens[1:] - cu_seqlens[:-1])
    token_rows = (torch.arange(tokens) + (seq_of_token + 1) * width).to(x.device)
    state_starts = cu_seqlens[:-1] + torch.arange(num_seqs) * width
    state_rows = (state_starts[:, None] + torch.arange(width)).reshape(-1).to(x.device)
    rows = x.new_empty(tokens + num_seqs * width, channels, dtype=torch.float32)
    rows.index_copy_(0, token_rows, x.float())
    if initial_state is None:
        rows.index_fill_(0, state_rows, 0.0)
    else:
        rows.index_copy_(0, state_rows, initial_state.float().transpose(1, 2).reshape(-1, channels))
    y = _activate(conv_over_rows(rows, weight).index_select(0, token_rows - width + 1), activation)
    last = cu_seqlens[1:] + (torch.arange(num_seqs) + 1) * width - 1
    final_rows = (last[:, None] - width + 1 + torch.arange(width)).reshape(-1).to(x.device)
    final_state = rows.index_select(0, final_rows).view(num_seqs, width, channels).transpose(1, 2)
    return y.to(x.dtype), final_state.contiguous()


def conv1d_decode(x, weight, state, state_indices, activation):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``."""
    window = torch.cat([state.index_select(0, state_indices)[..., 1:].float(), x.float()[..., None]], -1)
    y = _activate(window_dot(window, weight), activation)
    state.index_copy_(0, state_indices, window.to(state.dtype))
    return y.to(x.dtype)
