"""Per-engine-step metadata of the paged GDN ops, built once and shared by every GDN layer.

The builders use static-shape tensor arithmetic only (no host read unless asked for with
``exact_plan=True``), so the same code runs eagerly and inside ``torch.compile(fullgraph=True)``:
shapes depend on the bucket (rows N, tokens T, sequences S), values on the batch composition.
A prefill bucket packs any number of sequences up to S whose lengths sum to at most T; its
trace-safe chunk layout (``VarlenChunkLayout``) has the bucket's ``varlen_chunk_bound(T, S, C)``
chunks, the most that any such composition has.

Padding: decode rows and prefill sequences that carry no request are routed to the caller's
reserved pad page; prefill tokens at or after ``query_start_loc[S]`` belong to no sequence. The
ops give padding rows and tokens zero outputs and never touch a live page on their behalf.
Values are validated on the host, once per step, by ``vllm_gdn_neuron.ops.check_step``.
"""

from dataclasses import dataclass

import torch

from .backends.torch.chunk_layout import ChunkLayout, ChunkPlan, VarlenChunkLayout, varlen_chunk_bound
from .backends.torch.chunked import GDN_CHUNK_SIZE
from .validation import INDEX_DTYPES, check_tensor


@dataclass
class DecodeStep:
    """Decode rows of one step: one token per row.

    Attributes:
        pages: ``[N]`` int64 cache page of each row (padding rows: the pad page).
        is_real: ``[N]`` bool, the rows that carry a request.
    """

    pages: torch.Tensor
    is_real: torch.Tensor

    @classmethod
    def build(cls, pages, pad_page=None):
        """Args:
            pages: ``[N]`` int32 or int64 cache page of each row.
            pad_page: the reserved page of padding rows, or None when no row is padding.
        """
        check_tensor("pages", pages, (("N", None),), INDEX_DTYPES)
        pages = pages.to(torch.int64)
        is_real = torch.ones_like(pages, dtype=torch.bool) if pad_page is None else pages != pad_page
        return cls(pages, is_real)

    @property
    def num_rows(self):
        return self.pages.shape[0]


@dataclass
class PrefillStep:
    """Prefill sequences of one step, packed end to end in a (bucket-padded) token range.

    Attributes:
        query_start_loc: ``[S + 1]`` int64 boundaries; tokens from ``query_start_loc[S]`` on are
            padding; padding sequences have length 0.
        pages: ``[S]`` int64 cache page of each sequence (padding sequences: the pad page).
        has_state: ``[S]`` bool, start from the page's state (else from zeros).
        num_tokens: T, the token count of the ops' inputs.
        token_seq: ``[T]`` int64 sequence of each token, S for padding tokens.
        is_real_token: ``[T]`` bool, the tokens of a sequence.
        chunks: the chunk layout of the GDN chunked scan (a ``VarlenChunkLayout`` of the bucket,
            or the exact ``ChunkLayout`` of the host values).
    """

    query_start_loc: torch.Tensor
    pages: torch.Tensor
    has_state: torch.Tensor
    num_tokens: int
    token_seq: torch.Tensor
    is_real_token: torch.Tensor
    chunks: ChunkLayout | VarlenChunkLayout

    @classmethod
    def build(cls, query_start_loc, pages, has_state, num_tokens, *, exact_plan=False):
        """Args:
            query_start_loc: ``[S + 1]`` int32 or int64, from 0, non-decreasing, last <= T.
            pages: ``[S]`` int32 or int64.
            has_state: ``[S]`` bool.
            num_tokens: T (a Python int: the bucket's prefill token count).
            exact_plan: plan the chunk scan from the host values of ``query_start_loc`` (tight;
                eager callers only) instead of from the bucket (T, S) (trace-safe: a
                ``VarlenChunkLayout`` of ``varlen_chunk_bound(T, S, C)`` chunks).
        """
        (num_seqs,) = check_tensor("pages", pages, (("S", None),), INDEX_DTYPES)
        check_tensor("query_start_loc", query_start_loc, (("S+1", num_seqs + 1),), INDEX_DTYPES)
        check_tensor("has_state", has_state, (("S", num_seqs),), (torch.bool,))
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens: expected an int >= 0, got {num_tokens!r}")
        bounds = query_start_loc.to(torch.int64)
        device = bounds.device
        tokens = torch.arange(num_tokens, dtype=torch.int64, device=device)
        # Sequence of token t = how many sequences end at or before t (a cumsum of end marks).
        ends = torch.zeros(num_tokens + 1, dtype=torch.int64, device=device)
        ends.index_add_(0, bounds[1:].clamp(max=num_tokens), torch.ones_like(bounds[1:]))
        token_seq = ends.cumsum(0)[:num_tokens]
        if exact_plan:
            plan = ChunkPlan.exact(bounds.cpu(), GDN_CHUNK_SIZE, num_tokens)
            chunks = ChunkLayout(bounds, GDN_CHUNK_SIZE, device, plan)
        else:
            chunks = VarlenChunkLayout(bounds, GDN_CHUNK_SIZE, num_tokens,
                                       varlen_chunk_bound(num_tokens, num_seqs, GDN_CHUNK_SIZE))
        return cls(bounds, pages.to(torch.int64), has_state, num_tokens, token_seq, tokens < bounds[-1], chunks)

    @property
    def num_seqs(self):
        return self.pages.shape[0]
