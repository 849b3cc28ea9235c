"""Chunk plans and layouts: the varlen layout of a bucket fits every composition of it with the
fewest chunks that the worst one needs, the exact plan wastes no chunk, either layout places
every real token in exactly one chunk slot, and the varlen scan equals the float64 recurrence."""

import itertools
import random

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.kernels.reference import gdn_recurrence
from vllm_gdn_neuron.ops.backends.torch import chunked
from vllm_gdn_neuron.ops.backends.torch.chunk_layout import (ChunkLayout, VarlenChunkLayout, longest_first,
                                                             varlen_chunk_bound)

from .ops_testing import assert_matches, make_gdn_inputs

CHUNK = 8


def _compositions(num_tokens, max_seqs, count, seed=0):
    rng = random.Random(seed)
    yield [num_tokens]
    yield [1] * max_seqs
    yield [num_tokens - max_seqs + 1] + [1] * (max_seqs - 1)
    for _ in range(count):
        seqs = rng.randint(0, max_seqs)
        cuts = sorted(rng.randint(0, num_tokens) for _ in range(seqs))
        yield [b - a for a, b in zip([0] + cuts, cuts)]


def _bounds(lengths, max_seqs):
    bounds = [0] + torch.tensor(lengths or [0], dtype=torch.int64).cumsum(0).tolist()[:len(lengths)]
    return torch.tensor(bounds + [bounds[-1]] * (max_seqs + 1 - len(bounds)))


def _check_covers(layout, lengths, num_tokens):
    """Each real token in exactly one slot, at its place in the chunk of its sequence."""
    index = layout.token_index.view(-1, CHUNK)
    real = index[index < num_tokens]
    assert sorted(real.tolist()) == list(range(sum(lengths)))
    assert bool(((layout.source_index == layout.token_index) | layout.is_padding).all())
    assert bool((layout.token_index[layout.is_padding] == num_tokens).all())


