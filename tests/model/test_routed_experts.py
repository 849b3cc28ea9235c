"""The sparse routed experts (gathered and grouped) against the dense every-expert reference.

Tolerances, stated:

- float32: the three formulations add each token's k weighted outputs in the same order
  (expert index); they differ only in how the batched matmuls associate the H- and I-long
  dot products. The bound is the first-order error of re-associating them, elementwise:
  ``2 n u sum |a_i b_i|`` per n-term dot product (``u = 2^-24``), carried through SwiGLU
  by its derivatives and through ``down`` by ``|down|`` (:func:`_reassociation_bound`).
- bfloat16: every formulation rounds at the same points (each matmul output, SwiGLU, the
  weighting, each addition), so a re-associated dot product can land one rounding apart
  and carry it on. The rule: the sparse path's largest error against a float64 oracle is at
  most twice the dense bfloat16 reference's own (plus one bfloat16 ulp of the output scale).
"""

import pytest
import torch

from vllm_gdn_neuron.model.mlp import dense_expert_mixture, softmax_top_k
from vllm_gdn_neuron.model.routed_experts import (
    gathered_expert_mixture,
    grouped_expert_mixture,
    max_expert_blocks,
    routed_expert_mixture,
    uses_grouped_path,
)

PATHS = {
    "gathered": lambda x, w, e, gu, d, block: gathered_expert_mixture(x, w, e, gu, d),
    "grouped": grouped_expert_mixture,
    "routed": routed_expert_mixture,
}


