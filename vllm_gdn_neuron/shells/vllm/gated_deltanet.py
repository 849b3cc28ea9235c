"""The vLLM shell of the GatedDeltaNet mixer: vLLM's parallel projections, mamba-style cache and metadata.

The math is :func:`vllm_gdn_neuron.model.gated_deltanet.gdn_mix` (shared with the Neuron
shell); this module only adapts vLLM's pieces to it:

- projections: vLLM's parallel linear layers (heads sharded over tensor-parallel ranks;
  each rank holds ``Hk / tp`` key heads and their ``Hv / tp`` value heads);
- cache: ``self.kv_cache = (conv [blocks, K, C], ssm [blocks, Hv, Dk, Dv])``, one page
  per block (the ops get the conv pages as their ``[blocks, C, K]`` view, ``conv_state_view``), block 0 being vLLM's null block (never a request's: the ops' pad page);
- metadata: vLLM's ``GDNAttentionMetadata`` (decodes ordered before prefills) becomes
  ``ops.DecodeStep`` / ``ops.PrefillStep``, built and checked on the host once per step; with speculative decoding, its verify rows
  (``spec_*``: 1 + drafts tokens per request, one state page per draft position,
  ``num_accepted_tokens``) become an ``ops.VerifyStep``, and a step mixing them with
  prefills is permuted (``spec_token_indx`` then ``non_spec_token_indx``) into the ops'
  verify-first order and back; the first layer of a step builds them, the step's forward
  context keeps them for the others (:func:`~.step.step_gdn_parts`);
- compiled mode: the cache-touching core (metadata, the paged ops, :func:`gdn_mix`) is the
  custom op ``torch.ops.vllm_gdn_neuron.gdn_core``, which ``torch.compile`` calls as an opaque
  node and which runs eagerly; the projections, the gated norm and ``out_proj`` are traced;
- backend: each phase's paged op resolved once, when the layer is built (``ops.phases``: the
  CPU's instruction sets or a start-up measurement on the layer's shapes, logged once; or
  ``$VLLM_GDN_BACKEND``): torch math, vLLM's C++ kernels, or the NKI kernels.

A step without this layer's metadata is refused, except vLLM's profiling run: vLLM runs
the model once with ``attn_metadata=None`` before it allocates the cache, and then no
state exists to advance; that run (no metadata *and* no cache bound) mixes nothing.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.library import Library

from vllm.config import VllmConfig, get_current_vllm_config
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.utils import set_weight_attrs
from vllm.utils.torch_utils import direct_register_custom_op
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.model.gated_deltanet import GDNCaches, GDNDims, gdn_mix
from vllm_gdn_neuron.ops.auto import ConvShape, GdnShape
from vllm_gdn_neuron.ops.phases import resolve_phases
from vllm_gdn_neuron.model.gdn_cache import conv_state_view, gdn_state_dtypes, gdn_state_shapes
from vllm_gdn_neuron.model.norms import GatedRMSNorm
from vllm_gdn_neuron.model.parameters import GDN_BA, GDN_QKVZ, rank_share
from vllm_gdn_neuron.shells.vllm.quantization import QuantConfigFor, unquantized
from vllm_gdn_neuron.shells.vllm.step import EngineStep, step_gdn_parts

# vLLM's null block: never allocated to a request, so padding (if any) is routed there.
PAD_PAGE = 0


class GatedDeltaNet(nn.Module, MambaBase):
    """Qwen3.5 GatedDeltaNet layer whose states live in vLLM's mamba cache.

    Dimensions:
        T: tokens in the step; H: hidden size; Hk / Hv: key / value heads on this
        rank; Dk / Dv: key / value head sizes; C = 2*Hk*Dk + Hv*Dv conv channels;
        K: conv kernel width.

    Args:
        config: Hugging Face text config (``linear_*``, ``hidden_size``, ``rms_norm_eps``).
        vllm_config: the engine config (dtypes of the states, TP size).
        prefix: the layer's dotted name; it keys the step's attention metadata.
        quant_config: a module's name -> vLLM's quantization config for it (None: unquantized;
            ``in_proj_ba`` is never quantized).

    Parameters (checkpoint names, after the model's loader maps them; this rank's share of each,
    :mod:`vllm_gdn_neuron.model.parameters`):
        in_proj_qkvz.weight [2*Hk*Dk + 2*Hv*Dv, H] shards (q, k, v, z);
        in_proj_ba.weight [2*Hv, H] shards (b, a); conv1d.weight [C, K];
        A_log, dt_bias [Hv] float32; norm.weight [Dv]; out_proj.weight [H, Hv*Dv].
    """

    def __init__(self, config, vllm_config: VllmConfig, prefix: str,
                 quant_config: QuantConfigFor = unquantized) -> None:
        super().__init__()
        self.prefix = prefix
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.text_config = config
        self.model_dtype = vllm_config.model_config.dtype
        self.cache_config = vllm_config.cache_config

        self.dims = dims = GDNDims.from_config(config, self.tp_size)

        self.in_proj_qkvz = MergedColumnParallelLinear(
            config.hidden_size, list(GDN_QKVZ.part_sizes(config)), bias=False,
            quant_config=quant_config(f"{prefix}.in_proj_qkvz"), prefix=f"{prefix}.in_proj_qkvz"
        )
        self.in_proj_ba = MergedColumnParallelLinear(
            config.hidden_size, list(GDN_BA.part_sizes(config)), bias=False, prefix=f"{prefix}.in_proj_ba"
        )
        self.conv1d = _ConvWeight(f"{prefix}.conv1d.weight", config, self.tp_size, self.tp_rank)
        self.A_log = nn.Parameter(torch.empty(dims.num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(dims.num_v_heads, dtype=torch.float32))
        for name in ("A_log", "dt_bias"):
            loader = rank_share_loader(f"{prefix}.{name}", config, self.tp_size, self.tp_rank)
            set_weight_attrs(getattr(self, name), {"weight_loader": loader})
        self.norm = GatedRMSNorm(dims.head_v_dim, eps=config.rms_norm_eps)
        self.out_proj = RowParallelLinear(
            GDNDims.from_config(config).value_dim, config.hidden_size, bias=False, input_is_parallel=True,
            quant_config=quant_config(f"{prefix}.out_proj"), prefix=f"{prefix}.out_proj",
        )

        conv_dtype, ssm_dtype = self.get_state_dtype()
        self.phases = resolve_phases(
            GdnShape(self.model_dtype, dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim,
                     dims.head_k_dim ** -0.5, ssm_dtype),
            ConvShape(self.model_dtype, self.conv1d.weight.dtype, conv_dtype, dims.conv_dim, dims.conv_kernel,
                      "silu"),
            vllm_config.device_config.device_type)

        # vLLM finds attention-like layers (and binds their cache) through this table.
        static_forward_context = get_current_vllm_config().compilation_config.static_forward_context
        if prefix in static_forward_context:
            raise ValueError(f"duplicate layer name {prefix!r}")
        static_forward_context[prefix] = self

    # --- MambaBase: what the cache holds for this layer -------------------------------

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.GDN_ATTN

    def get_state_shape(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        return gdn_state_shapes(self.text_config, self.tp_size)

    def get_state_dtype(self) -> tuple[torch.dtype, torch.dtype]:
        return gdn_state_dtypes(
            self.model_dtype, self.cache_config.mamba_cache_dtype, self.cache_config.mamba_ssm_cache_dtype
        )

    # --- forward ----------------------------------------------------------------------

    def forward(self, hidden_states: torch.Tensor, step: EngineStep) -> torch.Tensor:
        """Mix the tokens of one engine step.

        The projections, the gated norm and the output projection are traceable; the core
        (this step's metadata, the paged states, :func:`gdn_mix`) runs behind the custom op
        ``vllm_gdn_neuron::gdn_core`` (:meth:`mix_core`), eagerly in compiled mode too.

        Args:
            hidden_states: [T, H] in the model dtype.
            step: the forward's :class:`~.step.EngineStep` (unused: the core reads the step
                from vLLM's forward context).

        Returns:
            [T, H] in the model dtype.
        """
        dims, num_tokens = self.dims, hidden_states.shape[0]
        qkvz, _ = self.in_proj_qkvz(hidden_states)
        ba, _ = self.in_proj_ba(hidden_states)
        qkv, z = qkvz.split([dims.conv_dim, dims.value_dim], dim=-1)
        b, a = ba.split([dims.num_v_heads, dims.num_v_heads], dim=-1)
        core = qkv.new_empty(num_tokens, dims.num_v_heads, dims.head_v_dim)
        torch.ops.vllm_gdn_neuron.gdn_core(qkv, a, b, core, self.prefix)
        out = self.norm(core, z.view(num_tokens, dims.num_v_heads, dims.head_v_dim))
        out, _ = self.out_proj(out.view(num_tokens, dims.value_dim))
        return out

    def mix_core(self, qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, core: torch.Tensor) -> None:
        """Write the step's GatedDeltaNet core into ``core``, advancing the paged states (eager).

        Args:
            qkv: [T, C] projected q | k | v (before the conv), in the model dtype.
            a, b: [T, Hv] gate inputs.
            core: [T, Hv, Dv] written with the core's output (zeros in vLLM's profiling run).

        Raises:
            RuntimeError: the step has no metadata for this layer but its cache is bound.
        """
        cache = getattr(self, "kv_cache", ())
        forward_context = get_forward_context()
        metadata = layer_metadata(forward_context.attn_metadata, self.prefix, cache_bound=len(cache) > 0)
        if metadata is None:  # vLLM's profiling run, before any cache exists
            core.zero_()
            return
        conv_pages, ssm_cache = cache
        conv_cache = conv_state_view(conv_pages)
        parts = step_gdn_parts(forward_context, metadata, conv_cache.shape[0], engine_step)
        if parts.order is not None:
            qkv, a, b = (t.index_select(0, parts.order) for t in (qkv, a, b))
        mixed = gdn_mix(self.dims, qkv, a, b, self.conv1d.weight, self.A_log, self.dt_bias,
                        GDNCaches(conv=conv_cache, ssm=ssm_cache), parts.decode, parts.prefill,
                        verify=parts.verify, phases=self.phases)
        if parts.order is None:
            core.copy_(mixed)
        else:
            core.index_copy_(0, parts.order, mixed)


def gdn_core(qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, core: torch.Tensor, layer_name: str) -> None:
    """The custom op's body: :meth:`GatedDeltaNet.mix_core` of the layer ``layer_name`` of the
    current forward (vLLM's ``no_compile_layers``, where every GatedDeltaNet registers)."""
    get_forward_context().no_compile_layers[layer_name].mix_core(qkv, a, b, core)


def gdn_core_fake(qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, core: torch.Tensor, layer_name: str) -> None:
    """What tracing sees of :func:`gdn_core`: it writes ``core`` and returns nothing."""


# The op is opaque to torch.compile: vLLM's compiled mode traces the projections and norms
# around it and calls it as is (host reads of the step's metadata, vLLM's C++ kernels on the
# paged states in place).
_LIBRARY = Library("vllm_gdn_neuron", "FRAGMENT")
direct_register_custom_op("gdn_core", gdn_core, mutates_args=["core"], fake_impl=gdn_core_fake,
                          target_lib=_LIBRARY)


def rank_share_loader(name: str, text_config, tp_size: int, tp_rank: int):
    """A ``weight_loader`` that copies this rank's share of the whole checkpoint tensor of parameter
    ``name`` (:func:`~vllm_gdn_neuron.model.parameters.rank_share`) into the parameter.

    Raises (when called):
        ValueError: naming the parameter, when the share does not fill it.
    """

    def load(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        share = rank_share(name, loaded_weight, text_config, tp_size, tp_rank)
        if share.numel() != param.numel():
            raise ValueError(f"{name}: this rank's share of the checkpoint tensor {tuple(loaded_weight.shape)} "
                             f"must fill the parameter {tuple(param.shape)}; got {tuple(share.shape)}")
        param.data.copy_(share.reshape(param.shape))

    return load


class _ConvWeight(nn.Module):
    """The depthwise conv kernel ``weight [C_local, K]`` of this rank's q | k | v channels.

    The checkpoint stores ``[C, 1, K]`` (``nn.Conv1d``) over all heads; each rank keeps its
    channels of each of q, k and v (:func:`~vllm_gdn_neuron.model.parameters.rank_share`).

    Args:
        name: the parameter's name (``<layer>.conv1d.weight``).
        text_config: the text decoder's config.
        tp_size, tp_rank: the tensor-parallel position.
    """

    def __init__(self, name: str, text_config, tp_size: int, tp_rank: int) -> None:
        super().__init__()
        dims = GDNDims.from_config(text_config, tp_size)
        self.weight = nn.Parameter(torch.empty(dims.conv_dim, dims.conv_kernel))
        set_weight_attrs(self.weight, {"weight_loader": rank_share_loader(name, text_config, tp_size, tp_rank)})


def layer_metadata(attn_metadata, prefix: str, cache_bound: bool):
    """This layer's entry of the step's ``attn_metadata``, or None in vLLM's profiling run.

    The profiling run is the one step with no metadata and no cache bound yet; any other
    step without this layer's entry would leave the states where they are and serve
    zeros, so it is refused.

    Raises:
        RuntimeError: naming the layer, when the entry is missing but the cache is bound.
    """
    step = attn_metadata.get(prefix) if isinstance(attn_metadata, dict) else None
    if step is None and cache_bound:
        missing = "is None" if attn_metadata is None else "has no entry for the layer"
        raise RuntimeError(
            f"{prefix}: no GatedDeltaNet metadata in this step (attn_metadata {missing}) although the "
            f"layer's cache is bound; the states cannot advance"
        )
    return step


@dataclass(frozen=True)
class StepParts:
    """The ops' metadata of one engine step.

    Attributes:
        verify, decode, prefill: the parts (None for a part with no tokens).
        order: ``[T]`` int64 step token of each ops token (verify tokens, then the others), or
            None when the step's tokens already come in the ops' order.
    """

    verify: "ops.VerifyStep | None"
    decode: "ops.DecodeStep | None"
    prefill: "ops.PrefillStep | None"
    order: torch.Tensor | None


def engine_step(metadata, num_pages: int) -> StepParts:
    """The ops' metadata of vLLM's ``GDNAttentionMetadata``, host-checked.

    Built once per step and metadata object (:func:`.step.step_gdn_parts`): vLLM hands
    every GDN layer of a step the same metadata object. With speculative decoding vLLM turns
    a step's plain decodes into one-token prefills, so verify rows and decode rows never
    share a step.
    """
    verify = decode = prefill = order = None
    if metadata.num_spec_decodes:
        n = metadata.num_spec_decodes
        verify_args = (metadata.spec_query_start_loc[: n + 1], metadata.spec_state_indices_tensor[:n],
                       metadata.num_accepted_tokens[:n], metadata.num_spec_decode_tokens)
        verify = ops.VerifyStep.build(*verify_args, pad_page=PAD_PAGE)
        if metadata.num_prefills or metadata.num_decodes:
            order = torch.cat([metadata.spec_token_indx, metadata.non_spec_token_indx]).to(torch.int64)
    if metadata.num_decodes:
        decode_pages = metadata.non_spec_state_indices_tensor[: metadata.num_decodes]
        decode = ops.DecodeStep.build(decode_pages, PAD_PAGE)
    if metadata.num_prefills:
        n = metadata.num_prefills
        prefill_args = (metadata.prefill_query_start_loc[: n + 1], metadata.prefill_state_indices[:n],
                        metadata.prefill_has_initial_state[:n])
        prefill = ops.PrefillStep.build(*prefill_args, metadata.num_prefill_tokens, exact_plan=True)
    ops.check_step(num_pages, PAD_PAGE, decode=decode, prefill=prefill, verify=verify)
    return StepParts(verify, decode, prefill, order)
