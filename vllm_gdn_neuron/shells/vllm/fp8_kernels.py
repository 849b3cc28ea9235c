"""Whether a block-FP8 checkpoint runs through vLLM's own FP8 kernels on CPU, or is dequantized at load.

:func:`choose_fp8_path` is the one place that decides. vLLM 0.32 has CPU kernels for block-FP8
weights behind its ``Fp8Config``: a linear kernel (``CPUFp8BlockScaledMMKernel``, W8A16: bf16
activations times FP8 weights, block scales applied in the AMX tiles' accumulation) and a
fused-MoE backend (``CPUExpertsFp8``, the same W8A16 scheme), both needing AMX tiles; their
W8A8 siblings need AMX-FP8 as well. The FP8 path is taken when all of these hold, else the
weights are dequantized at load (:func:`vllm_gdn_neuron.model.fp8.hold_dequantized`):

- vLLM's CPU platform (elsewhere the plugin's CPU classes run only on request, unquantized);
- a dtype vLLM's ``Fp8Config`` takes (``get_supported_act_dtypes``: not float32);
- every quantized projection's parts and inputs, per tensor-parallel rank, whole blocks (the
  block scales of each merged part then start on a block, and vLLM's CPU weight packing takes
  the rows and columns);
- vLLM's own kernel choice (``init_fp8_linear_kernel``, and for the routed experts
  ``resolve_fp8_moe_weight_block_shape`` + ``select_fp8_moe_backend``, as ``Fp8LinearMethod``
  and ``Fp8MoEMethod`` ask them when they build a layer) finds a CPU kernel for those shapes.

Dimensions:
    N, K: a projection's output rows and input columns on one rank.
"""

import dataclasses

import torch

from vllm_gdn_neuron.model.dims import GDNDims, config_layer_types, is_sparse_layer
from vllm_gdn_neuron.model.fp8 import block_size_of
from vllm_gdn_neuron.model.parameters import ATTENTION_QKV, GDN_QKVZ, MLP_GATE_UP, SHARED_EXPERT_GATE_UP


@dataclasses.dataclass(frozen=True)
class Fp8Path:
    """How a block-FP8 checkpoint is served.

    Attributes:
        kernels: True: FP8 weights and their scales held, run through vLLM's FP8 kernels;
            False: dequantized to the model dtype at load.
        reason: why (the kernels chosen, or what rules them out), for the log line.
    """

    kernels: bool
    reason: str


