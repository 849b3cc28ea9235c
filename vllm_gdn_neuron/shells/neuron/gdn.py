"""The GatedDeltaNet layer on vllm-neuron's page-major state pages.

Per step and layer (:func:`build_gdn_step`; layers of different vLLM cache groups have
different block tables), from the layer's metadata: the page of each request is
``block_table_tensor[:, 0]`` (the recurrent group's block size is ``max_model_len``: one
block per sequence). A decode row is live when its (first) token has ``slot_mapping > 0``; a
prefill row when it has tokens (:func:`.packing.prefill_rows`: any number of requests packed
end to end in the bucket); either only where its page lies below the reserved pages.

A verify step (speculative decoding, :mod:`.spec_decode`) is a decode step of W = 1 + N
tokens per row: the row's last token and its N drafts. The runner's recurrent group gives a
request one page, so the W states after each token are kept in a scratch of W pages per row
(``ops.paged_*_verify``), and the layer hands them to the model unwritten
(:class:`PendingStates`): which one the page keeps is known only once the step's ids are
sampled and compared with the drafts, at the end of the graph. Live requests
read and write their page; padding rows read the zero page and write the sink
(:mod:`.contract`). A prefill sequence starts from zeros when its first position is 0, else
from its page (a chunk continuing a cached prompt).

Per layer: one ``index_select`` of whole page rows, the shared mixer
(:func:`vllm_gdn_neuron.model.gated_deltanet.gdn_mix`) on those rows, one ``index_copy_``
of whole rows back; no strided write into the bound tensor.
"""

from dataclasses import dataclass

import torch
from torch import nn

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.ops.auto import ConvShape, GdnShape
from vllm_gdn_neuron.ops.phases import resolve_phases
from vllm_gdn_neuron.model.gated_deltanet import GDNCaches, GDNDims, gdn_mix
from vllm_gdn_neuron.model.norms import GatedRMSNorm
from vllm_gdn_neuron.shells.neuron.cache import STATE_DTYPE, BoundPages, GDNPageLayout
from vllm_gdn_neuron.shells.neuron.contract import reserved_pages
from vllm_gdn_neuron.shells.neuron.kv_spec import RecurrentLayerSpec
from vllm_gdn_neuron.shells.neuron.packing import prefill_rows
from vllm_gdn_neuron.shells.neuron.step import NeuronStep


@dataclass
class NeuronGDNStep:
    """The GDN part of one engine step for the layers of one cache group.

    Attributes:
        read_pages, write_pages: ``[R]`` int64 page each row reads / writes.
        decode: the ops' decode metadata over the R gathered rows (decode steps), or None.
        prefill: the ops' prefill metadata over the R gathered rows (prefill steps), or None.
    """

    read_pages: torch.Tensor
    write_pages: torch.Tensor
    decode: "ops.DecodeStep | None"
    prefill: "ops.PrefillStep | None"
    verify: "ops.VerifyStep | None" = None


@dataclass
class PendingStates:
    """One GDN layer's states after each token of a verify step, not yet written.

    Attributes:
        layer: the :class:`NeuronGatedDeltaNet` whose pages take them.
        write_pages: ``[R]`` int64 page of each row (the sink for padding rows).
        states: ``[R, W, E]`` float32 whole page rows: the state after the row's token w.
    """

    layer: "NeuronGatedDeltaNet"
    write_pages: torch.Tensor
    states: torch.Tensor

    def commit(self, kept: torch.Tensor) -> None:
        """Write the state after token ``kept[r]`` (``[R]`` int64, in ``[0, W)``) of each row to its page."""
        num_rows, width, page_elems = self.states.shape
        flat = torch.arange(num_rows, device=kept.device) * width + kept
        chosen = self.states.reshape(num_rows * width, page_elems).index_select(0, flat)
        self.layer.state_pages.view().index_copy_(0, self.write_pages, chosen)


