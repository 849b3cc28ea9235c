"""Qwen3.5 (dense and MoE) and Qwen3-Next hybrid decoders for vLLM.

Every layer is a token mixer (GatedDeltaNet for ``linear_attention`` layers, gated
full attention for ``full_attention`` layers, per ``config.layer_types``) followed by
a feed-forward block (dense SwiGLU, or the routed experts + shared expert on the
layers the config marks sparse), each behind a zero-centred RMSNorm with the
residual added in the norm:

```
x = embed(ids)
for layer:  h, r = norm_in(x, r); h = mixer(h); h, r = norm_post(h, r); x = ffn(h)
logits = lm_head(norm(x, r))          # lm_head is embed_tokens when the config ties them
```

The model classes differ only in how the checkpoint is laid out (see ``weights.py``).
"""

from collections.abc import Iterable

import torch
from torch import nn

from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.mamba.mamba_utils import MambaCopySpec
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid
from vllm.sequence import IntermediateTensors

from vllm_gdn_neuron.layers.checkpoint import MTP_PREFIX, text_tensor_name
from vllm_gdn_neuron.layers.dims import is_sparse_layer
from vllm_gdn_neuron.layers.gdn_cache import gdn_state_dtypes, gdn_state_shapes
from vllm_gdn_neuron.layers.norms import ZeroCentredRMSNorm
from vllm_gdn_neuron.models.attention import GatedAttention
from vllm_gdn_neuron.models.gated_deltanet import GatedDeltaNet
from vllm_gdn_neuron.models.mlp import SparseMoE, SwiGLUMLP
from vllm_gdn_neuron.models.weights import plan_loads

# Under the "vllm" logger so vLLM's log configuration prints it.
logger = init_logger(f"vllm.plugins.{__name__}")

class HybridDecoderLayer(nn.Module):
    """One Qwen3.5 block: token mixer + feed-forward, pre-norm, fused residual adds."""

    def __init__(self, vllm_config: VllmConfig, layer_idx: int, prefix: str, layer_type: str | None = None) -> None:
        """``layer_type`` overrides ``config.layer_types[layer_idx]`` (the MTP head's layer is
        full attention with layer 0's feed-forward rule)."""
        super().__init__()
        config = vllm_config.model_config.hf_text_config
        self.layer_type = layer_type or config.layer_types[layer_idx]
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(config, vllm_config, prefix=f"{prefix}.linear_attn")
        elif self.layer_type == "full_attention":
            self.self_attn = GatedAttention(config, vllm_config.cache_config, prefix=f"{prefix}.self_attn")
        else:
            raise ValueError(
                f"layer_types[{layer_idx}] must be 'linear_attention' or 'full_attention'; got {self.layer_type!r}"
            )
        if is_sparse_layer(config, layer_idx):
            self.mlp = SparseMoE(config, prefix=f"{prefix}.mlp")
        else:
            self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, prefix=f"{prefix}.mlp")
        self.input_layernorm = ZeroCentredRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCentredRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, H] hidden states and residual in, the same out (residual not yet added)."""
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        if self.layer_type == "linear_attention":
            hidden_states = self.linear_attn(hidden_states)
        else:
            hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class HybridModel(nn.Module):
    """Embeddings, the decoder layers and the final norm (``model.*`` in the checkpoint)."""

    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_text_config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            HybridDecoderLayer(vllm_config, idx, prefix=f"{prefix}.layers.{idx}")
            for idx in range(config.num_hidden_layers)
        )
        self.norm = ZeroCentredRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor | None, positions: torch.Tensor, inputs_embeds: torch.Tensor | None
    ) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


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
    """Loads Hugging Face checkpoint tensors (either GDN layout, sharded or not) into a module's
    vLLM parameters; the module names which tensors it takes (:meth:`checkpoint_tensor_name`)
    and sets ``config`` (the text config) and ``tie_word_embeddings``."""

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
        for checkpoint_name, tensor in weights:
            name = self.checkpoint_tensor_name(checkpoint_name)
            if name is None:
                skipped.append(checkpoint_name)
                continue
            if self.tie_word_embeddings and name.startswith("lm_head."):
                continue
            if ".mlp.experts." in name:
                loaded |= self._load_experts(name, tensor)
                continue
            for param_name, shard, part in plan_loads(name, tensor, self.config):
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


class WithLMHead(CheckpointLoader, nn.Module):
    """A ``model`` (with ``embed_tokens``) under the LM head, tied to the embedding when the
    checkpoint's config says so: the target models and the MTP drafters alike."""

    def __init__(self, vllm_config: VllmConfig, model: nn.Module) -> None:
        super().__init__()
        self.config = vllm_config.model_config.hf_text_config
        self.model = model
        self.tie_word_embeddings = bool(getattr(vllm_config.model_config.hf_config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(self.config.vocab_size, self.config.hidden_size, prefix="lm_head")
        if self.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(self.config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)


class Qwen3_5ForCausalLM(WithLMHead, HasInnerState, IsHybrid):
    """Qwen3.5 text decoder with the LM head (``Qwen3_5ForCausalLM`` checkpoints).

    The same class serves the MoE variant (sparse layers come from the config) and,
    through :func:`plan_loads`, the Qwen3-Next packed GatedDeltaNet projections.
    """

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config, HybridModel(vllm_config, prefix="model"))

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        """[T] token ids (or [T, H] embeddings) and [T] positions -> [T, H] final hidden states."""
        return self.model(input_ids, positions, inputs_embeds)

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
            logger.info("vllm-gdn-neuron serves the text part only: skipped %d vision-tower tensors", vision)


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    """Qwen3.5-MoE text decoder (``Qwen3_5MoeForCausalLM`` checkpoints)."""


class Qwen3_5ForConditionalGeneration(Qwen3_5ForCausalLM):
    """The text part of a Qwen3.5 vision-language checkpoint; the vision tower is skipped."""


class Qwen3_5MoeForConditionalGeneration(Qwen3_5ForCausalLM):
    """The text part of a Qwen3.5-MoE vision-language checkpoint; the vision tower is skipped."""


class Qwen3NextForCausalLM(Qwen3_5ForCausalLM):
    """Qwen3-Next: the same layers, GDN projections packed per key-head group in the checkpoint."""