def _real_chunks(lengths, chunk=CHUNK):
    return sum((n + chunk - 1) // chunk for n in lengths)


@pytest.mark.parametrize("num_tokens, max_seqs", [(40, 3), (17, 5), (64, 1), (8, 8)])
def test_varlen_layout_fits_every_composition_in_token_order(num_tokens, max_seqs):
    bound = varlen_chunk_bound(num_tokens, max_seqs, CHUNK)
    for lengths in _compositions(num_tokens, max_seqs, count=50):
        bounds = _bounds(lengths, max_seqs)
        layout = VarlenChunkLayout(bounds, CHUNK, num_tokens, bound)
        _check_covers(layout, lengths, num_tokens)
        real = _real_chunks(lengths)
        assert real <= bound == layout.num_chunks
        # Real chunks first, in token order; each sequence's chunks consecutive, first and last marked.
        starts = layout.token_index.view(-1, CHUNK)[:, 0]
        assert starts[:real].tolist() == sorted(starts[:real].tolist())
        assert bool(layout.is_padding.view(-1, CHUNK)[real:].all())
        seqs = layout.chunk_seq.tolist()
        assert seqs[real:] == [max_seqs] * (bound - real)
        want_seqs = [i for i, n in enumerate(lengths) for _ in range(-(-n // CHUNK))]
        assert seqs[:real] == want_seqs
        firsts = [m for m in range(real) if m == 0 or seqs[m - 1] != seqs[m]]
        lasts = [m for m in range(real) if m == real - 1 or seqs[m + 1] != seqs[m]]
        assert [m for m, f in enumerate(layout.starts.tolist()) if f] == firsts
        assert [m for m, i in enumerate(layout.final_index.tolist()) if i < max_seqs] == lasts
        assert [layout.final_index[m].item() for m in lasts] == [seqs[m] for m in lasts]


@pytest.mark.parametrize("num_tokens, max_seqs", [(1, 1), (3, 5), (9, 2), (17, 3), (20, 4)])
def test_varlen_bound_is_the_worst_composition(num_tokens, max_seqs):
    """No chunk of the bound is wasted on the worst composition: it is the most any composition has."""
    worst = max(_real_chunks(lengths)
                for seqs in range(max_seqs + 1)
                for lengths in itertools.product(range(1, num_tokens + 1), repeat=seqs) if sum(lengths) <= num_tokens)
    assert varlen_chunk_bound(num_tokens, max_seqs, CHUNK) == worst


def test_varlen_bound_at_a_2048_token_bucket_of_8_sequences():
    """71 chunks (seven one-token sequences and one of the rest fill them all), where the step-major
    layout bounded per step for every composition of the bucket needs 176."""
    chunk, num_tokens, max_seqs = chunked.GDN_CHUNK_SIZE, 2048, 8
    lengths = [1] * 7 + [2041]
    assert varlen_chunk_bound(num_tokens, max_seqs, chunk) == _real_chunks(lengths, chunk) == 71
    per_step = [min(max_seqs, num_tokens // (j * chunk + 1)) for j in range(num_tokens // chunk)]
    assert sum(per_step) == 176
    layout = ops.PrefillStep.build(_bounds(lengths, max_seqs), torch.arange(max_seqs),
                                   torch.zeros(max_seqs, dtype=torch.bool), num_tokens).chunks
    assert layout.num_chunks == 71 and not bool(layout.is_padding.view(71, chunk)[:, 0].any())


# (lengths, padding tokens after them): one-token sequences, lengths around the chunk, an empty
# sequence, a bucket exactly full; every sequence continues from a non-zero state.
C = chunked.GDN_CHUNK_SIZE
SCAN_CASES = {
    "awkward-lengths": ([1, C - 1, 0, C + 1, 2 * C, 5], 7),
    "bucket-exactly-full": ([C + 3, 1, 2 * C - 4], 0),
    "one-sequence": ([3 * C + 2], 3),
}


@pytest.mark.parametrize("lengths, pad", SCAN_CASES.values(), ids=SCAN_CASES.keys())
def test_varlen_scan_matches_the_float64_recurrence_and_the_exact_plan(lengths, pad):
    x = make_gdn_inputs(lengths + [pad], 2, 4, 16, 24, min_g=-2.0)
    num_tokens, max_seqs = sum(lengths) + pad, len(lengths) + 2
    bounds = _bounds(lengths, max_seqs)
    initial = torch.cat([x["initial_state"][:len(lengths)], torch.randn(2, *x["initial_state"].shape[1:])])
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, initial, 16 ** -0.5, True)
    layout = VarlenChunkLayout(bounds, C, num_tokens, varlen_chunk_bound(num_tokens, max_seqs, C))
    o, state = chunked.gdn_prefill(*args, layout=layout)
    o_exact, state_exact = chunked.gdn_prefill(*args, layout=ChunkLayout(bounds, C, "cpu"))
    real = sum(lengths)
    o_ref, state_ref = gdn_recurrence(x["q"][:real], x["k"][:real], x["v"][:real], x["g"][:real], x["beta"][:real],
                                      bounds, initial_state=initial, use_qk_l2norm=True)
    assert_matches(o[:real], o_ref, torch.float32, "o")
    assert_matches(state, state_ref, torch.float32, "final_state")
    torch.testing.assert_close(o[:real], o_exact[:real], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state, state_exact, rtol=1e-5, atol=1e-6)
    assert torch.equal(state[len(lengths):], initial[len(lengths):])  # padding sequences keep their state


def test_exact_plan_has_one_chunk_per_real_chunk():
    lengths = [1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 2, 0]
    bounds = _bounds(lengths, len(lengths))
    layout = ChunkLayout(bounds, CHUNK, "cpu")
    assert layout.num_chunks == sum((n + CHUNK - 1) // CHUNK for n in lengths)
    assert layout.steps == [(0, 5), (5, 2), (7, 1), (8, 1)]
    _check_covers(layout, lengths, sum(lengths))
    # The host-side padding flags mark exactly the chunks that hold padding slots.
    slots = layout.is_padding.view(-1, CHUNK).any(-1).tolist()
    assert list(layout.padded_chunks) == slots


def test_longest_first_is_the_stable_descending_order():
    gen = torch.Generator().manual_seed(0)
    for size in (1, 2, 5, 9, 33):
        for _ in range(20):
            counts = torch.randint(0, 4, (size,), generator=gen)
            assert torch.equal(longest_first(counts), torch.argsort(counts, descending=True, stable=True)), counts


def test_prefill_step_maps_tokens_to_their_sequences():
    bounds = torch.tensor([0, 3, 3, 7, 8, 8], dtype=torch.int32)
    step = ops.PrefillStep.build(bounds, torch.arange(5), torch.zeros(5, dtype=torch.bool), 11)
    assert step.token_seq.tolist() == [0, 0, 0, 2, 2, 2, 2, 3, 5, 5, 5]
    assert step.is_real_token.tolist() == [True] * 8 + [False] * 3
