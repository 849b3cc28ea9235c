"""Qwen3.5 (dense and MoE) and Qwen3-Next hybrid decoders for vLLM.

The decoder and its LM head are :mod:`vllm_gdn_neuron.model.decoder`'s and
:mod:`~vllm_gdn_neuron.model.causal_lm`'s, built from vLLM's parts (:class:`VllmDecoderParts`:
parallel linears, ``ParallelLMHead`` tied by sharing the embedding's parameter,
``LogitsProcessor``); this module adds what vLLM asks of a model: the mamba-style cache's
shapes, dtypes and copy functions (``IsHybrid``), weight loading, and the multimodal interfaces.

The text decoder is :class:`VllmTextModel`, which declares vLLM's ``support_torch_compile``: in
vLLM's compiled mode (its CPU default unless ``enforce_eager``) it is traced once into one graph,
each GatedDeltaNet core and each attention an opaque custom op that runs eagerly.

The text model classes differ only in how the checkpoint is laid out (see ``weights.py``).
The vision-language classes wrap the text model (``language_model``) and add the vision
tower (``visual``, :class:`vllm_gdn_neuron.model.vision.VisionTower`): vLLM runs the tower
on each request's images, scatters the merged embeddings over the image placeholder
tokens and feeds M-RoPE positions (``[3, T]``) to the attention layers.
"""

from collections.abc import Iterable

import torch
from torch import nn

from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.model_executor.layers.linear import ColumnParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.mamba.mamba_utils import MambaCopySpec
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid, SupportsMRoPE, SupportsMultiModal
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import MultiModalFeatureSpec
from vllm.sequence import IntermediateTensors

from vllm_gdn_neuron.model.causal_lm import CausalLM, ties_word_embeddings
from vllm_gdn_neuron.model.checkpoint import MTP_PREFIX, text_tensor_name, vision_tensor_name
from vllm_gdn_neuron.model.decoder import DecoderParts, TextModel
from vllm_gdn_neuron.model.fp8 import FP8_PATH_KEY, block_size_of, held_fp8_config, is_scale_name, module_is_quantized
from vllm_gdn_neuron.model.gdn_cache import gdn_state_dtypes, gdn_state_shapes
from vllm_gdn_neuron.model.norms import ZeroCentredRMSNorm
from vllm_gdn_neuron.model.parameters import checkpoint_modules
from vllm_gdn_neuron.model.vision import VisionTower, prompt_mrope_positions, vision_grid_inputs
from vllm_gdn_neuron.shells.vllm.attention import GatedAttention
from vllm_gdn_neuron.shells.vllm.gated_deltanet import GatedDeltaNet
from vllm_gdn_neuron.shells.vllm.mlp import SparseMoE, SwiGLUMLP
from vllm_gdn_neuron.shells.vllm.step import EngineStep
from vllm_gdn_neuron.shells.vision_processing import (
    Qwen3_5VisionDummyInputsBuilder,
    Qwen3_5VisionMultiModalProcessor,
    Qwen3_5VisionProcessingInfo,
    placeholder_str,
)
from vllm_gdn_neuron.shells.vllm.weights import dequantizing, plan_loads, plan_scale_loads

# Under the "vllm" logger so vLLM's log configuration prints it.
logger = init_logger(f"vllm.plugins.{__name__}")

