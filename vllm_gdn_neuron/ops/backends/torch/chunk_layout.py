"""Packing varlen sequences into fixed-size chunks, ordered for a chunk scan.

Every sequence is cut into chunks of C tokens, the last one zero-padded (k = v = 0, beta = 0,
g = 0 is exact). Two layouts, both built by static-shape tensor arithmetic from the
boundaries once their chunk count is fixed (no host read, no sort: the same code runs eagerly
and inside ``torch.compile(fullgraph=True)``):

- ``ChunkLayout`` (step-major, for a tight plan read on the host): sequences are ranked by
  their number of chunks, longest first, and chunks are stored step-major: all first chunks,
  then all second chunks, ... At scan step j the sequences that may still have a chunk are
  ranks ``0 .. w_j - 1`` and their chunks are the contiguous range ``offset_j .. offset_j +
  w_j``, so the scan works on slices. The step widths ``w_j`` are a ``ChunkPlan``;
  ``ChunkPlan.exact`` reads the lengths on the host and gives each step exactly the
  sequences that have a chunk there.
- ``VarlenChunkLayout`` (token order, trace-safe): the sequences' chunks end to end in token
  order, scanned one chunk per step by one lane whose state restarts at each sequence's first
  chunk and is kept at its last. Its chunk count is the bucket's bound
  ``varlen_chunk_bound(T, S, C) = (T + min(S, T) * (C - 1)) // C``: the most chunks any
  composition of at most S sequences in T tokens has, so a full worst-case bucket uses every
  chunk (T = 2048, S = 8, C = 32: 71 chunks, where a step-major layout bounded per step for
  every composition needs 176).
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ChunkPlan:
    """The static shape of a chunk layout.

    Attributes:
        num_tokens: T, the tokens of the packed input (padding tokens after the last sequence
            included; they belong to no chunk).
        chunk_size: C.
        widths: ``(w_0, w_1, ...)`` ranks scanned at each step.
        padded: per chunk, whether it may hold padding slots (host-side knowledge that lets the
            gather skip zeroing blocks without padding); None means every chunk may.
    """

    num_tokens: int
    chunk_size: int
    widths: tuple
    padded: tuple | None = None

    @property
    def num_chunks(self):
        return sum(self.widths)

    @classmethod
    def exact(cls, cu_seqlens, chunk_size, num_tokens=None):
        """The tight plan of these boundaries (host read).

        Args:
            cu_seqlens: ``[N + 1]`` int64 CPU tensor.
            num_tokens: T, or None for ``cu_seqlens[-1]`` (no padding tokens).
        """
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        chunks = sorted(((n + chunk_size - 1) // chunk_size for n in lengths), reverse=True)
        steps = chunks[0] if chunks else 0
        widths = tuple(sum(1 for c in chunks if c > j) for j in range(steps))
        by_rank = sorted(lengths, key=lambda n: -((n + chunk_size - 1) // chunk_size))
        padded = tuple(by_rank[rank] < (j + 1) * chunk_size for j, width in enumerate(widths)
                       for rank in range(width))
        return cls(int(cu_seqlens[-1]) if num_tokens is None else num_tokens, chunk_size, widths, padded)


def longest_first(counts):
    """The stable descending order of ``counts [N]`` (int64): ``[N]`` index of each rank.

    By pairwise comparisons and sums only (no sort), which any tracer and compiler lowers:
    the rank of i is the number of entries that go before it.
    """
    index = torch.arange(counts.shape[0], device=counts.device)
    ahead = (counts[None, :] > counts[:, None]) | ((counts[None, :] == counts[:, None]) & (index[None, :] < index[:, None]))
    rank = ahead.sum(1)
    return ((rank[None, :] == index[:, None]) * index[None, :]).sum(1)


def varlen_chunk_bound(num_tokens, max_seqs, chunk_size):
    """The most chunks of ``chunk_size`` that at most ``max_seqs`` sequences of ``num_tokens``
    tokens in all can have: each sequence of n tokens has ``ceil(n / C) <= (n + C - 1) / C``
    chunks, so k sequences have at most ``(T + k (C - 1)) // C``, reached by k - 1 one-token
    sequences beside one of the rest; k = min(S, T)."""
    return (num_tokens + min(max_seqs, num_tokens) * (chunk_size - 1)) // chunk_size


class _ChunkSlots:
    """Where each chunk slot's token comes from, and the block-wise gather / scatter over them.

    Attributes (set by the layouts):
        num_tokens: T.
        chunk_size: C.
        steps: ``[(offset_j, w_j), ...]`` chunk range of each scan step.
        num_chunks: M, the total number of chunks.
        num_seqs: N, the sequences.
        token_index: ``[M * C]`` token of each chunk slot; padding slots point at T.
        source_index: ``[M * C]`` token_index with padding slots pointing at token 0 (read,
            then zeroed), so that gathers read the caller's tensors without a padded copy.
        is_padding: ``[M * C]`` bool, the padding slots.
        padded_chunks: per chunk, whether it may hold padding slots (a Python tuple), or None
            for all.
    """

    def _set_slots(self, start, end, chunk_size, num_tokens):
        """Slots of chunks starting at token ``start [M]`` of sequences ending at ``end [M]``."""
        slot = start[:, None] + torch.arange(chunk_size, device=start.device)
        self.is_padding = (slot >= end[:, None]).reshape(-1)
        self.token_index = slot.reshape(-1).masked_fill(self.is_padding, num_tokens)
        self.source_index = self.token_index.masked_fill(self.is_padding, 0)

    def blocks(self, min_chunks):
        """Consecutive scan steps grouped into blocks of at least ``min_chunks`` chunks.

        Yields:
            ``(lo, hi, steps)``: the block's chunk range and its ``(offset, n)`` steps.
        """
        lo, steps = 0, []
        for offset, active in self.steps:
            steps.append((offset, active))
            if offset + active - lo >= min_chunks:
                yield lo, offset + active, steps
                lo, steps = offset + active, []
        if steps:
            yield lo, self.num_chunks, steps

    def gather(self, x, lo, hi):
        """Chunks ``lo .. hi`` of ``x [T, H, *rest]`` -> float32 ``[hi - lo, H, C, *rest]``, padding zero."""
        slots = slice(lo * self.chunk_size, hi * self.chunk_size)
        rows = x.index_select(0, self.source_index[slots])
        if self.padded_chunks is None or any(self.padded_chunks[lo:hi]):
            pad = self.is_padding[slots].view((-1,) + (1,) * (rows.dim() - 1))
            rows.masked_fill_(pad, 0)
        chunks = rows.unflatten(0, (hi - lo, self.chunk_size)).transpose(1, 2)
        # A contiguous copy, not empty().copy_(): torch-mlir lowers an uninitialised buffer to
        # tensor.empty, which XLA does not take.
        return chunks.to(torch.float32, memory_format=torch.contiguous_format)

    def scatter(self, out, chunks, lo, hi):
        """Write chunks ``lo .. hi`` (``[hi - lo, H, C, D]``) into ``out [T + 1, H, D]``."""
        index = self.token_index[lo * self.chunk_size:hi * self.chunk_size]
        rows = chunks.transpose(1, 2).to(out.dtype, memory_format=torch.contiguous_format)
        out.index_copy_(0, index, rows.flatten(0, 1))


class ChunkLayout(_ChunkSlots):
    """The step-major layout of a ``ChunkPlan``.

    Args:
        cu_seqlens: ``[N + 1]`` int64 sequence boundaries; a CPU tensor when ``plan`` is None
            (the exact plan is read from it), else on any device (never read on the host).
            Trailing boundaries may repeat (empty sequences) and end before T.
        chunk_size: C.
        device: where the gather indices live (the device of the data).
        plan: a ``ChunkPlan`` for ``chunk_size``, or None for ``ChunkPlan.exact(cu_seqlens)``.

    Attributes (besides those of ``_ChunkSlots``):
        order: ``[N]`` sequence index of each rank (longest first).
    """

    def __init__(self, cu_seqlens, chunk_size, device, plan=None):
        if plan is None:
            plan = ChunkPlan.exact(cu_seqlens, chunk_size)
        bounds = cu_seqlens.to(torch.int64)
        if bounds.device != device:
            bounds = bounds.to(device)
        self.num_tokens = plan.num_tokens
        self.chunk_size = chunk_size
        self.padded_chunks = plan.padded
        lengths = bounds[1:] - bounds[:-1]
        chunks_per_seq = torch.div(lengths + chunk_size - 1, chunk_size, rounding_mode="trunc")  # lengths >= 0
        self.order = longest_first(chunks_per_seq)
        self.num_seqs = self.order.shape[0]
        self.steps, offset, ranks, step_of_row = [], 0, [], []
        for step, width in enumerate(plan.widths):
            self.steps.append((offset, width))
            offset += width
            ranks.extend(range(width))
            step_of_row.extend([step] * width)
        self.num_chunks = offset
        rank = torch.tensor(ranks, dtype=torch.int64, device=device)
        step = torch.tensor(step_of_row, dtype=torch.int64, device=device)
        seq = self.order.index_select(0, rank)
        self._set_slots(bounds.index_select(0, seq) + step * chunk_size, bounds.index_select(0, seq + 1),
                        chunk_size, self.num_tokens)


class VarlenChunkLayout(_ChunkSlots):
    """The sequences' chunks end to end in token order, one chunk per scan step.

    Chunk m holds chunk j of sequence ``chunk_seq[m]``, tokens ``cu_seqlens[seq] + j C`` on;
    chunks past the last real one are all padding (``chunk_seq`` = N). The scan runs one lane:
    at a chunk that ``starts`` a sequence the lane takes that sequence's initial state, and
    after a chunk that ``ends`` one the lane is that sequence's final state.

    Args:
        cu_seqlens: ``[N + 1]`` int64 boundaries, non-decreasing, on any device (never read on
            the host); empty sequences (repeated boundaries) have no chunk.
        chunk_size: C.
        num_tokens: T (tokens from ``cu_seqlens[N]`` on are padding).
        num_chunks: M, at least the real chunk count (``varlen_chunk_bound`` for a bucket).

    Attributes (besides those of ``_ChunkSlots``):
        chunk_seq: ``[M]`` int64 sequence of each chunk (N for padding chunks).
        starts: ``[M]`` bool, the chunk is its sequence's first.
        final_index: ``[M]`` int64 sequence whose final state the lane holds after the chunk,
            N where it holds none (the chunk ends no sequence).
    """

    def __init__(self, cu_seqlens, chunk_size, num_tokens, num_chunks):
        bounds = cu_seqlens.to(torch.int64)
        device = bounds.device
        num_seqs = bounds.shape[0] - 1
        self.num_seqs = num_seqs
        self.num_tokens = num_tokens
        self.chunk_size = chunk_size
        self.num_chunks = num_chunks
        self.padded_chunks = None
        self.steps = [(m, 1) for m in range(num_chunks)]
        # Non-negative lengths: truncation is floor, without the float divide torch-mlir makes of `//`.
        per_seq = torch.div(bounds[1:] - bounds[:-1] + chunk_size - 1, chunk_size, rounding_mode="trunc")
        last = per_seq.cumsum(0)
        # Sequence of chunk m = how many sequences end at or before it (a cumsum of end marks).
        ends = torch.zeros(num_chunks + 1, dtype=torch.int64, device=device)
        ends.index_add_(0, last.clamp(max=num_chunks), torch.ones_like(last))
        seq = ends.cumsum(0)[:num_chunks]
        real = seq < num_seqs
        at = seq.clamp(max=max(num_seqs - 1, 0))
        chunk = torch.arange(num_chunks, dtype=torch.int64, device=device) - (last - per_seq).index_select(0, at)
        self.chunk_seq = seq
        self.starts = real & (chunk == 0)
        self.final_index = torch.where(real & (chunk == per_seq.index_select(0, at) - 1), seq, num_seqs)
        start = bounds.index_select(0, at) + chunk * chunk_size
        end = torch.where(real, bounds.index_select(0, at + 1), start)
        self._set_slots(start, end, chunk_size, num_tokens)
