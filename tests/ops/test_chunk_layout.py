"""Chunk plans and layouts: the bucket plan fits every composition of its bucket, the exact plan
wastes no chunk, and either layout places every real token in exactly one chunk slot."""

import random

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.ops.backends.torch.chunk_layout import ChunkLayout, ChunkPlan, longest_first

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


@pytest.mark.parametrize("num_tokens, max_seqs", [(40, 3), (17, 5), (64, 1), (8, 8)])
def test_bucket_plan_fits_every_composition(num_tokens, max_seqs):
    plan = ChunkPlan.bucket(num_tokens, max_seqs, CHUNK)
    for lengths in _compositions(num_tokens, max_seqs, count=50):
        bounds = _bounds(lengths, max_seqs)
        exact = ChunkPlan.exact(bounds, CHUNK, num_tokens)
        assert len(exact.widths) <= len(plan.widths)
        assert all(w <= b for w, b in zip(exact.widths, plan.widths)), (lengths, exact.widths, plan.widths)
        _check_covers(ChunkLayout(bounds, CHUNK, "cpu", plan), lengths, num_tokens)


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


def test_bucket_plan_bound_is_tight_at_each_step():
    # Step j can hold min(S, T // (j*C + 1)) sequences, and that many fit: T // (j*C + 1) of length j*C + 1.
    num_tokens, max_seqs = 40, 6
    plan = ChunkPlan.bucket(num_tokens, max_seqs, CHUNK)
    for step, width in enumerate(plan.widths):
        lengths = [step * CHUNK + 1] * width
        exact = ChunkPlan.exact(_bounds(lengths, max_seqs), CHUNK, num_tokens)
        assert exact.widths[step] == width


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
