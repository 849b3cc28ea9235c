"""Gated full attention of Qwen3.5: q/k RMSNorm, partial RoPE, a sigmoid output gate.

```
hidden [T, H] --qkv_proj--> q|gate [T, Hq, 2*D] (per head: D query, D gate), k, v [T, Hkv, D]
q, k --zero-centred RMSNorm per head--> --RoPE on the first rotary_dim dims-->
attn(q, k, v) over vLLM's paged KV cache --> * sigmoid(gate) --o_proj--> [T, H]
```
"""

import torch
from torch import nn

from vllm.config import CacheConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import GemmaRMSNorm
from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import get_rope

# Multimodal RoPE fields of the Qwen3.5 configs. Text-only positions are the same on
# all three M-RoPE axes, where M-RoPE reduces to the ordinary (partial) RoPE.
MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def text_rope_parameters(config) -> dict:
    """The config's ``rope_parameters`` without the multimodal M-RoPE fields."""
    return {k: v for k, v in (config.rope_parameters or {}).items() if k not in MROPE_KEYS}


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


class GatedAttention(nn.Module):
    """Full softmax attention with the Qwen3.5 output gate.

    Dimensions:
        T: tokens; H: hidden size; Hq / Hkv: query / key-value heads on this rank;
        D: ``head_dim``.

    Args:
        config: Hugging Face text config (``num_attention_heads``, ``num_key_value_heads``,
            ``head_dim``, ``rope_parameters`` with ``partial_rotary_factor``, ``rms_norm_eps``).
        cache_config: vLLM cache config of the paged KV cache.
        prefix: the layer's dotted name (``model.layers.N.self_attn``).
    """

    def __init__(self, config, cache_config: CacheConfig | None, prefix: str) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        check_attention_heads(config, tp_size)
        total_heads = config.num_attention_heads
        total_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.num_heads = total_heads // tp_size
        self.num_kv_heads = max(1, total_kv_heads // tp_size)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

        # The "q" shard holds query and gate interleaved per head, as in the checkpoint.
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            2 * total_heads,
            total_kv_heads,
            bias=getattr(config, "attention_bias", False),
            prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            total_heads * self.head_dim, config.hidden_size, bias=False, prefix=f"{prefix}.o_proj"
        )
        self.q_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.rotary_emb = get_rope(
            head_size=self.head_dim,
            max_position=config.max_position_embeddings,
            rope_parameters=text_rope_parameters(config),
        )
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            num_kv_heads=self.num_kv_heads,
            cache_config=cache_config,
            prefix=f"{prefix}.attn",
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """Attend.

        Args:
            positions: [T] int64 token positions.
            hidden_states: [T, H].

        Returns:
            [T, H].
        """
        num_tokens = hidden_states.shape[0]
        qkv, _ = self.qkv_proj(hidden_states)
        q_gate, k, v = qkv.split([2 * self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, gate = q_gate.view(num_tokens, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q.contiguous()).view(num_tokens, self.q_size)
        k = self.k_norm(k.reshape(num_tokens, self.num_kv_heads, self.head_dim)).view(num_tokens, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v)
        out = out * torch.sigmoid(gate.reshape(num_tokens, self.q_size))
        out, _ = self.o_proj(out)
        return out