def build_gdn_step(metadata: dict, positions: torch.Tensor, num_pages: int, is_decode: bool,
                   width: int = 1) -> NeuronGDNStep:
    """Static-shape metadata of a decode step (R rows of ``width`` tokens each: one, or a verify
    step's 1 + N) or a prefill step (R rows packed).

    Args:
        metadata: one GDN layer's ``attn_metadata`` entry (``block_table_tensor``, ``slot_mapping``,
            ``block_size``).
        positions: ``[T]`` token positions.
        num_pages: pages of the bound state view (reserved pages included).
        is_decode: the step's path (``max_query_len <= decode_token_threshold``).
        width: tokens per decode row (a Python int: ``T // R``; above 1 only in a verify step).
    """
    zero_page, sink = reserved_pages(num_pages)
    slot_mapping = metadata["slot_mapping"]
    block_table = metadata["block_table_tensor"]
    rows = slot_mapping.shape[0] // width if is_decode else block_table.shape[0]
    pages = block_table[:rows, 0].to(torch.int64)
    if is_decode:
        has_tokens = slot_mapping.view(rows, width)[:, 0] > 0
    else:
        packed = prefill_rows(metadata, positions)
        has_tokens = packed.lengths > 0
    live = has_tokens & (pages > 0) & (pages < zero_page)
    read = torch.where(live, pages, zero_page)
    write = torch.where(live, pages, sink)
    local = torch.arange(rows, dtype=torch.int64, device=pages.device)
    if is_decode and width > 1:
        # Scratch page r * W + w takes the state after row r's token w; the row's state is read
        # from r * W (every scratch page of the row starts as a copy of it), the last page is padding.
        scratch = local[:, None] * width + torch.arange(width, device=pages.device)[None, :]
        bounds = torch.arange(rows + 1, dtype=torch.int64, device=pages.device) * width
        verify = ops.VerifyStep.build(bounds, scratch, torch.ones_like(local), rows * width, rows * width)
        return NeuronGDNStep(read, write, None, None, verify)
    if is_decode:
        return NeuronGDNStep(read, write, ops.DecodeStep.build(local), None)
    prefill = ops.PrefillStep.build(packed.query_start_loc, local, packed.first_position > 0, slot_mapping.shape[0])
    return NeuronGDNStep(read, write, None, prefill)


class _ConvWeight(nn.Module):
    """``weight [C, K]``: the checkpoint's ``conv1d.weight [C, 1, K]`` without the unit axis."""

    def __init__(self, channels: int, kernel: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, kernel, dtype=dtype))


