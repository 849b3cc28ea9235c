"""Qwen3.5 feed-forward blocks with plain per-rank weights (intermediate dimension sharded)."""

import torch
import torch.nn.functional as F
from torch import nn

from vllm_gdn_neuron.model.mlp import gated_shared_expert, softmax_top_k, swiglu
from vllm_gdn_neuron.model.routed_experts import routed_expert_mixture


class NeuronSwiGLU(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` on this rank's I / tp slice (partial sums).

    Parameters: ``gate_up_proj.weight [2 * I / tp, H]`` (gate | up parts, merged as in
    :mod:`vllm_gdn_neuron.model.parameters`), ``down_proj.weight [H, I / tp]``.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, H] -> [T, H]``, this rank's share (the caller all-reduces)."""
        return self.down_proj(swiglu(self.gate_up_proj(x)))


class NeuronExperts(nn.Module):
    """The routed experts, stacked: ``gate_up_proj [E, 2 * I / tp, H]``, ``down_proj [E, H, I / tp]``."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size, dtype=dtype))

    def stacks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(gate_up_proj, down_proj)`` as the routed experts read them (:class:`.fp8.Fp8Experts` has the same)."""
        return self.gate_up_proj, self.down_proj


class NeuronSparseMoE(nn.Module):
    """Top-k routed experts plus the sigmoid-gated shared expert (partial sums over ranks).

    The routed experts read and compute only the chosen ones
    (:func:`vllm_gdn_neuron.model.routed_experts.routed_expert_mixture`: gathered per
    assignment in decode-sized buckets, grouped into expert blocks in prefill-sized ones).

    Parameters (checkpoint names): ``gate.weight [E, H]``, ``experts.*``,
    ``shared_expert.*``, ``shared_expert_gate.weight [1, H]``.
    """

    def __init__(self, config, tp_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.top_k = config.num_experts_per_tok
        self.renormalize = bool(getattr(config, "norm_topk_prob", True))
        self.gate = nn.Linear(hidden, config.num_experts, bias=False, dtype=dtype)
        self.experts = NeuronExperts(config.num_experts, hidden, config.moe_intermediate_size // tp_size, dtype)
        self.shared_expert = NeuronSwiGLU(hidden, config.shared_expert_intermediate_size // tp_size, dtype)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = softmax_top_k(self.gate(x), self.top_k, self.renormalize)
        routed = routed_expert_mixture(x, weights, experts, *self.experts.stacks())
        return routed + gated_shared_expert(self.shared_expert(x), F.linear(x, self.shared_expert_gate.weight))
