"""Helpers shared by the interpreter tests: run a kernel body on arrays, load/store tiles."""

import ml_dtypes
import numpy as np

from vllm_gdn_neuron.kernels.interp import nisa, nki, nl

BF16 = np.dtype(ml_dtypes.bfloat16)


def load(src, dtype=None, buffer=nl.sbuf):
    """DMA an HBM tensor (or view) into a fresh tile of the same shape."""
    tile = nl.ndarray(src.shape, dtype or src.dtype, buffer=buffer)
    nisa.dma_copy(dst=tile, src=src)
    return tile


def store(tile, dtype=None):
    """DMA a tile into a fresh shared_hbm output (via an SBUF copy when it lives in PSUM)."""
    if tile.buffer == nl.psum:
        staged = nl.ndarray(tile.shape, dtype or tile.dtype)
        nisa.tensor_copy(dst=staged, src=tile)
        tile = staged
    out = nl.ndarray(tile.shape, dtype or tile.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile)
    return out


def run(body, *arrays, **constants):
    """Run ``body`` (an instruction test's body, not a kernel: no front-end check) under ``nki.jit``."""
    return nki.jit(body, frontend_check=False)(*arrays, **constants)


def randn(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def as_bf16(x):
    """float32 values rounded to bf16 and back (the values a bf16 tile holds)."""
    return np.asarray(x, dtype=np.float32).astype(BF16).astype(np.float32)
