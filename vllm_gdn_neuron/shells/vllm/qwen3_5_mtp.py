"""The multi-token-prediction (MTP) drafter of Qwen3.5 (dense and MoE) and Qwen3-Next for vLLM.

vLLM's speculative config maps ``method: "mtp"`` on a Qwen3.5 / Qwen3.5-MoE / Qwen3-Next
target to the drafter architectures ``Qwen3_5MTP`` / ``Qwen3_5MoeMTP`` / ``Qwen3NextMTP``,
built from the target's own checkpoint and config; the plugin registers this module's
classes under those names. The head's math is :mod:`vllm_gdn_neuron.model.mtp`; its
decoder layer is the target's :class:`HybridDecoderLayer` (full attention over the drafter's
own KV cache, layer 0's feed-forward rule), all TP-sharded like the target.

vLLM's proposer shares the target's ``model.embed_tokens`` and ``lm_head`` with the
drafter after loading (an MTP drafter has no ``has_own_embed_tokens``), so the copies
loaded here from the checkpoint are dropped then.
"""

import torch
from torch import nn

from vllm.config import VllmConfig
from vllm.model_executor.layers.linear import ColumnParallelLinear
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
from vllm.sequence import IntermediateTensors

from vllm_gdn_neuron.model.checkpoint import mtp_tensor_name
from vllm_gdn_neuron.model.mtp import MTPInputNorms, check_mtp_config, mtp_num_layers
from vllm_gdn_neuron.model.norms import ZeroCentredRMSNorm
from vllm_gdn_neuron.shells.vllm.qwen3_5 import HybridDecoderLayer, WithLMHead


class MultiTokenPredictor(nn.Module):
    """The MTP head (``mtp.*`` in the checkpoint) with the embedding it reads.

    Dimensions:
        T: tokens; H: hidden size.
    """

    def __init__(self, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_text_config
        check_mtp_config(config)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.input_norms = MTPInputNorms(config.hidden_size, config.rms_norm_eps)
        self.fc = ColumnParallelLinear(2 * config.hidden_size, config.hidden_size, bias=False, gather_output=True,
                                       prefix=f"{prefix}.fc")
        self.layers = nn.ModuleList(
            HybridDecoderLayer(vllm_config, idx, prefix=f"{prefix}.layers.{idx}", layer_type="full_attention")
            for idx in range(mtp_num_layers(config))
        )
        self.norm = ZeroCentredRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        """[T] ids of the tokens at i + 1 (or their [T, H] embeddings), [T] positions i and the
        target's [T, H] final hidden states at i -> [T, H] draft hidden states."""
        embeds = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        x, _ = self.fc(self.input_norms(embeds, hidden_states))
        x, residual = self.layers[0](positions, x, None)
        x, _ = self.norm(x, residual)
        return x


class Qwen3_5MTP(WithLMHead):
    """The MTP drafter of a Qwen3.5 target (any of its checkpoint layouts)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config, MultiTokenPredictor(vllm_config, prefix="mtp"))

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        """See :meth:`MultiTokenPredictor.forward`."""
        return self.model(input_ids, positions, hidden_states, inputs_embeds)

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
