"""Packing varlen sequences into fixed-size chunks, ordered for a batched chunk scan.

Every sequence is cut into chunks of C tokens, the last one zero-padded (k = v = 0, beta = 0,
g = 0 is exact). Sequences are ranked by their number of chunks, longest first, and chunks are
stored step-major: all first chunks, then all second chunks, ... At scan step j the sequences
that may still have a chunk are ranks ``0 .. w_j - 1`` and their chunks are the contiguous range
``offset_j .. offset_j + w_j``, so the scan works on slices, never on gathers.

The step widths ``w_j`` are a ``ChunkPlan``: Python ints fixed before the layout is built.
``ChunkPlan.exact`` reads the sequence lengths on the host and gives each step exactly the
sequences that have a chunk there (no wasted chunk); ``ChunkPlan.bucket`` needs only the bucket's
token count T and sequence count S and bounds every width (at step j at most
``min(S, T // (j * C + 1))`` sequences can still have a chunk), so one plan serves every batch
composition of the bucket. Given a plan, the layout itself is built by static-shape tensor
arithmetic on the device (no host read, no sort): the same code runs eagerly and inside
``torch.compile(fullgraph=True)``. A rank with no chunk at a step gets an all-padding chunk,
which leaves its state exactly unchanged.
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

    @classmethod
    def bucket(cls, num_tokens, max_seqs, chunk_size):
        """The plan that fits every composition of at most ``max_seqs`` sequences in ``num_tokens``."""
        steps = (num_tokens + chunk_size - 1) // chunk_size
        widths = tuple(min(max_seqs, num_tokens // (j * chunk_size + 1)) for j in range(steps))
        return cls(num_tokens, chunk_size, widths if max_seqs else ())


def longest_first(counts):
    """The stable descending order of ``counts [N]`` (int64): ``[N]`` index of each rank.

    By pairwise comparisons and sums only (no sort), which any tracer and compiler lowers:
    the rank of i is the number of entries that go before it.
    """
    index = torch.arange(counts.shape[0], device=counts.device)
    ahead = (counts[None, :] > counts[:, None]) | ((counts[None, :] == counts[:, None]) & (index[None, :] < index[:, None]))
    rank = ahead.sum(1)
    return ((rank[None, :] == index[:, None]) * index[None, :]).sum(1)


class ChunkLayout:
    """Where each chunk's tokens come from.

    Args:
        cu_seqlens: ``[N + 1]`` int64 sequence boundaries; a CPU tensor when ``plan`` is None
            (the exact plan is read from it), else on any device (never read on the host). With a
            bucket plan, trailing boundaries may repeat (empty sequences) and end before T.
        chunk_size: C.
        device: where the gather indices live (the device of the data).
        plan: a ``ChunkPlan`` for ``chunk_size``, or None for ``ChunkPlan.exact(cu_seqlens)``.

    Attributes:
        num_tokens: T.
        order: ``[N]`` sequence index of each rank (longest first).
        steps: ``[(offset_j, w_j), ...]`` chunk range of each scan step.
        num_chunks: M, the total number of chunks.
        token_index: ``[M * C]`` token of each chunk slot; padding slots point at T.
        source_index: ``[M * C]`` token_index with padding slots pointing at token 0 (read,
            then zeroed), so that gathers read the caller's tensors without a padded copy.
        is_padding: ``[M * C]`` bool, the padding slots.
        padded_chunks: per chunk, whether it may hold padding slots (a Python tuple), or None
            for all.
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
        chunks_per_seq = (lengths + chunk_size - 1) // chunk_size
        self.order = longest_first(chunks_per_seq)
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
        start = bounds.index_select(0, seq) + step * chunk_size
        end = bounds.index_select(0, seq + 1)
        slot = start[:, None] + torch.arange(chunk_size, device=device)
        self.is_padding = (slot >= end[:, None]).reshape(-1)
        self.token_index = slot.reshape(-1).masked_fill(self.is_padding, self.num_tokens)
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
        return torch.empty(chunks.shape, dtype=torch.float32, device=chunks.device).copy_(chunks)

    def scatter(self, out, chunks, lo, hi):
        """Write chunks ``lo .. hi`` (``[hi - lo, H, C, D]``) into ``out [T + 1, H, D]``."""
        index = self.token_index[lo * self.chunk_size:hi * self.chunk_size]
        rows = torch.empty(chunks.shape[0], chunks.shape[2], *out.shape[1:], dtype=out.dtype, device=out.device)
        out.index_copy_(0, index, rows.copy_(chunks.transpose(1, 2)).flatten(0, 1))
