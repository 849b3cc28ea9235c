"""vLLM's fused decode on the layer's raw gating (``a, b, A_log, dt_bias``) against float64 oracles.

The gating goes to the kernel as the model has it (no bf16 pre-images of g and beta): the
outputs and states match the float64 token-by-token recurrence on ``qwen35_gating``'s g and
beta within bf16's tolerance, and the decay alone (q = k = v = 0) matches it to float32's.
"""

import re

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.kernels.reference import gdn_recurrence, qwen35_gating, tolerance
from vllm_gdn_neuron.ops import paged, phases
from vllm_gdn_neuron.ops.backends import vllm_cpu

from .ops_testing import assert_matches, make_gdn_inputs

pytestmark = pytest.mark.skipif(not vllm_cpu.is_available(), reason="vLLM's compiled CPU ops (vllm-cpu) not installed")
BF16, F32 = torch.bfloat16, torch.float32


def _raw_gating(tokens, hv, a_scale, log_rate, gen):
    """``(a, b)`` as column slices of one ``[T, 2 Hv]`` bf16 projection (the shells' ``ba``
    split), and float32 ``A_log``, ``dt_bias [Hv]`` (dt_bias not bf16-representable)."""
    ba = (a_scale * torch.randn(tokens, 2 * hv, generator=gen)).to(BF16)
    b, a = ba.split([hv, hv], dim=-1)
    A_log = log_rate * torch.rand(hv, generator=gen)
    dt_bias = torch.randn(hv, generator=gen) + 1 / 3
    return a, b, A_log, dt_bias


def _paged_cache(pages, hv, dim, gen):
    """Random float32 state rows as vLLM binds them: views into larger per-block pages."""
    storage = 0.5 * torch.randn(pages, 100 + hv * dim * dim, generator=gen)
    return storage[:, 100:].view(pages, hv, dim, dim)


@pytest.mark.parametrize("hk, hv, dim, a_scale, log_rate, pages", [
    (2, 2, 64, 1.0, 1.0, [4, 0, 3]),
    (1, 2, 64, 1.0, 1.0, [5]),                   # GQA 2, one row
    (1, 3, 128, 4.0, 3.0, [2, 6, 1]),            # GQA 3, strong decay (exp(A_log) up to 20, a up to ~12)
    (1, 4, 128, 1.0, 0.5, [1, 7, 7, 3, 7]),      # GQA 4, two padding rows on the pad page 7
    (4, 8, 64, 0.1, -4.0, [0, 2]),               # slow decay: g near 0
])
def test_raw_gating_decode_matches_the_float64_recurrence(hk, hv, dim, a_scale, log_rate, pages):
    """Live rows advance their pages from non-zero states; padding rows give zeros and leave the
    pad page; no other page changes."""
    gen = torch.Generator().manual_seed(hv * 100 + dim)
    pad_page = 7
    rows = len(pages)
    x = make_gdn_inputs([1] * rows, hk, hv, dim, dim, dtype=BF16, seed=hk + hv)
    a, b, A_log, dt_bias = _raw_gating(rows, hv, a_scale, log_rate, gen)
    cache = _paged_cache(8, hv, dim, gen)
    before = cache.clone()
    step = ops.DecodeStep.build(torch.tensor(pages), pad_page=pad_page)

    o = vllm_cpu.paged_gdn_decode_raw_gating(x["q"], x["k"], x["v"], a, b, A_log, dt_bias, cache, step,
                                             use_qk_l2norm=True)

    live = [r for r, page in enumerate(pages) if page != pad_page]
    g, beta = qwen35_gating(a[live], b[live], A_log, dt_bias)
    live_pages = [pages[r] for r in live]
    o_ref, state_ref = gdn_recurrence(x["q"][live], x["k"][live], x["v"][live], g, beta, torch.arange(len(live) + 1),
                                      initial_state=before[live_pages], use_qk_l2norm=True)
    assert o.dtype == BF16 and o.shape == x["v"].shape
    assert_matches(o[live], o_ref, BF16, "o")
    assert_matches(cache[live_pages], state_ref, BF16, "state pages")
    padding = [r for r in range(rows) if r not in live]
    assert torch.equal(o[padding], torch.zeros_like(o[padding]))
    untouched = [p for p in range(8) if p not in live_pages]
    assert torch.equal(cache[untouched], before[untouched])


