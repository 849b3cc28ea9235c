"""Gated full attention of Qwen3.5, less the attention itself (which each shell runs on its cache).

```
qkv [T, (2*Hq + 2*Hkv) * D] = [q|gate per query head (2*D each) | k | v]
q, k --zero-centred RMSNorm per head--> --partial RoPE--> attention(q, k, v) over the cache
out * sigmoid(gate) --o_proj--> [T, H]
```
"""

import torch
from torch import nn

from vllm_gdn_neuron.model.norms import ZeroCentredRMSNorm
from vllm_gdn_neuron.model.rotary import PartialRotaryEmbedding


def check_attention_heads(config, tp_size: int) -> None:
    """Refuse head counts the tensor-parallel split cannot serve.

    Raises:
        ValueError: unless ``tp_size`` divides ``num_attention_heads`` and divides, or is
            a multiple of, ``num_key_value_heads`` (KV heads are then replicated).
    """
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % tp_size or (kv_heads % tp_size and tp_size % kv_heads):
        raise ValueError(
            f"tensor_parallel_size must divide num_attention_heads={heads} and divide or be a multiple "
            f"of num_key_value_heads={kv_heads}; got tensor_parallel_size={tp_size}"
        )


class GatedAttentionMath(nn.Module):
    """The per-token math around Qwen3.5's attention: q/gate split, q/k norms, RoPE, output gate.

    Dimensions:
        T: tokens; Hq / Hkv: query / key-value heads on this rank; D: ``head_dim``.

    Args:
        config: Hugging Face text config (``head_dim``, ``rms_norm_eps``, ``rope_parameters``).
        num_heads, num_kv_heads: Hq and Hkv on this rank.

    Parameters: ``q_norm.weight``, ``k_norm.weight`` [D] (checkpoint names).
    """

    def __init__(self, config, num_heads: int, num_kv_heads: int) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.q_norm = ZeroCentredRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = ZeroCentredRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.rotary_emb = PartialRotaryEmbedding(self.head_dim, config.rope_parameters or {})

    def split_and_rotate(self, positions: torch.Tensor, q_gate: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Project-side math.

        Args:
            positions: ``[T]`` token positions, or ``[3, T]`` M-RoPE positions (see ``rotary.py``).
            q_gate: ``[T, Hq * 2 * D]`` (per head: D query dims, then D gate dims).
            k, v: ``[T, Hkv * D]``.

        Returns:
            ``(q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], gate [T, Hq * D])``, q and k
            normalised and rotated.
        """
        tokens = q_gate.shape[0]
        q, gate = q_gate.view(tokens, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q)
        k = self.k_norm(k.reshape(tokens, self.num_kv_heads, self.head_dim))
        q, k = self.rotary_emb(positions, q, k)
        return q, k, v.reshape(tokens, self.num_kv_heads, self.head_dim), gate.reshape(tokens, -1)

    @staticmethod
    def gate_output(out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``out * sigmoid(gate)``, both ``[T, Hq * D]``, in the activation dtype."""
        return out * torch.sigmoid(gate)