def quantized_projection_shapes(text_config, tp_size: int) -> dict[str, tuple[tuple[int, ...], int]]:
    """Each projection kind a block-FP8 checkpoint quantizes -> (its output parts N, its input K) on one rank.

    The merged projections' parts are the rank's share of each (``parameters``' rank split);
    the routed experts are one expert's gate | up ``[I / tp]`` over ``H``.
    """
    hidden = text_config.hidden_size

    def rank_parts(merged) -> tuple[int, ...]:
        return tuple(piece.stop - piece.start for piece in merged.split(text_config).rank_slices(tp_size, 0))

    shapes = {}
    layer_types = set(config_layer_types(text_config))
    if "linear_attention" in layer_types:
        value_dim = GDNDims.from_config(text_config).value_dim
        shapes["linear_attn.in_proj_qkvz"] = (rank_parts(GDN_QKVZ), hidden)
        shapes["linear_attn.out_proj"] = ((hidden,), value_dim // tp_size)
    if "full_attention" in layer_types:
        shapes["self_attn.qkv_proj"] = (rank_parts(ATTENTION_QKV), hidden)
        heads_dim = text_config.num_attention_heads * text_config.head_dim
        shapes["self_attn.o_proj"] = ((hidden,), heads_dim // tp_size)
    sparse = {is_sparse_layer(text_config, layer) for layer in range(text_config.num_hidden_layers)}
    if True in sparse:
        shapes["mlp.shared_expert.gate_up_proj"] = (rank_parts(SHARED_EXPERT_GATE_UP), hidden)
        shapes["mlp.shared_expert.down_proj"] = ((hidden,), text_config.shared_expert_intermediate_size // tp_size)
        inter = text_config.moe_intermediate_size // tp_size
        shapes["mlp.experts"] = ((inter, inter), hidden)
    if False in sparse:
        shapes["mlp.gate_up_proj"] = (rank_parts(MLP_GATE_UP), hidden)
        shapes["mlp.down_proj"] = ((hidden,), text_config.intermediate_size // tp_size)
    return shapes


def choose_fp8_path(text_config, quantization_config, dtype: torch.dtype, tp_size: int, platform: str) -> Fp8Path:
    """Decide how a block-FP8 checkpoint is served (see the module docstring).

    Args:
        text_config: the text decoder's config.
        quantization_config: the checkpoint's (checked) block-FP8 ``quantization_config``.
        dtype: the served dtype.
        tp_size: tensor-parallel ranks.
        platform: :func:`vllm_gdn_neuron.plugin.platform_kind`.
    """
    if platform != "cpu":
        return Fp8Path(False, f"vLLM's FP8 CPU kernels serve on its CPU platform only (this is {platform!r})")
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    supported = Fp8Config.get_supported_act_dtypes()
    if dtype not in supported:
        return Fp8Path(False, f"vLLM's Fp8Config takes dtypes {supported}, not {dtype}")
    block = block_size_of(quantization_config)
    shapes = quantized_projection_shapes(text_config, tp_size)
    for name, (parts, k) in shapes.items():
        if k % block[1] or any(part % block[0] for part in parts):
            return Fp8Path(False, f"{name}'s parts {list(parts)} x {k} per rank (tp={tp_size}) are not whole "
                                  f"{list(block)} blocks")
    try:
        linear = {_linear_kernel(parts, k, block, dtype) for name, (parts, k) in shapes.items() if name != "mlp.experts"}
        moe = _moe_backend(text_config, block, dtype, tp_size) if "mlp.experts" in shapes else None
    except ValueError as error:
        return Fp8Path(False, " ".join(str(error).split()))
    chosen = f"{', '.join(sorted(linear))} for the linear layers" + (f", the {moe} FP8 MoE backend for the experts"
                                                                      if moe else "")
    return Fp8Path(True, chosen)


def _linear_kernel(parts: tuple[int, ...], k: int, block: tuple[int, int], dtype: torch.dtype) -> str:
    """The kernel class vLLM's ``Fp8LinearMethod`` would pick for a [sum(parts), k] block-FP8 weight.

    Raises:
        ValueError: vLLM's reasons, when no kernel of the platform can implement it.
    """
    from vllm.model_executor.kernels.linear import _POSSIBLE_FP8_BLOCK_KERNELS, choose_scaled_mm_linear_kernel
    from vllm.model_executor.kernels.linear.scaled_mm import FP8ScaledMMLinearLayerConfig
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape, create_fp8_quant_key

    # The layer description and the candidate list init_fp8_linear_kernel gives the choice for block
    # quantization (dynamic per-token-group activations), without building the kernel.
    layer = FP8ScaledMMLinearLayerConfig(
        weight_quant_key=create_fp8_quant_key(static=True, group_shape=GroupShape(*block)),
        activation_quant_key=create_fp8_quant_key(static=False, group_shape=GroupShape(1, block[0])),
        input_dtype=dtype, out_dtype=dtype, weight_shape=(sum(parts), k))
    return choose_scaled_mm_linear_kernel(layer, _POSSIBLE_FP8_BLOCK_KERNELS, quantization="fp8_block_w8a8").__name__


def _moe_backend(text_config, block: tuple[int, int], dtype: torch.dtype, tp_size: int) -> str:
    """The FP8 MoE backend vLLM's ``Fp8MoEMethod`` would pick for the routed experts.

    Raises:
        ValueError: vLLM selects none (its reason where it gives one).
    """
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        get_routing_method_type,
    )
    from vllm.model_executor.layers.fused_moe.oracle.fp8 import (
        Fp8MoeBackend,
        resolve_fp8_moe_weight_block_shape,
        select_fp8_moe_backend,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        GroupShape,
        create_fp8_quant_key,
        kFp8Dynamic128Sym,
    )

    experts, top_k = text_config.num_experts, text_config.num_experts_per_tok
    config = FusedMoEConfig(
        num_experts=experts, experts_per_token=top_k, hidden_dim=text_config.hidden_size,
        intermediate_size=text_config.moe_intermediate_size, num_local_experts=experts, num_logical_experts=experts,
        activation=MoEActivation.SILU, device="cpu", in_dtype=dtype,
        routing_method=get_routing_method_type("softmax", top_k, getattr(text_config, "norm_topk_prob", True), None,
                                               False),
        moe_parallel_config=dataclasses.replace(FusedMoEParallelConfig.make_no_parallel(), tp_size=tp_size))
    block_shape, _ = resolve_fp8_moe_weight_block_shape(config, list(block), kFp8Dynamic128Sym, True)
    weight_key = create_fp8_quant_key(static=True, group_shape=GroupShape(*block_shape))
    backend, experts_cls = select_fp8_moe_backend(config, weight_key, kFp8Dynamic128Sym)
    if backend == Fp8MoeBackend.NONE or experts_cls is None:
        raise ValueError(f"vLLM selects no FP8 MoE backend for the routed experts ({experts} experts of "
                         f"{text_config.moe_intermediate_size // tp_size} x {text_config.hidden_size} per rank, "
                         f"blocks {block_shape}, {dtype})")
    return backend.value