@pytest.mark.parametrize("log_rate, a_scale", [(0.5, 1.0), (3.0, 4.0), (-4.0, 0.1)])
def test_raw_gating_decay_is_float32_exact(log_rate, a_scale):
    """q = k = v = 0: each state row is only decayed, by exp(g) of the raw gating, to float32
    accuracy (dt_bias bf16-representable, as a bf16 checkpoint stores it): no rounded pre-image
    of g stands between the model's gating and the kernel."""
    gen = torch.Generator().manual_seed(3)
    hv, dim, rows = 4, 64, 6
    a, b, A_log, dt_bias = _raw_gating(rows, hv, a_scale, log_rate, gen)
    dt_bias = dt_bias.to(BF16).float()
    zeros = torch.zeros(rows, 2, dim, dtype=BF16)
    cache = _paged_cache(rows, hv, dim, gen)
    before = cache.clone()

    vllm_cpu.paged_gdn_decode_raw_gating(zeros, zeros, zeros.new_zeros(rows, hv, dim), a, b, A_log, dt_bias, cache,
                                         ops.DecodeStep.build(torch.arange(rows)), use_qk_l2norm=True)

    g, _ = qwen35_gating(a, b, A_log, dt_bias)
    want = before.double() * g.exp()[:, :, None, None]
    error = (cache.double() - want).abs().max().item()
    assert error <= tolerance(F32, want), f"decayed state: max abs error {error:.3g}"


def test_raw_gating_decode_on_a_bf16_cache_runs_gdn_gates_on_the_torch_math():
    """A cache the kernel cannot update in place: the torch decode on ``gdn_gates``' g and beta,
    the same numbers as the layer's torch phase."""
    gen = torch.Generator().manual_seed(4)
    x = make_gdn_inputs([1, 1], 1, 2, 64, 64, dtype=BF16, seed=4)
    a, b, A_log, dt_bias = _raw_gating(2, 2, 1.0, 1.0, gen)
    cache = _paged_cache(3, 2, 64, gen).to(BF16)
    torch_cache = cache.clone()
    step = ops.DecodeStep.build(torch.tensor([2, 0]))
    args = (x["q"], x["k"], x["v"], a, b, A_log, dt_bias)

    o = vllm_cpu.paged_gdn_decode_raw_gating(*args, cache, step, use_qk_l2norm=True)
    o_torch = phases.phase_op(paged, "gdn_decode")(*args, torch_cache, step, use_qk_l2norm=True)

    assert torch.equal(o, o_torch) and torch.equal(cache, torch_cache)


@pytest.mark.parametrize("change, message", [
    (dict(dim_v=128), "v: backend 'vllm_cpu' expects Dk == Dv in (64, 128), got Dk = 64, Dv = 128"),
    (dict(a_rows=3), "a: expected shape [N=2, Hv=2], got (3, 2) (N = 3)"),
    (dict(A_log_heads=3), "A_log: expected shape [Hv=2], got (3,) (Hv = 3)"),
])
def test_raw_gating_decode_refuses_what_it_cannot_run_before_any_work(change, message):
    gen = torch.Generator().manual_seed(5)
    x = make_gdn_inputs([1, 1], 1, 2, 64, change.get("dim_v", 64), dtype=BF16)
    a, b, A_log, dt_bias = _raw_gating(change.get("a_rows", 2), 2, 1.0, 1.0, gen)
    if "A_log_heads" in change:
        A_log = torch.zeros(change["A_log_heads"])
    cache = torch.zeros(3, 2, 64, change.get("dim_v", 64))
    with pytest.raises(ValueError, match=re.escape(message)):
        vllm_cpu.paged_gdn_decode_raw_gating(x["q"], x["k"], x["v"], a, b, A_log, dt_bias, cache,
                                             ops.DecodeStep.build(torch.tensor([0, 1])), use_qk_l2norm=True)
    assert torch.equal(cache, torch.zeros_like(cache))
