"""Packing varlen sequences into fixed-size chunks, ordered for a batched chunk scan.

Every sequence is cut into chunks of C tokens, the last one zero-padded (k = v = 0, beta = 0,
g = 0 is exact). Sequences are ranked by their number of chunks, longest first, and chunks are
stored step-major: all first chunks, then all second chunks, ... At scan step j the sequences
that still have a chunk are ranks ``0 .. n_j - 1`` and their chunks are the contiguous range
``offset_j .. offset_j + n_j``, so the scan works on slices, never on gathers.
"""

import torch


class ChunkLayout:
    """Where each chunk's tokens come from.

    Args:
        cu_seqlens: ``[N + 1]`` int64 CPU sequence boundaries.
        chunk_size: C.
        device: where the gather indices live (the device of the data).

    Attributes:
        num_tokens: T.
        order: ``[N]`` sequence index of each rank (longest first).
        steps: ``[(offset_j, n_j), ...]`` chunk range of each scan step.
        num_chunks: M, the total number of chunks.
        token_index: ``[M * C]`` token of each chunk slot; padding slots point at T.
        source_index: ``[M * C]`` token_index with padding slots pointing at token 0 (read,
            then zeroed), so that gathers read the caller's tensors without a padded copy.
        is_padding: ``[M * C]`` bool, the padding slots.
        padded_chunks: ``[M]`` bool on the CPU, the chunks with padding slots (the last chunk of
            each sequence whose length is not a multiple of C).
    """

    def __init__(self, cu_seqlens, chunk_size, device):
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        chunks_per_seq = (lengths + chunk_size - 1) // chunk_size
        self.num_tokens = int(cu_seqlens[-1])
        self.chunk_size = chunk_size
        self.order = torch.argsort(chunks_per_seq, descending=True, stable=True)
        ranked_chunks = chunks_per_seq[self.order]
        starts, ends, self.steps, offset = [], [], [], 0
        for step in range(int(ranked_chunks[0]) if ranked_chunks.numel() else 0):
            active = int((ranked_chunks > step).sum())
            seqs = self.order[:active]
            starts.append(cu_seqlens[seqs] + step * chunk_size)
            ends.append(cu_seqlens[seqs + 1])
            self.steps.append((offset, active))
            offset += active
        self.num_chunks = offset
        if offset == 0:
            self.token_index = torch.zeros(0, dtype=torch.int64, device=device)
            self.padded_chunks = torch.zeros(0, dtype=torch.bool)
        else:
            start, end = torch.cat(starts), torch.cat(ends)
            self.padded_chunks = end - start < chunk_size
            slot = start[:, None] + torch.arange(chunk_size)
            self.token_index = torch.where(slot < end[:, None], slot, self.num_tokens).reshape(-1).to(device)
        self.is_padding = self.token_index == self.num_tokens
        self.source_index = self.token_index.masked_fill(self.is_padding, 0)
        self.order = self.order.to(device)

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
        if self.padded_chunks[lo:hi].any():
            rows[self.is_padding[slots]] = 0
        chunks = rows.unflatten(0, (hi - lo, self.chunk_size)).transpose(1, 2)
        return torch.empty(chunks.shape, dtype=torch.float32, device=chunks.device).copy_(chunks)

    def scatter(self, out, chunks, lo, hi):
        """Write chunks ``lo .. hi`` (``[hi - lo, H, C, D]``) into ``out [T + 1, H, D]``."""
        index = self.token_index[lo * self.chunk_size:hi * self.chunk_size]
        rows = torch.empty(chunks.shape[0], chunks.shape[2], *out.shape[1:], dtype=out.dtype, device=out.device)
        out.index_copy_(0, index, rows.copy_(chunks.transpose(1, 2)).flatten(0, 1))