class VllmDecoderParts(DecoderParts):
    """The vLLM pieces of the shared decoder: vocab-parallel embedding, parallel linears
    (row-parallel outputs reduce inside), attention and GatedDeltaNet over vLLM's caches."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config

    def quant_config(self, module: str) -> QuantizationConfig | None:
        """vLLM's quantization config for the module ``module`` (the shell's name, e.g.
        ``model.layers.0.self_attn.qkv_proj``) where the checkpoint stores it in block-FP8 and vLLM
        serves it so (:func:`vllm_gdn_neuron.shells.vllm.fp8_kernels.choose_fp8_path`); None for an
        unquantized module, or when the weights are dequantized at load."""
        quant_config = self.vllm_config.quant_config
        if quant_config is None:
            return None
        checkpoint = self.vllm_config.model_config.hf_config.quantization_config
        skipped = checkpoint.get("modules_to_not_convert") or ()
        return quant_config if module_is_quantized(checkpoint_modules(module), skipped) else None

    def embedding(self, config) -> nn.Module:
        return VocabParallelEmbedding(config.vocab_size, config.hidden_size)

    def norm(self, hidden_size: int, eps: float) -> nn.Module:
        return ZeroCentredRMSNorm(hidden_size, eps=eps)

    def linear_attention(self, config, prefix: str) -> nn.Module:
        return GatedDeltaNet(config, self.vllm_config, prefix=prefix, quant_config=self.quant_config)

    def full_attention(self, config, prefix: str) -> nn.Module:
        return GatedAttention(config, self.vllm_config.cache_config, prefix=prefix, quant_config=self.quant_config)

    def dense_mlp(self, config, prefix: str) -> nn.Module:
        return SwiGLUMLP(config.hidden_size, config.intermediate_size, prefix=prefix, quant_config=self.quant_config)

    def sparse_moe(self, config, prefix: str) -> nn.Module:
        return SparseMoE(config, prefix=prefix, quant_config=self.quant_config)

    def replicated_linear(self, in_features: int, out_features: int, prefix: str) -> nn.Module:
        return GatheredLinear(in_features, out_features, bias=False, gather_output=True, prefix=prefix)

    def lm_head(self, config, tied_embedding: nn.Module | None) -> nn.Module:
        head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix="lm_head")
        return head if tied_embedding is None else head.tie_weights(tied_embedding)

    def logits_processor(self, config) -> nn.Module:
        return LogitsProcessor(config.vocab_size)


class GatheredLinear(ColumnParallelLinear):
    """A column-parallel linear layer whose forward returns the gathered output alone."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = super().forward(x)
        return out


def _copy_whole_state(
    state: torch.Tensor, block_ids: list[int], cur_block_idx: int, num_accepted_tokens: int
) -> MambaCopySpec:
    """Copy one cache slot's state whole (prefix caching in mamba ``align`` mode).

    Both states (conv ``[C, K]`` and recurrent) keep one slot per draft position, the
    state after the step's token t in slot t, so the state to carry is the whole slot
    of the last accepted token, ``num_accepted_tokens - 1`` slots past the current block.
    """
    if num_accepted_tokens < 1:
        raise ValueError(f"num_accepted_tokens must be >= 1; got {num_accepted_tokens}")
    source = state[block_ids[cur_block_idx + num_accepted_tokens - 1]]
    return MambaCopySpec(start_addr=source.data_ptr(), num_elements=source.numel())


class CheckpointLoader:
    """Loads Hugging Face checkpoint tensors (either GDN layout, sharded or not, block-FP8 ones
    dequantized to ``weight_dtype``) into a module's vLLM parameters; the module (a
    :class:`CausalLM`: ``config``, ``tie_word_embeddings``; ``checkpoint_config``, the
    checkpoint's top-level config) names which tensors it takes (:meth:`checkpoint_tensor_name`)."""

    checkpoint_config = None
    weight_dtype = torch.float32
    fp8_block_size = None

    def take_checkpoint_config(self, model_config) -> None:
        """Keep what loading needs of the engine's model config: the checkpoint's config and the
        dtype the weights are held in; say how a block-FP8 checkpoint is held."""
        self.checkpoint_config, self.weight_dtype = model_config.hf_config, model_config.dtype
        path = getattr(self.checkpoint_config, FP8_PATH_KEY, None)
        if held_fp8_config(self.checkpoint_config):
            logger.info("vllm-gdn-neuron: block-FP8 checkpoint: weights dequantized to %s at load (held and run "
                        "in %s, as an unquantized checkpoint)%s", self.weight_dtype, self.weight_dtype,
                        f"; vLLM's FP8 kernels not used: {path.reason}" if path else "")
        elif path is not None:
            logger.info("vllm-gdn-neuron: block-FP8 checkpoint: weights held in FP8 (float8_e4m3fn and their block "
                        "scales) and run through vLLM's FP8 kernels (%s), activations in %s", path.reason,
                        self.weight_dtype)
        self.fp8_block_size = (block_size_of(self.checkpoint_config.quantization_config)
                               if path is not None and path.kernels else None)

    def checkpoint_tensor_name(self, checkpoint_name: str) -> str | None:
        """This module's name of a checkpoint tensor, or None for one it does not take."""
        raise NotImplementedError

    def report_skipped(self, skipped: list[str]) -> None:
        """Called once with the checkpoint names the module did not take."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load the checkpoint tensors this module takes.

        Returns:
            The names of the parameters that were written.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        skipped: list[str] = []
        for checkpoint_name, tensor in dequantizing(weights, self.checkpoint_config, self.weight_dtype):
            name = self.checkpoint_tensor_name(checkpoint_name)
            if name is None:
                skipped.append(checkpoint_name)
                continue
            if self.tie_word_embeddings and name.startswith("lm_head."):
                continue
            if ".mlp.experts." in name:
                loaded |= self._load_experts(name, tensor)
                continue
            loads = (plan_scale_loads(name, tensor, self.config, self.fp8_block_size) if is_scale_name(name)
                     else plan_loads(name, tensor, self.config))
            for param_name, shard, part in loads:
                if param_name not in params:
                    raise ValueError(
                        f"checkpoint tensor {checkpoint_name!r} has no parameter {param_name!r} in "
                        f"{type(self).__name__} (is the config's architecture right?)"
                    )
                param = params[param_name]
                loader = getattr(param, "weight_loader", default_weight_loader)
                if shard is None:
                    loader(param, part)
                else:
                    loader(param, part, shard)
                loaded.add(param_name)
        self.report_skipped(skipped)
        return loaded

    def _load_experts(self, name: str, tensor: torch.Tensor) -> set[str]:
        """Hand one routed-expert tensor (per-expert or fused 3-D) to vLLM's fused-MoE loader."""
        layer_prefix, _, relative = name.partition(".mlp.experts.")
        module_name = f"{layer_prefix}.mlp.experts"
        experts = self.get_submodule(module_name)
        return {f"{module_name}.{param}" for param in experts.load_weights([(relative, tensor)])}


