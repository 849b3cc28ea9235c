"""Gated full attention over vllm-neuron's page-major KV cache (static shapes, no host reads).

The bound cache of one layer is ``kv_pages [P, 2, Hkv, B, D]`` (page p = block p; K then V;
B = block size), with the runner's two reserved pages at the end (:mod:`.contract`).

A step is either a prefill bucket of T tokens holding the prompts (or prompt chunks) of R
block-table rows end to end (:mod:`.packing`; the pinned runner sends one, R = 1), or R
decode rows of W tokens each (one; a speculative verify step's last token and N drafts,
W = 1 + N, :mod:`.spec_decode`); the runner's ``block_table_tensor [R, max_blocks]`` names
each request's pages. Every token attends to

- the request's cached tokens before this step (positions ``< first position of the
  request in this step``), gathered from its pages, and
- this step's tokens of the same request up to itself (causal), taken directly from the
  step's own K and V,

so the attention never reads a position this step writes, in whatever order a compiler
places the page write and the page gather. Entries past a request's context, padding
rows and unused block-table entries read the zero page and are selected away with
``torch.where`` (a recycled page may hold another group's bytes, NaNs included).
"""

import torch
from torch import nn

from vllm_gdn_neuron.model.attention import GatedAttentionMath, check_attention_heads
from vllm_gdn_neuron.shells.neuron.cache import BoundPages
from vllm_gdn_neuron.shells.neuron.contract import reserved_pages
from vllm_gdn_neuron.shells.neuron.kv_spec import LayerSpec
from vllm_gdn_neuron.shells.neuron.packing import prefill_rows
from vllm_gdn_neuron.shells.neuron.step import NeuronStep


