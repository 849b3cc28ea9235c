"""Both RMS norms against transformers' Qwen3.5 modules (bit for bit, fp32 and bf16), whole and
evaluated in row blocks (the eager CPU path for long steps; here with blocks of 3 rows and a
partial last one)."""

import pytest
import torch

from vllm_gdn_neuron.model import norms
from vllm_gdn_neuron.model.norms import GatedRMSNorm, ZeroCentredRMSNorm

BLOCKING = pytest.mark.parametrize("block_rows", [None, 3], ids=["whole", "row-blocks"])


def _set_blocks(monkeypatch, block_rows, row_elements):
    if block_rows is not None:
        monkeypatch.setattr(norms, "CPU_BLOCK_ELEMENTS", block_rows * row_elements)


def _copy_weight(ours, theirs, dtype):
    weight = torch.randn(ours.weight.shape)
    ours.weight.data.copy_(weight)
    theirs.weight.data.copy_(weight)
    return ours.to(dtype), theirs.to(dtype)


@BLOCKING
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_gated_norm_matches_transformers(monkeypatch, dtype, head_dim, block_rows):
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    _set_blocks(monkeypatch, block_rows, 4 * head_dim)
    torch.manual_seed(0)
    ours, theirs = _copy_weight(GatedRMSNorm(head_dim, eps=1e-6), Qwen3_5RMSNormGated(head_dim, eps=1e-6), dtype)
    o = (3 * torch.randn(7, 4, head_dim)).to(dtype)
    z = torch.randn(7, 4, head_dim).to(dtype)
    got = ours(o, z)
    assert got.dtype == dtype
    torch.testing.assert_close(got, theirs(o, z), rtol=0, atol=0)


@BLOCKING
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_centred_norm_and_its_residual_add_match_transformers(monkeypatch, dtype, block_rows):
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    _set_blocks(monkeypatch, block_rows, 64)
    torch.manual_seed(1)
    ours, theirs = _copy_weight(ZeroCentredRMSNorm(64, eps=1e-6), Qwen3_5RMSNorm(64, eps=1e-6), dtype)
    x = (2 * torch.randn(5, 64)).to(dtype)
    residual = torch.randn(5, 64).to(dtype)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    normed, summed = ours(x, residual)
    torch.testing.assert_close(summed, x + residual, rtol=0, atol=0)
    torch.testing.assert_close(normed, theirs(x + residual), rtol=0, atol=0)


def test_in_row_blocks_covers_every_row_once(monkeypatch):
    monkeypatch.setattr(norms, "CPU_BLOCK_ELEMENTS", 3 * 8)
    x, y = torch.randn(10, 2, 4), torch.randn(10, 2, 4)
    seen = []

    def row_wise(a, b):
        seen.append(a.shape[0])
        return a * b + 1

    torch.testing.assert_close(norms.in_row_blocks(row_wise, x, y), x * y + 1, rtol=0, atol=0)
    assert seen == [3, 3, 3, 1]
    seen.clear()
    norms.in_row_blocks(row_wise, x[:3], y[:3])
    assert seen == [3], "a step of one block runs whole"
