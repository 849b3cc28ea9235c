"""The torch backend's matmul-only (I + L)^-1 against a float64 dense inverse."""

import pytest
import torch

from vllm_gdn_neuron.ops.backends.torch.triangular import unit_lower_inverse


@pytest.mark.parametrize("size", [8, 16, 32, 64])
@pytest.mark.parametrize("correlated", [False, True])
def test_unit_lower_inverse_matches_dense_inverse(size, correlated):
    gen = torch.Generator().manual_seed(size)
    if correlated:  # the A of nearly parallel unit keys with beta near 1: entries near 1, large inverse
        keys = torch.randn(1, size, 1, generator=gen) * 0.05 + torch.ones(1, 1, 16)
        keys = keys / keys.norm(dim=-1, keepdim=True)
        lower = 0.95 * keys @ keys.transpose(-1, -2)
    else:
        lower = 0.3 * torch.randn(3, size, size, generator=gen)
    lower = lower + torch.triu(torch.full_like(lower, 7.0))  # the upper triangle and diagonal are ignored
    inverse = unit_lower_inverse(lower)
    expected = torch.linalg.inv(torch.eye(size, dtype=torch.float64) + lower.double().tril(-1))
    error = (inverse.double() - expected).abs().max().item()
    assert error <= 1e-5 * expected.abs().max().item(), error
    assert torch.equal(inverse.triu(1), torch.zeros_like(inverse.triu(1)))
