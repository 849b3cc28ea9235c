"""The multi-token-prediction (MTP) drafter of Qwen3.5 (dense and MoE) and Qwen3-Next for vLLM.

vLLM's speculative config maps ``method: "mtp"`` on a Qwen3.5 / Qwen3.5-MoE / Qwen3-Next
target to the drafter architectures ``Qwen3_5MTP`` / ``Qwen3_5MoeMTP`` / ``Qwen3NextMTP``,
built from the target's own checkpoint and config; the plugin registers this module's
classes under those names. The head is :class:`vllm_gdn_neuron.model.mtp.MultiTokenPredictor`
built from the target's vLLM parts (its decoder layer full attention over the drafter's own
KV cache, layer 0's feed-forward rule), all TP-sharded like the target.

vLLM's proposer shares the target's ``model.embed_tokens`` and ``lm_head`` with the
drafter after loading (an MTP drafter has no ``has_own_embed_tokens``), so the copies
loaded here from the checkpoint are dropped then.
"""

import torch

from vllm.config import VllmConfig
from vllm.sequence import IntermediateTensors

from vllm_gdn_neuron.model.causal_lm import CausalLM, ties_word_embeddings
from vllm_gdn_neuron.model.checkpoint import mtp_tensor_name
from vllm_gdn_neuron.model.mtp import MultiTokenPredictor
from vllm_gdn_neuron.shells.vllm.qwen3_5 import CheckpointLoader, VllmDecoderParts
from vllm_gdn_neuron.shells.vllm.step import EngineStep


class Qwen3_5MTP(CheckpointLoader, CausalLM):
    """The MTP drafter of a Qwen3.5 target (any of its checkpoint layouts) under the LM head."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        model_config = vllm_config.model_config
        config, parts = model_config.hf_text_config, VllmDecoderParts(vllm_config)
        super().__init__(config, parts, MultiTokenPredictor(config, parts, prefix="mtp"),
                         ties_word_embeddings(model_config.hf_config))
        self.take_checkpoint_config(model_config)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        """[T] ids of the tokens at i + 1 (or their [T, H] embeddings), [T] positions i and the
        target's [T, H] final hidden states at i -> [T, H] draft hidden states."""
        embeds = self.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        return self.model(embeds, hidden_states, EngineStep(positions))

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor | None:
        """The drafter's one head serves every draft step (``spec_step_idx``)."""
        return super().compute_logits(hidden_states)

    def checkpoint_tensor_name(self, checkpoint_name: str) -> str | None:
        name = mtp_tensor_name(checkpoint_name)
        if name is None:
            return None
        # The checkpoint's two pre-fc norms live in MTPInputNorms.
        for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden"):
            name = name.replace(f"model.{norm}.", f"model.input_norms.{norm}.")
        return name

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        if "model.fc.weight" not in loaded:
            raise ValueError(
                "speculative method 'mtp': the checkpoint has no MTP head (no mtp.fc.weight among its "
                "tensors); use a checkpoint that ships mtp.* tensors or another speculative method"
            )
        return loaded


class Qwen3_5MoeMTP(Qwen3_5MTP):
    """The MTP drafter of a Qwen3.5-MoE target (its MTP layer has the routed experts)."""


class Qwen3NextMTP(Qwen3_5MTP):
    """The MTP drafter of a Qwen3-Next target (packed GDN projections play no part in it)."""
