"""Causal depthwise conv1d (+ SiLU) of the GDN layer, prefill and decode, as NKI kernels.

Math: ``/work/shared/docs/gdn-math.md`` section 5; design: ``kernels/docs/conv1d.md``; torch
mirror: ``conv1d_torch.py``.

Channels sit on the partition axis in 128-wide tiles, time on the free axis. Prefill works
on time tiles of up to ``TIME_TILE`` tokens, each extended on the left by the ``K - 1`` raw
inputs before it (from the incoming conv state for the first tile, zeros without one):
``out[:, t] = act(sum_j w[:, j] * x_ext[:, t + j])``, one ScalarE multiply for the first tap
and one fused VectorE multiply-add (``scalar_tensor_tensor``) per further tap, then the
activation on ScalarE. The new conv state is the last ``K`` columns of the extended input
(for a sequence shorter than ``K``, the tail of the incoming state stays in front).

Decode packs ``m`` consecutive channels per partition (``decode_packing``) so that the
``[C, K]`` state of a sequence moves as one contiguous run per partition; the window shift
runs on GpSimd, the ``K``-tap dot product on VectorE, the activation on ScalarE.
"""

from . import tiles as tl
from .checks import FLOAT_DTYPES, check_choice, check_dtype, check_rank, check_shape
from .nki_compat import nki, nisa, nl

PARTITIONS = 128
TIME_TILE = 2048
ACTIVATIONS = ("silu", None)


def _taps(x_ext, weight, length):
    """``sum_j weight[:, j] * x_ext[:, j:j + length]`` in fp32 (``x_ext`` is ``K - 1`` columns longer)."""
    acc = tl.activation(x_ext[:, 0:length], nl.copy, scale=weight[:, 0:1])
    for j in range(1, weight.shape[1]):
        acc = tl.scalar_tensor(x_ext[:, j:j + length], nl.multiply, weight[:, j:j + 1], nl.add, acc)
    return acc


def _activate(acc, activation, dtype):
    return tl.activation(acc, nl.silu if activation == "silu" else nl.copy, dtype=dtype)


@nki.jit
def conv1d_prefill_kernel(mixed, conv_weight, conv_state=None, activation="silu"):
    """The NKI kernel behind :func:`gdn_conv1d_prefill` (arguments already checked)."""
    b_size, channels, t_len = mixed.shape
    width = conv_weight.shape[1]
    halo = width - 1
    out = nl.ndarray((b_size, channels, t_len), dtype=mixed.dtype, buffer=nl.shared_hbm)
    new_state = nl.ndarray((b_size, channels, width), dtype=nl.float32, buffer=nl.shared_hbm)
    # raw inputs stay in their own dtype on chip (half the DMA bytes for bf16); an incoming
    # state of a wider dtype widens the tile so the state passes through exactly
    x_dtype = mixed.dtype if conv_state is None or conv_state.dtype == mixed.dtype else nl.float32
    for c0 in range(0, channels, PARTITIONS):
        rows = nl.ds(c0, min(PARTITIONS, channels - c0))
        weight = tl.load(conv_weight[rows, :], nl.float32)
        for b in range(b_size):
            for t0 in range(0, t_len, TIME_TILE):
                length = min(TIME_TILE, t_len - t0)
                x_ext = tl.sbuf((rows.size, halo + length), x_dtype)
                if halo and t0 > 0:
                    nisa.dma_copy(dst=x_ext[:, 0:halo], src=mixed[b, rows, t0 - halo:t0])
                elif halo and conv_state is not None:
                    nisa.dma_copy(dst=x_ext[:, 0:halo], src=conv_state[b, rows, 1:width])
                elif halo:
                    nisa.memset(dst=x_ext[:, 0:halo], value=0.0, engine=nisa.engine.gpsimd)
                nisa.dma_copy(dst=x_ext[:, halo:halo + length], src=mixed[b, rows, t0:t0 + length])
                tl.store(out[b, rows, t0:t0 + length], _activate(_taps(x_ext, weight, length), activation, mixed.dtype))
            tl.store(new_state[b, rows, :], x_ext[:, length - 1:length - 1 + width])
    return out, new_state


