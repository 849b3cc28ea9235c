"""Causal depthwise conv1d (+ SiLU) of the GDN layer, prefill and decode, as NKI kernels.

Math: ``docs/gdn-math.md`` section 5; design: ``docs/kernels/conv1d.md``; torch
mirror: ``conv1d_torch.py``.

Channels sit on the partition axis in 128-wide tiles, time on the free axis. Prefill works
on time tiles of up to ``TIME_TILE`` tokens, each extended on the left by the ``K - 1`` raw
inputs before it (from the incoming conv state for the first tile, zeros without one):
``out[:, t] = act(sum_j w[:, j] * x_ext[:, t + j])``, one GpSimd multiply for the first tap
and one fused VectorE multiply-add (``scalar_tensor_tensor``) per further tap, then the
activation on ScalarE. The new conv state is the last ``K`` columns of the extended input
(for a sequence shorter than ``K``, the tail of the incoming state stays in front).

Decode packs ``m`` consecutive channels per partition (``decode_packing``) so that the
``[C, K]`` state of a sequence moves as one contiguous run per partition; the window shift
runs on GpSimd, the ``K``-tap dot product on VectorE, the activation on ScalarE.
"""

import numpy as np
import torch

from . import tiles as tl
from .checks import FLOAT_DTYPES, check_choice, check_dtype, check_rank, check_shape, check_slots
from .nki_call import NkiOp, index_tensor
from .nki_compat import nki, nisa, nl

PARTITIONS = 128
TIME_TILE = 2048
ACTIVATIONS = ("silu", None)


def _taps(x_ext, weight, length):
    """``sum_j weight[:, j] * x_ext[:, j:j + length]`` in fp32 (``x_ext`` is ``K - 1`` columns longer).

    The first tap runs on GpSimd, the others as fused multiply-adds on VectorE, leaving ScalarE
    to the activation: the three engines then pipeline across tiles.
    """
    acc = tl.sbuf((x_ext.shape[0], length))
    nisa.tensor_scalar(dst=acc, data=x_ext[:, 0:length], op0=nl.multiply, operand0=weight[:, 0:1],
                       engine=nisa.engine.gpsimd)
    for j in range(1, weight.shape[1]):
        acc = tl.scalar_tensor(x_ext[:, j:j + length], nl.multiply, weight[:, j:j + 1], nl.add, acc)
    return acc


def _activate(acc, activation, dtype):
    return tl.activation(acc, nl.silu if activation == "silu" else nl.copy, dtype=dtype)


@nki.jit
def conv1d_prefill_kernel(mixed, conv_weight, conv_cache, slots, seq_lens, activation="silu", initial_state=True):
    """The NKI kernel behind :func:`gdn_conv1d_prefill` (arguments already checked).

    Sequence ``b`` (``mixed[b]``, its first ``seq_lens[b]`` tokens real, the rest padding)
    continues the conv state in row ``slots[b]`` of ``conv_cache`` (``[pages, C, K]``; zeros
    instead when ``initial_state`` is False) and leaves its last ``K`` raw inputs there.
    ``slots`` and ``seq_lens`` are ``[1, B]`` int32 tensors: the state row and the window's
    position are register addresses, so one compiled kernel serves every batch composition.

    Returns:
        ``(out [B, C, T] in mixed's dtype, conv_cache)`` (the cache updated in place).
    """
    b_size, channels, t_len = mixed.shape
    width = conv_weight.shape[1]
    halo = width - 1
    out = nl.ndarray((b_size, channels, t_len), dtype=mixed.dtype, buffer=nl.shared_hbm)
    # raw inputs stay in their own dtype on chip (half the DMA bytes for bf16); an incoming
    # state of a wider dtype widens the tile so the state passes through exactly
    x_dtype = mixed.dtype if not initial_state or conv_cache.dtype == mixed.dtype else nl.float32
    slot_tile = tl.load(slots)
    lens = tl.load(seq_lens)
    # the zero halo of a new sequence is copied by DMA (out of order), not memset on an engine
    # queue where it would wait behind the previous tile's compute
    zeros = tl.filled((PARTITIONS, halo if halo else 1), 0.0, x_dtype)
    for c0 in range(0, channels, PARTITIONS):
        size = min(PARTITIONS, channels - c0)
        rows = nl.ds(c0, size)
        weight = tl.load(conv_weight[rows, :], nl.float32)
        for b in nl.affine_range(b_size):
            slot = nisa.register_alloc(0)
            nisa.register_load(slot, slot_tile[0:1, b:b + 1])
            for t0 in range(0, t_len, TIME_TILE):
                length = min(TIME_TILE, t_len - t0)
                x_ext = tl.sbuf((size, halo + length), x_dtype)
                if halo and t0 > 0:
                    nisa.dma_copy(dst=x_ext[:, 0:halo], src=mixed[b, rows, t0 - halo:t0])
                elif halo and initial_state:
                    nisa.dma_copy(dst=x_ext[:, 0:halo], src=conv_cache[slot, rows, 1:width])
                elif halo:
                    nisa.dma_copy(dst=x_ext[:, 0:halo], src=zeros[0:size, :])
                nisa.dma_copy(dst=x_ext[:, halo:halo + length], src=mixed[b, rows, t0:t0 + length])
                tl.store(out[b, rows, t0:t0 + length], _activate(_taps(x_ext, weight, length), activation, mixed.dtype))
                # the new state is x_ext[:, len - 1 - t0 :][:K] in the one time tile that holds it;
                # from every other tile the register address is out of bounds and the DMA skipped
                start = tl.scalar(lens[0:1, b:b + 1], nl.add, float(-1 - t0), dtype=nl.int32)
                window = nisa.register_alloc(0)
                nisa.register_load(window, start)
                nisa.dma_copy(dst=conv_cache[slot, rows, :], src=x_ext[:, nl.ds(window, width)],
                              oob_mode=nisa.oob_mode.skip)
    return out, conv_cache