class NeuronGatedDeltaNet(nn.Module):
    """Qwen3.5 GatedDeltaNet with plain per-rank weights, states in page-major pages.

    Args:
        config: Hugging Face text config.
        layer_name: the key of this layer in ``attn_metadata`` and the bound caches.
        tp_group: the tensor-parallel group.
        dtype: the model dtype.

    Parameters (this rank's heads; the merged projections of
    :mod:`vllm_gdn_neuron.model.parameters`, as the vLLM shell holds them):
    ``in_proj_qkvz.weight [C + Hv * Dv, H]`` (q | k | v | z parts), ``in_proj_ba.weight
    [2 * Hv, H]`` (b | a parts), ``conv1d.weight [C, K]``, ``A_log``, ``dt_bias [Hv]``
    float32, ``norm.weight [Dv]``, ``out_proj.weight [H, Hv * Dv]``.
    """

    def __init__(self, config, layer_name: str, tp_group, dtype: torch.dtype) -> None:
        super().__init__()
        tp = tp_group.world_size
        self.layer_name = layer_name
        self.tp_group = tp_group
        self.dims = GDNDims.from_config(config, tp)
        self.layout = GDNPageLayout.from_config(config, tp)
        dims, hidden = self.dims, config.hidden_size
        self.in_proj_qkvz = nn.Linear(hidden, dims.conv_dim + dims.value_dim, bias=False, dtype=dtype)
        self.in_proj_ba = nn.Linear(hidden, 2 * dims.num_v_heads, bias=False, dtype=dtype)
        self.conv1d = _ConvWeight(dims.conv_dim, dims.conv_kernel, dtype)
        self.A_log = nn.Parameter(torch.empty(dims.num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(dims.num_v_heads, dtype=torch.float32))
        self.norm = GatedRMSNorm(dims.head_v_dim, eps=config.rms_norm_eps).to(dtype)
        self.out_proj = nn.Linear(dims.value_dim, hidden, bias=False, dtype=dtype)
        self.state_pages: BoundPages | None = None
        # The NKI kernels where the nki backend is chosen (a Neuron SDK present, or
        # VLLM_GDN_BACKEND=nki), else the torch math; chosen once, outside any traced forward.
        self.phases = resolve_phases(
            GdnShape(dtype, dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim,
                     dims.head_k_dim ** -0.5, STATE_DTYPE),
            ConvShape(dtype, dtype, STATE_DTYPE, dims.conv_dim, dims.conv_kernel, "silu"), "neuron")

    def kv_spec(self) -> RecurrentLayerSpec:
        return RecurrentLayerSpec(name=self.layer_name, shapes=(self.layout.conv_shape, self.layout.ssm_shape),
                                  dtypes=(STATE_DTYPE, STATE_DTYPE))

    def check_cache(self, pages: torch.Tensor) -> None:
        """Refuse state pages that are not ``[P, >= state_elems]`` float32."""
        self.layout.check_pages(self.layer_name, pages)

    def bind(self, pages: BoundPages) -> None:
        """Keep the allocation of this layer's pages (:func:`~vllm_gdn_neuron.shells.neuron.cache.bind_allocations`)."""
        self.state_pages = pages

    def forward(self, hidden: torch.Tensor, engine_step: NeuronStep):
        """Mix one step's tokens.

        Args:
            hidden: ``[T, H]`` in the model dtype.
            engine_step: the step's :class:`~.step.NeuronStep` (this layer's metadata, positions,
                ``is_decode``, ``width``; a verify step's ``pending`` list takes this layer's
                :class:`PendingStates`, the pages written by the model once the drafts are judged).

        Returns:
            ``[T, H]`` (summed over tensor-parallel ranks).
        """
        metadata = engine_step.layer_metadata(self.layer_name)
        positions, is_decode = engine_step.positions, engine_step.is_decode
        width, pending = engine_step.width, engine_step.pending
        tokens = hidden.shape[0]
        qkv, z = self.in_proj_qkvz(hidden).split([self.dims.conv_dim, self.dims.value_dim], dim=-1)
        b, a = self.in_proj_ba(hidden).split([self.dims.num_v_heads, self.dims.num_v_heads], dim=-1)
        state_pages = self.state_pages.view()
        page_elems = state_pages.shape[1]
        step = build_gdn_step(metadata, positions, state_pages.shape[0], is_decode, width)
        rows = state_pages.index_select(0, step.read_pages)
        if step.verify is not None:  # every scratch page of a row starts from its state; one pad page
            rows = torch.cat([rows.repeat_interleave(width, 0), rows.new_zeros(1, page_elems)])
        conv, ssm = self.layout.split(rows)
        caches = GDNCaches(conv=conv, ssm=ssm)
        core = gdn_mix(self.dims, qkv, a, b, self.conv1d.weight, self.A_log, self.dt_bias, caches, step.decode, step.prefill,
                       verify=step.verify, phases=self.phases)
        states = self.layout.join(caches.conv, caches.ssm, page_elems)
        if step.verify is not None:
            if pending is None:
                raise ValueError(f"{self.layer_name}: a verify step needs the model's pending-states list")
            num_rows = step.read_pages.shape[0]
            pending.append(PendingStates(self, step.write_pages, states[:-1].view(num_rows, width, page_elems)))
        else:
            state_pages.index_copy_(0, step.write_pages, states)
        out = self.norm(core, z.view(tokens, self.dims.num_v_heads, self.dims.head_v_dim)).reshape(tokens, self.dims.value_dim)
        return self.tp_group.all_reduce(self.out_proj(out))