def decode_packing(channels):
    """``(P, m)``: ``m`` consecutive channels per partition on ``P = channels / m <= 128`` partitions.

    Packing channels makes each partition's slice of a ``[C, K]`` conv state one contiguous run
    of ``m * K`` elements, instead of a ``K``-element (e.g. 16-byte) DMA descriptor per channel.
    """
    m = -(-channels // PARTITIONS)
    while channels % m:
        m += 1
    return channels // m, m


@nki.jit
def conv1d_decode_kernel(x, conv_state, conv_weight, activation="silu"):
    """The NKI kernel behind :func:`gdn_conv1d_decode` (arguments already checked)."""
    b_size, channels, _ = x.shape
    width = conv_weight.shape[1]
    parts, per = decode_packing(channels)
    out = nl.ndarray((b_size, channels, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    new_state = nl.ndarray((b_size, channels, width), dtype=conv_state.dtype, buffer=nl.shared_hbm)
    weight = tl.load(conv_weight.reshape((parts, per * width)), nl.float32).reshape((parts, per, width))
    for b in range(b_size):
        state = tl.load(conv_state[b].reshape((parts, per * width))).reshape((parts, per, width))
        window = tl.sbuf((parts, per, width), conv_state.dtype)
        if width > 1:
            nisa.tensor_copy(dst=window[:, :, 0:width - 1], src=state[:, :, 1:width], engine=nisa.engine.gpsimd)
        newest = tl.load(x[b].reshape((parts, per, 1)))  # contiguous on both sides: one run per partition
        nisa.tensor_copy(dst=window[:, :, width - 1:width], src=newest, engine=nisa.engine.gpsimd)
        acc = tl.reduce(tl.binary(window, weight, nl.multiply), nl.add, axis=2)
        tl.store(out[b].reshape((parts, per, 1)), _activate(acc, activation, x.dtype))
        tl.store(new_state[b].reshape((parts, per * width)), window.reshape((parts, per * width)))
    return out, new_state


def _check_weight(conv_weight, channels):
    check_rank("conv_weight", conv_weight, 2, "[C, K]")
    check_dtype("conv_weight", conv_weight, FLOAT_DTYPES)
    if conv_weight.shape[0] != channels:
        raise ValueError(f"conv_weight must have C = {channels} rows (the channels of the input), "
                         f"got shape {tuple(conv_weight.shape)}")


def gdn_conv1d_prefill(mixed, conv_weight, conv_state=None, activation="silu"):
    """Causal depthwise conv1d + activation over whole sequences, optionally continuing one.

    Dimensions:
        B sequences of T tokens (T >= 1); C channels; K kernel width.

    Args:
        mixed: ``[B, C, T]`` raw inputs (fp32, bf16 or fp16).
        conv_weight: ``[C, K]``.
        conv_state: ``[B, C, K]`` incoming conv state (the K raw inputs before ``mixed``,
            oldest first), or None for a new sequence (zeros, no load).
        activation: "silu" or None.

    Returns:
        ``(out [B, C, T] in mixed's dtype, conv_state [B, C, K] fp32)``: the new state holds the
        last K raw inputs (incoming state columns in front when T < K).
    """
    check_rank("mixed", mixed, 3, "[B, C, T]")
    check_dtype("mixed", mixed, FLOAT_DTYPES)
    b_size, channels, t_len = mixed.shape
    if t_len < 1:
        raise ValueError(f"mixed must hold T >= 1 tokens, got shape {tuple(mixed.shape)}")
    _check_weight(conv_weight, channels)
    check_choice("activation", activation, ACTIVATIONS)
    if conv_state is not None:
        check_shape("conv_state", conv_state, (b_size, channels, conv_weight.shape[1]), "[B, C, K]")
        check_dtype("conv_state", conv_state, FLOAT_DTYPES)
    return conv1d_prefill_kernel(mixed, conv_weight, conv_state, activation=activation)


def gdn_conv1d_decode(x, conv_state, conv_weight, activation="silu"):
    """One decode token of the causal conv: window = state shifted left by one with x appended.

    Args:
        x: ``[B, C, 1]``.
        conv_state: ``[B, C, K]`` the last K raw inputs.
        conv_weight: ``[C, K]``.
        activation: "silu" or None.

    Returns:
        ``(out [B, C, 1] in x's dtype, new_state [B, C, K] in conv_state's dtype)``.
    """
    check_rank("x", x, 3, "[B, C, 1]")
    check_dtype("x", x, FLOAT_DTYPES)
    b_size, channels, one = x.shape
    if one != 1:
        raise ValueError(f"x must hold one token per sequence ([B, C, 1]), got shape {tuple(x.shape)}")
    _check_weight(conv_weight, channels)
    check_choice("activation", activation, ACTIVATIONS)
    check_shape("conv_state", conv_state, (b_size, channels, conv_weight.shape[1]), "[B, C, K]")
    check_dtype("conv_state", conv_state, FLOAT_DTYPES)
    return conv1d_decode_kernel(x, conv_state, conv_weight, activation=activation)
