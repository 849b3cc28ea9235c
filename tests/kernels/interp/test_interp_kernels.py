"""Two small known kernels written against the NKI API match NumPy in the interpreter."""

import numpy as np
import pytest
import torch

from vllm_gdn_neuron.kernels.interp import nisa, nki, nl

from .interp_helpers import BF16, as_bf16, randn


@nki.jit
def tiled_matmul(lhs_t, rhs):
    """``lhs_t^T @ rhs`` for lhs_t [K, M], rhs [K, N]: K in 128-chunks accumulated in PSUM,
    M in 128-row tiles, N in 512-column tiles (last tiles may be partial)."""
    k_total, m_total = lhs_t.shape
    n_total = rhs.shape[1]
    out = nl.ndarray((m_total, n_total), nl.float32, buffer=nl.shared_hbm)
    for m0 in range(0, m_total, 128):
        m = min(128, m_total - m0)
        for n0 in range(0, n_total, 512):
            n = min(512, n_total - n0)
            acc = nl.ndarray((m, n), nl.float32, buffer=nl.psum)
            for k0 in range(0, k_total, 128):
                k = min(128, k_total - k0)
                stationary = nl.ndarray((k, m), lhs_t.dtype)
                nisa.dma_copy(dst=stationary, src=lhs_t[nl.ds(k0, k), nl.ds(m0, m)])
                moving = nl.ndarray((k, n), rhs.dtype)
                nisa.dma_copy(dst=moving, src=rhs[nl.ds(k0, k), nl.ds(n0, n)])
                nisa.nc_matmul(dst=acc, stationary=stationary, moving=moving, accumulate=k0 > 0)
            result = nl.ndarray((m, n), nl.float32)
            nisa.tensor_copy(dst=result, src=acc)
            nisa.dma_copy(dst=out[nl.ds(m0, m), nl.ds(n0, n)], src=result)
    return out


@nki.jit
def row_softmax(x):
    """Softmax over the last axis of x [R, C], rows on partitions, 128 rows per tile; fp32 math."""
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, rows, 128):
        r = min(128, rows - r0)
        tile = nl.ndarray((r, cols), nl.float32)
        nisa.dma_copy(dst=tile, src=x[nl.ds(r0, r), :])
        neg_max = nl.ndarray((r, 1), nl.float32)
        nisa.tensor_reduce(dst=neg_max, op=nl.max, data=tile, axis=1, negate=True, keepdims=True)
        exps = nl.ndarray((r, cols), nl.float32)
        nisa.activation(dst=exps, op=nl.exp, data=tile, bias=neg_max)
        total = nl.ndarray((r, 1), nl.float32)
        nisa.tensor_reduce(dst=total, op=nl.add, data=exps, axis=1, keepdims=True)
        inv = nl.ndarray((r, 1), nl.float32)
        nisa.reciprocal(dst=inv, data=total)
        probs = nl.ndarray((r, cols), x.dtype)
        nisa.tensor_scalar(dst=probs, data=exps, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[nl.ds(r0, r), :], src=probs)
    return out


@pytest.mark.parametrize("dtype", [np.float32, BF16])
@pytest.mark.parametrize("k,m,n", [(300, 200, 700), (128, 128, 512), (1, 5, 3)])
def test_tiled_matmul_matches_numpy(dtype, k, m, n):
    rng = np.random.default_rng(k + m + n)
    lhs_t, rhs = randn(rng, (k, m), dtype), randn(rng, (k, n), dtype)
    out = tiled_matmul(lhs_t, rhs)
    exact = lhs_t.astype(np.float64).T @ rhs.astype(np.float64)
    assert out.shape == (m, n) and out.dtype == np.float32
    np.testing.assert_allclose(out, exact, rtol=1e-5, atol=2e-6 * np.sqrt(k) * 10)


def test_tiled_matmul_with_torch_tensors():
    lhs_t, rhs = torch.randn(130, 70), torch.randn(130, 40)
    out = tiled_matmul(lhs_t, rhs)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, lhs_t.T @ rhs, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
@pytest.mark.parametrize("rows,cols", [(200, 37), (128, 512), (1, 1)])
def test_row_softmax_matches_numpy(dtype, rows, cols):
    x = randn(np.random.default_rng(rows * cols), (rows, cols), dtype, scale=4.0)
    out = row_softmax(x)
    xf = x.astype(np.float64)
    expected = np.exp(xf - xf.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    assert out.dtype == np.dtype(dtype)
    if np.dtype(dtype) == np.float32:
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7)
    else:  # one bf16 rounding of the fp32 result
        np.testing.assert_allclose(out.astype(np.float32), as_bf16(expected), rtol=2**-7, atol=1e-7)