CONV1D_PREFILL = NkiOp("conv1d_prefill", conv1d_prefill_kernel, mutates_args=("conv_cache",))


def decode_packing(channels):
    """``(P, m)``: ``m`` consecutive channels per partition on ``P = channels / m <= 128`` partitions.

    Packing channels makes each partition's slice of a ``[C, K]`` conv state one contiguous run
    of ``m * K`` elements, instead of a ``K``-element (e.g. 16-byte) DMA descriptor per channel.
    """
    per = channels
    for m in range(-(-channels // PARTITIONS), channels + 1):  # the smallest m dividing C
        if channels % m == 0:
            per = m
            break
    return channels // per, per


@nki.jit
def conv1d_decode_kernel(x, conv_cache, conv_weight, slots, activation="silu"):
    """The NKI kernel behind :func:`gdn_conv1d_decode` (arguments already checked).

    Sequence ``b``'s state is row ``slots[b]`` of ``conv_cache`` (``[pages, C, K]``), shifted by
    one token in place; ``slots`` is a ``[1, B]`` int32 tensor read into a register.

    Returns:
        ``(out [B, C, 1] in x's dtype, conv_cache)`` (the cache updated in place).
    """
    b_size, channels, _ = x.shape
    width = conv_weight.shape[1]
    parts, per = decode_packing(channels)
    out = nl.ndarray((b_size, channels, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    weight = tl.load(conv_weight.reshape((parts, per * width)), nl.float32).reshape((parts, per, width))
    slot_tile = tl.load(slots)
    for b in nl.affine_range(b_size):
        slot = nisa.register_alloc(0)
        nisa.register_load(slot, slot_tile[0:1, b:b + 1])
        state = tl.load(conv_cache[slot].reshape((parts, per * width))).reshape((parts, per, width))
        window = tl.sbuf((parts, per, width), conv_cache.dtype)
        if width > 1:
            nisa.tensor_copy(dst=window[:, :, 0:width - 1], src=state[:, :, 1:width], engine=nisa.engine.gpsimd)
        newest = tl.load(x[b].reshape((parts, per, 1)))  # contiguous on both sides: one run per partition
        nisa.tensor_copy(dst=window[:, :, width - 1:width], src=newest, engine=nisa.engine.gpsimd)
        acc = tl.reduce(tl.binary(window, weight, nl.multiply), nl.add, axis=2)
        tl.store(out[b].reshape((parts, per, 1)), _activate(acc, activation, x.dtype))
        tl.store(conv_cache[slot].reshape((parts, per * width)), window.reshape((parts, per * width)))
    return out, conv_cache


CONV1D_DECODE = NkiOp("conv1d_decode", conv1d_decode_kernel, mutates_args=("conv_cache",))


def _check_weight(conv_weight, channels):
    check_rank("conv_weight", conv_weight, 2, "[C, K]")
    check_dtype("conv_weight", conv_weight, FLOAT_DTYPES)
    if conv_weight.shape[0] != channels:
        raise ValueError(f"conv_weight must have C = {channels} rows (the channels of the input), "
                         f"got shape {tuple(conv_weight.shape)}")


def _copy_of(state, dtype_like=None):
    """A contiguous copy of ``state`` (a torch tensor or a NumPy array), fp32 when ``dtype_like`` says so."""
    if isinstance(state, torch.Tensor):
        return state.to(torch.float32 if dtype_like == "float32" else state.dtype, copy=True).contiguous()
    return np.array(state, dtype=np.float32 if dtype_like == "float32" else state.dtype)


def _zeros(shape, like):
    if isinstance(like, torch.Tensor):
        return torch.zeros(shape, dtype=torch.float32, device=like.device)
    return np.zeros(shape, np.float32)


def gdn_conv1d_prefill(mixed, conv_weight, conv_state=None, activation="silu", state_slots=None, seq_lens=None):
    """Causal depthwise conv1d + activation over whole sequences, optionally continuing one.

    Dimensions:
        B sequences of T tokens (T >= 1); C channels; K kernel width.

    Args:
        mixed: ``[B, C, T]`` raw inputs (fp32, bf16 or fp16).
        conv_weight: ``[C, K]``.
        conv_state: ``[B, C, K]`` incoming conv state (the K raw inputs before ``mixed``,
            oldest first), or None for a new sequence (zeros, no load). With ``state_slots``:
            the conv cache ``[pages, C, K]``, updated in place.
        activation: "silu" or None.
        state_slots: ``[B]`` int tensor of cache rows (the engine layout), or None.
        seq_lens: ``[B]`` int tensor of real tokens per sequence (1..T; the rest is padding whose
            outputs are garbage-free but meaningless), or None for T each.

    Returns:
        ``(out [B, C, T] in mixed's dtype, state)``: without ``state_slots`` a fresh ``[B, C, K]``
        fp32 state, holding the last K raw inputs (incoming state columns in front when T < K);
        with it, ``conv_state`` itself, its rows ``state_slots`` updated.
    """
    check_rank("mixed", mixed, 3, "[B, C, T]")
    check_dtype("mixed", mixed, FLOAT_DTYPES)
    b_size, channels, t_len = mixed.shape
    if t_len < 1:
        raise ValueError(f"mixed must hold T >= 1 tokens, got shape {tuple(mixed.shape)}")
    _check_weight(conv_weight, channels)
    check_choice("activation", activation, ACTIVATIONS)
    width = conv_weight.shape[1]
    if state_slots is not None:
        if conv_state is None:
            raise ValueError("state_slots needs conv_state (the conv cache [pages, C, K] the slots index)")
        check_shape("conv_state", conv_state, (conv_state.shape[0], channels, width), "[pages, C, K]")
        check_slots("state_slots", state_slots,
                    conv_state.shape[0], b_size)
    elif conv_state is not None:
        check_shape("conv_state", conv_state, (b_size, channels, width), "[B, C, K]")
    if conv_state is not None:
        check_dtype("conv_state", conv_state, FLOAT_DTYPES)
    lengths = [t_len] * b_size if seq_lens is None else seq_lens
    values = lengths.tolist() if hasattr(lengths, "tolist") else list(lengths)
    if len(values) != b_size or any(not 1 <= int(n) <= t_len for n in values):
        raise ValueError(f"seq_lens must hold B = {b_size} lengths in [1, {t_len}], got {values}")
    if state_slots is None:
        cache = _zeros((b_size, channels, width), mixed) if conv_state is None else _copy_of(conv_state, "float32")
    else:
        cache = conv_state
    return CONV1D_PREFILL(mixed, conv_weight, cache, index_tensor(range(b_size) if state_slots is None else state_slots,
                                                                   mixed),
                          index_tensor(lengths, mixed), activation=activation, initial_state=conv_state is not None)


def gdn_conv1d_decode(x, conv_state, conv_weight, activation="silu", state_slots=None):
    """One decode token of the causal conv: window = state shifted left by one with x appended.

    Args:
        x: ``[B, C, 1]``.
        conv_state: ``[B, C, K]`` the last K raw inputs; with ``state_slots``, the conv cache
            ``[pages, C, K]``, updated in place.
        conv_weight: ``[C, K]``.
        activation: "silu" or None.
        state_slots: ``[B]`` int tensor of cache rows (the engine layout), or None.

    Returns:
        ``(out [B, C, 1] in x's dtype, new_state)``: a fresh ``[B, C, K]`` in conv_state's dtype,
        or ``conv_state`` itself (rows ``state_slots`` updated) with ``state_slots``.
    """
    check_rank("x", x, 3, "[B, C, 1]")
    check_dtype("x", x, FLOAT_DTYPES)
    b_size, channels, one = x.shape
    if one != 1:
        raise ValueError(f"x must hold one token per sequence ([B, C, 1]), got shape {tuple(x.shape)}")
    _check_weight(conv_weight, channels)
    check_choice("activation", activation, ACTIVATIONS)
    width = conv_weight.shape[1]
    if state_slots is None:
        check_shape("conv_state", conv_state, (b_size, channels, width), "[B, C, K]")
    else:
        check_shape("conv_state", conv_state, (conv_state.shape[0], channels, width), "[pages, C, K]")
        check_slots("state_slots", state_slots,
                    conv_state.shape[0], b_size)
    check_dtype("conv_state", conv_state, FLOAT_DTYPES)
    cache = _copy_of(conv_state) if state_slots is None else conv_state
    return CONV1D_DECODE(x, cache, conv_weight, index_tensor(range(b_size) if state_slots is None else state_slots, x),
                         activation=activation)