#: The forward arguments whose sizes vary per step: the token axis (positions' last axis:
#: ``[T]`` or ``[3, T]`` with M-RoPE).
DYNAMIC_ARG_DIMS = {"input_ids": 0, "positions": -1, "intermediate_tensors": 0, "inputs_embeds": 0}


@support_torch_compile(dynamic_arg_dims=DYNAMIC_ARG_DIMS)
class VllmTextModel(TextModel):
    """The text decoder (``model.*``) as vLLM's compiled mode traces it: ids (or embeddings) and
    positions in, final hidden states out.

    In compiled mode (vLLM's CPU default) vLLM traces this forward once with ``torch.compile``
    (Inductor on CPU): embeddings, norms, projections, gating and feed-forward blocks in one
    graph, each GatedDeltaNet core and each attention an opaque custom op that runs eagerly
    over the paged caches. With ``enforce_eager`` it runs as written.
    """

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "model") -> None:
        config = vllm_config.model_config.hf_text_config
        super().__init__(config, VllmDecoderParts(vllm_config), prefix=prefix)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[T] token ids (or [T, H] embeddings) and [T] or [3, T] positions -> [T, H] final hidden states."""
        hidden_states = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        return super().forward(hidden_states, EngineStep(positions))


class Qwen3_5ForCausalLM(CheckpointLoader, CausalLM, HasInnerState, IsHybrid):
    """Qwen3.5 text decoder with the LM head (``Qwen3_5ForCausalLM`` checkpoints).

    The same class serves the MoE variant (sparse layers come from the config) and,
    through :func:`plan_loads`, the Qwen3-Next packed GatedDeltaNet projections.
    """

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        model_config = vllm_config.model_config
        config, parts = model_config.hf_text_config, VllmDecoderParts(vllm_config)
        super().__init__(config, parts, VllmTextModel(vllm_config=vllm_config, prefix="model"),
                         ties_word_embeddings(model_config.hf_config))
        self.take_checkpoint_config(model_config)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        """[T] token ids (or [T, H] embeddings) and [T] positions -> [T, H] final hidden states."""
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    # --- the mamba-style cache (IsHybrid) -------------------------------------------------

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig):
        return gdn_state_shapes(
            vllm_config.model_config.hf_text_config, vllm_config.parallel_config.tensor_parallel_size
        )

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig):
        cache = vllm_config.cache_config
        return gdn_state_dtypes(vllm_config.model_config.dtype, cache.mamba_cache_dtype, cache.mamba_ssm_cache_dtype)

    @classmethod
    def get_mamba_state_copy_func(cls):
        return (_copy_whole_state, _copy_whole_state)

    # --- weights --------------------------------------------------------------------------

    def checkpoint_tensor_name(self, checkpoint_name: str) -> str | None:
        return text_tensor_name(checkpoint_name)

    def report_skipped(self, skipped: list[str]) -> None:
        vision = sum(not name.startswith(MTP_PREFIX) for name in skipped)
        if vision:
            logger.info("vllm-gdn-neuron: skipped %d vision-tower tensors (text-only deployment)", vision)


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    """Qwen3.5-MoE text decoder (``Qwen3_5MoeForCausalLM`` checkpoints)."""


@MULTIMODAL_REGISTRY.register_processor(
    Qwen3_5VisionMultiModalProcessor, info=Qwen3_5VisionProcessingInfo, dummy_inputs=Qwen3_5VisionDummyInputsBuilder
)
class Qwen3_5ForConditionalGeneration(nn.Module, SupportsMultiModal, SupportsMRoPE, HasInnerState, IsHybrid):
    """A Qwen3.5 vision-language checkpoint: the vision tower and the text decoder.

    With ``--limit-mm-per-prompt '{"image": 0, "video": 0}'`` (or ``--language-model-only``)
    vLLM builds no tower (``_mark_tower_model``) and its tensors are skipped at load.
    """

    text_model_class = Qwen3_5ForCausalLM

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        self.config = vllm_config.model_config.hf_config
        with self._mark_tower_model(vllm_config, {"image", "video"}):
            self.visual = VisionTower(self.config.vision_config)
        with self._mark_language_model(vllm_config):
            self.language_model = self.text_model_class(vllm_config=vllm_config)

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        return placeholder_str(modality)

    def embed_multimodal(self, **kwargs: object) -> tuple[torch.Tensor, ...]:
        """The merged embeddings ``[t*h*w / m^2, H]`` of each image, then each video, of the batch."""
        embeddings: list[torch.Tensor] = []
        for pixels_key, grid_key in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
            pixel_values, grid_thw = kwargs.get(pixels_key), kwargs.get(grid_key)
            if pixel_values is None:
                continue
            if isinstance(pixel_values, (list, tuple)):
                pixel_values = torch.cat(list(pixel_values))
            if isinstance(grid_thw, (list, tuple)):
                grid_thw = torch.stack(list(grid_thw))
            grid = vision_grid_inputs(grid_thw, self.visual.spatial_merge_size, self.visual.num_grid_per_side)
            embeddings += self.visual.forward_grid(pixel_values, grid).split(grid.merged_lengths)
        return tuple(embeddings)

    def get_mrope_input_positions(
        self, input_tokens: list[int], mm_features: list[MultiModalFeatureSpec]
    ) -> tuple[torch.Tensor, int]:
        """``[3, T]`` M-RoPE positions of a prompt and the decode delta (see :func:`prompt_mrope_positions`)."""
        vision_token_ids = {"image": self.config.image_token_id, "video": self.config.video_token_id}
        return prompt_mrope_positions(input_tokens, mm_features, vision_token_ids,
                                      self.config.vision_config.spatial_merge_size)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        """[T] ids (or [T, H] embeddings with the images scattered in) and [T] or [3, T] positions -> [T, H]."""
        return self.language_model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.language_model.compute_logits(hidden_states)

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig):
        return cls.text_model_class.get_mamba_state_shape_from_config(vllm_config)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig):
        return cls.text_model_class.get_mamba_state_dtype_from_config(vllm_config)

    @classmethod
    def get_mamba_state_copy_func(cls):
        return cls.text_model_class.get_mamba_state_copy_func()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Vision tensors to the tower (skipped when vLLM built none), the rest to the text model."""
        has_tower = isinstance(self.visual, VisionTower)
        tower_params = dict(self.visual.named_parameters()) if has_tower else {}
        loaded: set[str] = set()

        def text_weights():
            for checkpoint_name, tensor in weights:
                name = vision_tensor_name(checkpoint_name)
                if name is None:
                    yield checkpoint_name, tensor
                elif has_tower:
                    if name not in tower_params:
                        raise ValueError(f"checkpoint tensor {checkpoint_name!r} has no parameter {name!r} in the "
                                         f"vision tower (is vision_config right?)")
                    default_weight_loader(tower_params[name], tensor)
                    loaded.add(f"visual.{name}")
                else:
                    yield checkpoint_name, tensor  # the text model counts and skips it

        loaded |= {f"language_model.{name}" for name in self.language_model.load_weights(text_weights())}
        return loaded


class Qwen3_5MoeForConditionalGeneration(Qwen3_5ForConditionalGeneration):
    """A Qwen3.5-MoE vision-language checkpoint: the vision tower and the MoE text decoder."""

    text_model_class = Qwen3_5MoeForCausalLM


class Qwen3NextForCausalLM(Qwen3_5ForCausalLM):
    """Qwen3-Next: the same layers, GDN projections packed per key-head group in the checkpoint."""
