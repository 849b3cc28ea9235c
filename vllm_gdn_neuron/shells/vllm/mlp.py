"""The vLLM shell of Qwen3.5's feed-forward blocks: vLLM's parallel linears and fused MoE.

The math (SwiGLU, the gated shared expert) is :mod:`vllm_gdn_neuron.model.mlp`; the
routed experts run in vLLM's fused MoE (its top-k softmax routing, renormalised).
"""

import torch
from torch import nn

from vllm.model_executor.layers.fused_moe import FusedMoEFactory
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear

from vllm_gdn_neuron.model.mlp import gated_shared_expert, swiglu
from vllm_gdn_neuron.shells.vllm.quantization import QuantConfigFor, unquantized


class SwiGLUMLP(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))``; gate and up are one merged projection.

    Args:
        hidden_size: H.
        intermediate_size: I (the full size; each TP rank holds I / tp).
        prefix: dotted name, e.g. ``model.layers.N.mlp``.
        quant_config: a module's name -> vLLM's quantization config for it (None: unquantized).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, prefix: str,
                 quant_config: QuantConfigFor = unquantized) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias=False, quant_config=quant_config(f"{prefix}.gate_up_proj"),
            prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False,
                                           quant_config=quant_config(f"{prefix}.down_proj"), prefix=f"{prefix}.down_proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, H]."""
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(swiglu(gate_up))
        return out


class SparseMoE(nn.Module):
    """Top-k routed experts (vLLM's fused MoE) plus a sigmoid-gated shared expert.

    ``out = experts(x, softmax-top-k of gate(x), renormalised)
            + sigmoid(shared_expert_gate(x)) * shared_expert(x)``

    Args:
        config: Hugging Face MoE text config (``num_experts``, ``num_experts_per_tok``,
            ``moe_intermediate_size``, ``shared_expert_intermediate_size``).
        prefix: dotted name, e.g. ``model.layers.N.mlp``.
        quant_config: a module's name -> vLLM's quantization config for it (None: unquantized); the
            router and the shared expert's gate are never quantized.
    """

    def __init__(self, config, prefix: str,
                 quant_config: QuantConfigFor = unquantized) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(config.hidden_size, config.num_experts, bias=False, prefix=f"{prefix}.gate")
        self.experts = FusedMoEFactory(
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            hidden_size=config.hidden_size,
            intermediate_size=config.moe_intermediate_size,
            renormalize=getattr(config, "norm_topk_prob", True),
            reduce_results=True,
            quant_config=quant_config(f"{prefix}.experts"),
            prefix=f"{prefix}.experts",
        )
        self.shared_expert = SwiGLUMLP(
            config.hidden_size, config.shared_expert_intermediate_size, prefix=f"{prefix}.shared_expert",
            quant_config=quant_config,
        )
        self.shared_expert_gate = ReplicatedLinear(
            config.hidden_size, 1, bias=False, prefix=f"{prefix}.shared_expert_gate"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, H]."""
        router_logits, _ = self.gate(x)
        routed = self.experts(hidden_states=x, router_logits=router_logits)
        shared_gate, _ = self.shared_expert_gate(x)
        return routed + gated_shared_expert(self.shared_expert(x), shared_gate)
