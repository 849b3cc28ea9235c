"""The gated RMSNorm against transformers' Qwen3_5RMSNormGated (bit for bit, fp32 and bf16)."""

import pytest
import torch

from vllm_gdn_neuron.layers.gated_rmsnorm import GatedRMSNorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_matches_transformers(dtype, head_dim):
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    torch.manual_seed(0)
    ours, theirs = GatedRMSNorm(head_dim, eps=1e-6), Qwen3_5RMSNormGated(head_dim, eps=1e-6)
    weight = torch.randn(head_dim)
    ours.weight.data.copy_(weight)
    theirs.weight.data.copy_(weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    o = (3 * torch.randn(7, 4, head_dim)).to(dtype)
    z = torch.randn(7, 4, head_dim).to(dtype)
    got = ours(o, z)
    assert got.dtype == dtype
    torch.testing.assert_close(got, theirs(o, z), rtol=0, atol=0)