def _experts(num_experts, hidden, inter, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(num_experts, 2 * inter, hidden, generator=g) / hidden**0.5
    down = torch.randn(num_experts, hidden, inter, generator=g) / inter**0.5
    return gate_up.to(dtype), down.to(dtype)


def _routing(num_tokens, num_experts, top_k, renormalize, dtype, seed, one_choice=False):
    """Softmax top-k routing; ``one_choice``: every token's logits alike, so all tokens pick the same experts."""
    g = torch.Generator().manual_seed(seed)
    if one_choice:
        logits = torch.randn(1, num_experts, generator=g).expand(num_tokens, num_experts).contiguous()
    else:
        logits = torch.randn(num_tokens, num_experts, generator=g)
    return softmax_top_k(logits.to(dtype), top_k, renormalize)


def _reassociation_bound(x, weights, experts, gate_up, down):
    """First-order bound, in float64, on how far two summation orders of the dot products can part.

    A dot product of n terms summed in two orders differs by at most ``2 n u sum |a_i b_i|``
    (``u = 2^-24``); the gate / up error is carried through SwiGLU by its derivatives and
    through ``down`` by ``|down|``; each token's k outputs add in the same order on every path.
    """
    u = 2.0**-24
    x, gate_up, down = x.double(), gate_up.double(), down.double()
    hidden, inter = x.shape[1], down.shape[2]
    bound = torch.zeros_like(x)
    for j in range(experts.shape[1]):
        w_gu, w_down = gate_up[experts[:, j]], down[experts[:, j]]  # [T, 2I, H], [T, H, I]
        gate_up_out = torch.einsum("tih,th->ti", w_gu, x)
        gate_up_err = 2 * hidden * u * torch.einsum("tih,th->ti", w_gu.abs(), x.abs())
        gate, up = gate_up_out.chunk(2, dim=-1)
        gate_err, up_err = gate_up_err.chunk(2, dim=-1)
        sig = torch.sigmoid(gate)
        silu, dsilu = gate * sig, sig * (1 + gate * (1 - sig))
        h = silu * up
        h_err = dsilu.abs() * up.abs() * gate_err + silu.abs() * up_err
        y_err = torch.einsum("thi,ti->th", w_down.abs(), h_err)
        y_err = y_err + 2 * inter * u * torch.einsum("thi,ti->th", w_down.abs(), h.abs())
        bound += weights[:, j : j + 1].double().abs() * y_err
    return bound


def _check_fp32(got, x, weights, experts, gate_up, down):
    want = dense_expert_mixture(x, weights, experts, gate_up, down)
    bound = _reassociation_bound(x, weights, experts, gate_up, down)
    excess = (got.double() - want.double()).abs() - bound
    assert excess.max() <= 0, f"max error over the re-association bound by {excess.max():.3e}"


# (E, k) over the checkpoints' range and past it; T: one token, a few, past one 128-row block.
ROUTES = [(e, k) for e in (8, 64, 256) for k in (1, 2, 8, 10) if k <= e]


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(("num_experts", "top_k"), ROUTES)
@pytest.mark.parametrize("num_tokens", [1, 7, 130])
def test_fp32_equals_the_dense_reference(path, num_experts, top_k, num_tokens):
    gate_up, down = _experts(num_experts, 32, 16, torch.float32, seed=num_experts)
    x = torch.randn(num_tokens, 32, generator=torch.Generator().manual_seed(num_tokens))
    weights, experts = _routing(num_tokens, num_experts, top_k, True, torch.float32, seed=top_k)
    got = PATHS[path](x, weights, experts, gate_up, down, 16)
    _check_fp32(got, x, weights, experts, gate_up, down)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(("num_experts", "top_k", "renormalize"), [(256, 8, True), (256, 10, False), (8, 1, False)])
def test_fp32_at_4096_tokens(path, num_experts, top_k, renormalize):
    """The largest prefill bucket at the 35B-A3B routing (256 experts, top-8), in a small hidden size."""
    gate_up, down = _experts(num_experts, 16, 8, torch.float32, seed=1)
    x = torch.randn(4096, 16, generator=torch.Generator().manual_seed(2))
    weights, experts = _routing(4096, num_experts, top_k, renormalize, torch.float32, seed=3)
    got = PATHS[path](x, weights, experts, gate_up, down, 128)
    _check_fp32(got, x, weights, experts, gate_up, down)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(("num_experts", "top_k", "num_tokens", "block_size"), [
    (8, 1, 300, 128), (8, 2, 33, 4), (256, 8, 4096, 128), (64, 10, 129, 16),
])
def test_every_token_picks_the_same_experts(path, num_experts, top_k, num_tokens, block_size):
    """k experts hold every token (their blocks many, the others none): the block bound still holds."""
    gate_up, down = _experts(num_experts, 16, 8, torch.float32, seed=4)
    x = torch.randn(num_tokens, 16, generator=torch.Generator().manual_seed(5))
    weights, experts = _routing(num_tokens, num_experts, top_k, False, torch.float32, seed=6, one_choice=True)
    assert (experts == experts[:1]).all()
    got = PATHS[path](x, weights, experts, gate_up, down, block_size)
    _check_fp32(got, x, weights, experts, gate_up, down)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(("num_experts", "top_k", "num_tokens"), [(8, 2, 5), (256, 8, 64), (64, 10, 200)])
def test_bf16_within_the_rounding_rule(path, num_experts, top_k, num_tokens, renormalize):
    gate_up, down = _experts(num_experts, 64, 32, torch.bfloat16, seed=7)
    x = torch.randn(num_tokens, 64, generator=torch.Generator().manual_seed(8)).bfloat16()
    weights, experts = _routing(num_tokens, num_experts, top_k, renormalize, torch.bfloat16, seed=9)
    oracle = dense_expert_mixture(x.double(), weights.double(), experts, gate_up.double(), down.double())
    reference = dense_expert_mixture(x, weights, experts, gate_up, down)
    got = PATHS[path](x, weights, experts, gate_up, down, 16)
    assert got.dtype == torch.bfloat16
    reference_error = (reference.double() - oracle).abs().max()
    ulp = 2.0**-8 * oracle.abs().max()
    assert (got.double() - oracle).abs().max() <= 2 * reference_error + ulp


def test_renormalised_weights_sum_to_one_and_raw_ones_do_not():
    """norm_topk_prob: both routings reach the paths (the 35B-A3B checkpoint renormalises)."""
    logits = torch.randn(6, 64, generator=torch.Generator().manual_seed(0))
    normed, experts = softmax_top_k(logits, 8, True)
    raw, same = softmax_top_k(logits, 8, False)
    assert torch.equal(experts, same)
    assert (normed.sum(-1) - 1).abs().max() < 1e-6
    assert (raw.sum(-1) < 1).all()


@pytest.mark.parametrize(("num_experts", "block_size"), [(8, 4), (64, 16), (256, 128)])
def test_block_bound_holds_and_is_reached(num_experts, block_size):
    """Blocks in use never exceed :func:`max_expert_blocks`; counts of 1 mod B on every expert reach it."""
    generator = torch.Generator().manual_seed(num_experts)
    for n in (1, block_size - 1, num_experts, 3 * num_experts + 5, 40 * block_size):
        bound = max_expert_blocks(n, num_experts, block_size)
        for _ in range(20):
            counts = torch.bincount(torch.randint(num_experts, (n,), generator=generator), minlength=num_experts)
            assert int(((counts + block_size - 1) // block_size).sum()) <= bound
    n = num_experts * (block_size + 1)  # every expert holds B + 1: two blocks each
    assert max_expert_blocks(n, num_experts, block_size) == 2 * num_experts


def test_crossover_rule_per_bucket():
    """35B-A3B (E = 256, k = 8): decode buckets of up to 32 rows gather; prefill buckets group."""
    assert not uses_grouped_path(32, 8, 256) and uses_grouped_path(33, 8, 256)
    assert not uses_grouped_path(4, 8, 256) and uses_grouped_path(1024, 8, 256)
    assert uses_grouped_path(3, 2, 4) and not uses_grouped_path(2, 2, 4)


def test_bad_block_size_is_refused_naming_it():
    gate_up, down = _experts(4, 8, 4, torch.float32, seed=0)
    weights, experts = _routing(3, 4, 2, True, torch.float32, seed=0)
    with pytest.raises(ValueError, match="block_size must be >= 1; got 0"):
        grouped_expert_mixture(torch.randn(3, 8), weights, experts, gate_up, down, 0)
