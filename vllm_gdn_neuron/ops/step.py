"""Per-engine-step metadata of the paged GDN ops, built once and shared by every GDN layer.

The builders use static-shape tensor arithmetic only (no host read unless asked for with
``exact_plan=True``), so the same code runs eagerly and inside ``torch.compile(fullgraph=True)``:
shapes depend on the bucket (rows N, tokens T, sequences S), values on the batch composition.
A prefill bucket packs any number of sequences up to S whose lengths sum to at most T; its
trace-safe chunk layout (``VarlenChunkLayout``) has the bucket's ``varlen_chunk_bound(T, S, C)``
chunks, the most that any such composition has.

Padding: decode rows, verify rows and prefill sequences that carry no request are routed to the
caller's reserved pad page; prefill tokens at or after ``query_start_loc[S]`` belong to no sequence. The
ops give padding rows and tokens zero outputs and never touch a live page on their behalf.
Values are validated on the host, once per step, by ``vllm_gdn_neuron.ops.check_step``.
"""

import functools
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

    @functools.cached_property
    def all_real(self) -> bool:
        """No row is padding: one host read of ``is_real``, made on first use and kept for the
        step's other layers (eager paths only; a traced op masks instead)."""
        return bool(self.is_real.all())


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


@dataclass
class VerifyStep:
    """Verify rows of one step (speculative decoding): each row carries its last token and up to
    W - 1 draft tokens, packed end to end, and owns W state pages, one per draft position.

    The state a row starts from is the one after its last accepted token of the previous step,
    on page ``pages[r, num_accepted[r] - 1]``; the state after its token ``t`` goes to
    ``pages[r, t]`` (vLLM's GatedDeltaNet speculative layout), so a rejected draft leaves no
    trace in the state the next step reads.

    Attributes:
        pages: ``[R, W]`` int64 pages of each row's draft positions (padding rows: the pad page).
        source_pages: ``[R]`` int64 page each row's state is read from.
        write_pages: ``[R, W]`` int64 page the state after each (row, position) goes to: ``pages``
            where the position carries a token, else the pad page.
        is_real: ``[R, W]`` bool, the (row, position) pairs that carry a token.
        token_index: ``[R, W]`` int64 packed token of each (row, position) (0 where none).
        token_slot: ``[T]`` int64 flat ``r * W + t`` position of each packed token (0 for padding).
        is_real_token: ``[T]`` bool, the tokens of a row.
        query_start_loc: ``[R + 1]`` int64 row boundaries in the packed tokens.
        num_accepted: ``[R]`` int64, as given (``check_step`` holds it in ``[1, W]``): the row's state
            is on ``pages[r, num_accepted[r] - 1]``.
    """

    pages: torch.Tensor
    source_pages: torch.Tensor
    write_pages: torch.Tensor
    is_real: torch.Tensor
    token_index: torch.Tensor
    token_slot: torch.Tensor
    is_real_token: torch.Tensor
    query_start_loc: torch.Tensor
    num_accepted: torch.Tensor

    @classmethod
    def build(cls, query_start_loc, pages, num_accepted, num_tokens, pad_page):
        """Args:
            query_start_loc: ``[R + 1]`` int32 or int64 row boundaries in the packed tokens, from 0,
                each row 1..W tokens (padding rows 0), last <= T.
            pages: ``[R, W]`` int32 or int64 (W = 1 + the speculative tokens).
            num_accepted: ``[R]`` int32 or int64 in ``[1, W]``: tokens of the row's previous step
                whose state is kept (1 after a prefill or a step with every draft rejected).
            num_tokens: T (a Python int), the packed tokens of the ops' inputs.
            pad_page: the reserved page positions without a token write to.
        """
        num_rows, width = check_tensor("pages", pages, (("R", None), ("W", None)), INDEX_DTYPES)
        check_tensor("query_start_loc", query_start_loc, (("R+1", num_rows + 1),), INDEX_DTYPES)
        check_tensor("num_accepted", num_accepted, (("R", num_rows),), INDEX_DTYPES)
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens: expected an int >= 0, got {num_tokens!r}")
        if isinstance(pad_page, bool) or not isinstance(pad_page, int):
            raise ValueError(f"pad_page: expected an int, got {pad_page!r}")
        bounds = query_start_loc.to(torch.int64)
        pages = pages.to(torch.int64)
        device = bounds.device
        positions = torch.arange(width, dtype=torch.int64, device=device)
        is_real = positions < (bounds[1:] - bounds[:-1])[:, None]
        token_index = torch.where(is_real, bounds[:-1, None] + positions, 0)
        rows = torch.arange(num_rows, dtype=torch.int64, device=device)
        # Row of packed token t = how many rows end at or before t (a cumsum of end marks).
        ends = torch.zeros(num_tokens + 1, dtype=torch.int64, device=device)
        ends.index_add_(0, bounds[1:].clamp(max=num_tokens), torch.ones_like(bounds[1:]))
        token_row = ends.cumsum(0)[:num_tokens].clamp(max=max(num_rows - 1, 0))
        tokens = torch.arange(num_tokens, dtype=torch.int64, device=device)
        is_real_token = tokens < bounds[-1]
        slot = token_row * width + (tokens - bounds.index_select(0, token_row)) if num_rows else tokens
        token_slot = torch.where(is_real_token, slot, 0)
        accepted = num_accepted.to(torch.int64)
        source_pages = pages[rows, accepted.clamp(1, max(width, 1)) - 1]
        write_pages = torch.where(is_real, pages, pad_page)
        return cls(pages, source_pages, write_pages, is_real, token_index, token_slot, is_real_token, bounds, accepted)

    @property
    def num_rows(self):
        return self.pages.shape[0]

    @property
    def width(self):
        """W: the positions of a row (1 + the speculative tokens)."""
        return self.pages.shape[1]

    @property
    def num_tokens(self):
        return self.token_slot.shape[0]
