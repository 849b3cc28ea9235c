"""Both RMS norms against transformers' Qwen3.5 modules (bit for bit, fp32 and bf16)."""

import pytest
import torch

from vllm_gdn_neuron.layers.norms import GatedRMSNorm, ZeroCentredRMSNorm


def _copy_weight(ours, theirs, dtype):
    weight = torch.randn(ours.weight.shape)
    ours.weight.data.copy_(weight)
    theirs.weight.data.copy_(weight)
    return ours.to(dtype), theirs.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_gated_norm_matches_transformers(dtype, head_dim):
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    torch.manual_seed(0)
    ours, theirs = _copy_weight(GatedRMSNorm(head_dim, eps=1e-6), Qwen3_5RMSNormGated(head_dim, eps=1e-6), dtype)
    o = (3 * torch.randn(7, 4, head_dim)).to(dtype)
    z = torch.randn(7, 4, head_dim).to(dtype)
    got = ours(o, z)
    assert got.dtype == dtype
    torch.testing.assert_close(got, theirs(o, z), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_centred_norm_and_its_residual_add_match_transformers(dtype):
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    torch.manual_seed(1)
    ours, theirs = _copy_weight(ZeroCentredRMSNorm(64, eps=1e-6), Qwen3_5RMSNorm(64, eps=1e-6), dtype)
    x = (2 * torch.randn(5, 64)).to(dtype)
    residual = torch.randn(5, 64).to(dtype)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    normed, summed = ours(x, residual)
    torch.testing.assert_close(summed, x + residual, rtol=0, atol=0)
    torch.testing.assert_close(normed, theirs(x + residual), rtol=0, atol=0)
