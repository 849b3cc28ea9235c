"""Feed-forward math of Qwen3.5: SwiGLU, softmax top-k routing, and the gated shared expert.

The vLLM shell runs the routed experts through vLLM's fused MoE; the Neuron shell
through :mod:`vllm_gdn_neuron.model.routed_experts` (only the chosen experts, static
shapes). :func:`dense_expert_mixture` (every expert over every token, weights zero where
a token did not pick the expert) is the reference those are held to.
"""

import torch
import torch.nn.functional as F


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``[..., 2 * I]`` (gate first) -> ``[..., I]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def softmax_top_k(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    """Route each token to its ``top_k`` experts.

    Args:
        router_logits: ``[T, E]``.
        top_k: experts per token.
        renormalize: rescale the kept probabilities to sum to one (``norm_topk_prob``).

    Returns:
        ``(weights [T, top_k] in the logits' dtype, experts [T, top_k] int64)``; the
        softmax runs in float32.
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), experts


def dense_expert_mixture(
    x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """Sum of the chosen experts' SwiGLU outputs, weighted, with static shapes.

    Experts are visited in index order and their weighted outputs summed in x's dtype,
    as the reference does; a token that did not pick an expert adds exactly zero.

    Args:
        x: ``[T, H]``.
        weights, experts: the routing of :func:`softmax_top_k`, ``[T, top_k]``.
        gate_up: ``[E, 2 * I, H]`` (gate rows first); down: ``[E, H, I]``.

    Returns:
        ``[T, H]`` in x's dtype.
    """
    num_experts = gate_up.shape[0]
    dense = torch.zeros(x.shape[0], num_experts, dtype=weights.dtype, device=x.device)
    dense = dense.scatter_add(1, experts, weights)
    out = torch.zeros_like(x)
    for expert in range(num_experts):
        hidden = swiglu(F.linear(x, gate_up[expert]))
        out = out + F.linear(hidden, down[expert]) * dense[:, expert : expert + 1]
    return out


def gated_shared_expert(shared_out: torch.Tensor, gate_logit: torch.Tensor) -> torch.Tensor:
    """``sigmoid(shared_expert_gate(x)) * shared_expert(x)``; gate_logit ``[T, 1]``."""
    return torch.sigmoid(gate_logit) * shared_out