class NeuronGatedAttention(GatedAttentionMath):
    """Qwen3.5 gated attention with plain (per-rank) projection weights.

    Args:
        config: Hugging Face text config.
        layer_name: the key of this layer in ``attn_metadata`` and the bound caches.
        tp_group: the tensor-parallel group (``world_size``, ``rank_in_group``, ``all_reduce``).
        dtype: the model dtype (weights and KV cache).

    Parameters (rows are this rank's heads; the merged projection of
    :mod:`vllm_gdn_neuron.model.parameters`, as the vLLM shell holds it): ``qkv_proj.weight
    [Hq * 2 * D + 2 * Hkv * D, H]`` (q part: per head, query rows then gate rows; then k, v
    parts), ``o_proj.weight [H, Hq * D]``, ``q_norm``, ``k_norm``.
    """

    def __init__(self, config, layer_name: str, tp_group, dtype: torch.dtype) -> None:
        tp = tp_group.world_size
        check_attention_heads(config, tp)
        heads, kv_heads = config.num_attention_heads // tp, max(1, config.num_key_value_heads // tp)
        super().__init__(config, heads, kv_heads)
        self.layer_name = layer_name
        self.tp_group = tp_group
        self.dtype = dtype
        d, hidden = self.head_dim, config.hidden_size
        self.qkv_proj = nn.Linear(hidden, (heads * 2 + kv_heads * 2) * d, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(heads * d, hidden, bias=False, dtype=dtype)
        self.scaling = d**-0.5
        self.kv_pages: BoundPages | None = None

    def kv_spec(self) -> LayerSpec:
        return LayerSpec(name=self.layer_name, num_kv_heads=self.num_kv_heads, head_size=self.head_dim,
                         dtype=self.dtype, sliding_window_size=None, chunk_size=None)

    def check_cache(self, pages: torch.Tensor) -> None:
        """Refuse pages that are not ``[P, 2, Hkv, B, D]`` in this layer's heads and dtype."""
        if pages.dim() != 5 or pages.shape[1] != 2 or pages.shape[2] != self.num_kv_heads \
                or pages.shape[4] != self.head_dim or pages.dtype != self.dtype:
            raise ValueError(
                f"{self.layer_name}: KV pages must be [P, 2, {self.num_kv_heads}, block_size, {self.head_dim}] "
                f"{self.dtype}; got {tuple(pages.shape)} {pages.dtype}"
            )

    def bind(self, pages: BoundPages) -> None:
        """Keep the allocation of this layer's pages (:func:`~vllm_gdn_neuron.shells.neuron.cache.bind_allocations`)."""
        self.kv_pages = pages

    def forward(self, hidden: torch.Tensor, step: NeuronStep):
        """Attend, writing this step's K / V into the pages.

        Args:
            hidden: ``[T, H]``.
            step: the step's :class:`~.step.NeuronStep`: this layer's metadata, ``positions``
                (context and causality), ``rope_positions`` (``[T]`` or ``[3, T]`` M-RoPE, what
                the rotary embedding turns q and k by) and ``is_decode`` (one token per
                block-table row, or a verify step's 1 + N; else the rows' prompts packed end to end).

        Returns:
            ``[T, H]`` (summed over tensor-parallel ranks).
        """
        metadata = step.layer_metadata(self.layer_name)
        positions, is_decode = step.positions, step.is_decode
        kv_size = self.num_kv_heads * self.head_dim
        q_gate, k, v = self.qkv_proj(hidden).split([2 * self.num_heads * self.head_dim, kv_size, kv_size], dim=-1)
        q, k, v, gate = self.split_and_rotate(step.rope_positions, q_gate, k, v)
        live = metadata["slot_mapping"] > 0
        pages = self.kv_pages.view()
        self._write(pages, k, v, metadata["slot_mapping"], live)
        out = self._attend(pages, q, k, v, positions, live, metadata, is_decode)
        out = self.o_proj(self.gate_output(out, gate))
        return self.tp_group.all_reduce(out)

    def _write(self, pages, k, v, slot_mapping, live) -> None:
        """Scatter K and V rows of the step's live tokens; padding tokens write the sink."""
        num_pages, _, kv_heads, block, dim = pages.shape
        _, sink = reserved_pages(num_pages)
        slots = slot_mapping.to(torch.int64)
        # Live slots are non-negative: truncation is floor (torch-mlir lowers a floor divide of
        # integers through float64).
        page = torch.where(live, torch.div(slots, block, rounding_mode="trunc"), sink)
        offset = torch.where(live, slots % block, 0)
        heads = torch.arange(kv_heads, device=slots.device)
        # Row of (page, kv, head, offset) in the flat [P * 2 * Hkv * B, D] view.
        base = (page[:, None] * 2 * kv_heads + heads[None, :]) * block + offset[:, None]
        rows = torch.cat([base.reshape(-1), (base + kv_heads * block).reshape(-1)])
        values = torch.cat([k.reshape(-1, dim), v.reshape(-1, dim)]).to(pages.dtype)
        pages.view(-1, dim).index_copy_(0, rows, values)

    def _attend(self, pages, q, k, v, positions, live, metadata, is_decode):
        """Softmax attention of each token over its request's cached context and this step's tokens."""
        tokens = q.shape[0]
        positions = positions.to(torch.int64)
        block_table = metadata["block_table_tensor"]
        rows = block_table.shape[0]
        width = tokens // rows  # decode: 1 token per row, or a verify step's 1 + N
        if is_decode:
            row_live, first_position = live.view(rows, width)[:, 0], positions.view(rows, width)[:, 0]
        else:
            packed = prefill_rows(metadata, positions)
            row_live, first_position = packed.lengths > 0, packed.first_position
        k_ctx, v_ctx, seen = self._gather_context(pages, block_table, row_live, first_position)
        arange = torch.arange(tokens, device=q.device)
        q = q.view(tokens, self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim)
        if is_decode:  # row r's token w: its context, then the row's own tokens up to w
            own_k, own_v = (x.view(rows, width, self.num_kv_heads, self.head_dim).transpose(1, 2).to(k_ctx.dtype)
                            for x in (k, v))
            keys = torch.cat([k_ctx, own_k], dim=2).to(q.dtype)
            values = torch.cat([v_ctx, own_v], dim=2).to(q.dtype)
            own = torch.ones(width, width, dtype=torch.bool, device=q.device).tril()
            visible = torch.cat([seen[:, None, :].expand(rows, width, seen.shape[1]), own[None].expand(rows, -1, -1)],
                                dim=2).reshape(tokens, -1)
            scores = torch.einsum("rwkgd,rkcd->rwkgc", q.view(rows, width, *q.shape[1:]), keys).flatten(0, 1)
        else:  # every row's context (its own visible), then the step's tokens of its row up to it
            context = k_ctx.shape[2]
            keys = torch.cat([k_ctx.transpose(0, 1).reshape(self.num_kv_heads, rows * context, -1),
                              k.transpose(0, 1).to(k_ctx.dtype)], dim=1).to(q.dtype)
            values = torch.cat([v_ctx.transpose(0, 1).reshape(self.num_kv_heads, rows * context, -1),
                                v.transpose(0, 1).to(v_ctx.dtype)], dim=1).to(q.dtype)
            token_row = packed.token_row
            own_row = token_row[:, None] == torch.arange(rows, device=q.device)[None, :]           # [T, R]
            own_context = (own_row[:, :, None] & seen[None, :, :]).reshape(tokens, rows * context)
            same_row = (token_row[None, :] == token_row[:, None]) & live[None, :]
            causal = (arange[None, :] <= arange[:, None]) & (same_row | (arange[None, :] == arange[:, None]))
            visible = torch.cat([own_context, causal], dim=1)
            scores = torch.einsum("tkgd,kcd->tkgc", q, keys)
        scores = (scores * self.scaling).masked_fill(~visible[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        if is_decode:
            out = torch.einsum("rwkgc,rkcd->rwkgd", probs.view(rows, width, *probs.shape[1:]), values)
        else:
            out = torch.einsum("tkgc,kcd->tkgd", probs, values)
        return out.reshape(tokens, self.num_heads * self.head_dim)

    def _gather_context(self, pages, block_table, row_live, first_position):
        """K / V ``[R, Hkv, max_blocks * B, D]`` of each block-table row, and ``seen [R, max_blocks * B]``.

        A live row (``row_live [R]``) sees the cached positions before ``first_position [R]``,
        its first position in this step. Unseen entries of V are zeros (selected, not
        multiplied: a recycled page may hold NaNs), and dead rows and unused block-table
        entries read the zero page.
        """
        num_pages, _, kv_heads, block, dim = pages.shape
        zero_page, _ = reserved_pages(num_pages)
        table = block_table.to(torch.int64)
        rows = table.shape[0]
        usable = row_live[:, None] & (table > 0) & (table < zero_page)
        table = torch.where(usable, table, zero_page).reshape(-1)
        context = table.shape[0] // rows * block
        k_ctx = pages[:, 0].index_select(0, table).view(rows, -1, kv_heads, block, dim)
        v_ctx = pages[:, 1].index_select(0, table).view(rows, -1, kv_heads, block, dim)
        k_ctx = k_ctx.permute(0, 2, 1, 3, 4).reshape(rows, kv_heads, context, dim)
        v_ctx = v_ctx.permute(0, 2, 1, 3, 4).reshape(rows, kv_heads, context, dim)
        seen = row_live[:, None] & (torch.arange(context, device=table.device)[None, :] < first_position[:, None])
        v_ctx = torch.where(seen[:, None, :, None], v_ctx, torch.zeros((), dtype=v_ctx.dtype, device=v_ctx.device))
        k_ctx = torch.where(seen[:, None, :, None], k_ctx, torch.zeros((), dtype=k_ctx.dtype, device=k_ctx.device))
        return k_ctx, v_ctx, seen
