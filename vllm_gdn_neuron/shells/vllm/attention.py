"""The vLLM shell of Qwen3.5's gated attention: vLLM's parallel projections and paged attention.

The per-token math (q/gate split, zero-centred q/k norms, partial RoPE, output gate) is
:class:`vllm_gdn_neuron.model.attention.GatedAttentionMath`, shared with the Neuron shell.
"""

import torch

from vllm.config import CacheConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear

from vllm_gdn_neuron.model.attention import GatedAttentionMath, check_attention_heads
from vllm_gdn_neuron.shells.vllm.quantization import QuantConfigFor, unquantized


class GatedAttention(GatedAttentionMath):
    """Full softmax attention with the Qwen3.5 output gate, over vLLM's paged KV cache.

    Dimensions:
        T: tokens; H: hidden size; Hq / Hkv: query / key-value heads on this rank;
        D: ``head_dim``.

    Args:
        config: Hugging Face text config (``num_attention_heads``, ``num_key_value_heads``,
            ``head_dim``, ``rope_parameters`` with ``partial_rotary_factor``, ``rms_norm_eps``).
        cache_config: vLLM cache config of the paged KV cache.
        prefix: the layer's dotted name (``model.layers.N.self_attn``).
        quant_config: a module's name -> vLLM's quantization config for it (None: unquantized).
    """

    def __init__(self, config, cache_config: CacheConfig | None, prefix: str,
                 quant_config: QuantConfigFor = unquantized) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        check_attention_heads(config, tp_size)
        total_heads = config.num_attention_heads
        total_kv_heads = config.num_key_value_heads
        super().__init__(config, total_heads // tp_size, max(1, total_kv_heads // tp_size))
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

        # The "q" shard holds query and gate interleaved per head, as in the checkpoint.
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            2 * total_heads,
            total_kv_heads,
            bias=getattr(config, "attention_bias", False),
            quant_config=quant_config(f"{prefix}.qkv_proj"),
            prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            total_heads * self.head_dim, config.hidden_size, bias=False, quant_config=quant_config(f"{prefix}.o_proj"),
            prefix=f"{prefix}.o_proj"
        )
        self.attn = Attention(
            self.num_heads,
            self.head_dim,
            self.head_dim**-0.5,
            num_kv_heads=self.num_kv_heads,
            cache_config=cache_config,
            prefix=f"{prefix}.attn",
        )

    def forward(self, hidden_states: torch.Tensor, step) -> torch.Tensor:
        """Attend.

        Args:
            hidden_states: [T, H].
            step: the forward's :class:`~.step.EngineStep` (``positions``: [T] or [3, T] int64).

        Returns:
            [T, H].
        """
        num_tokens = hidden_states.shape[0]
        qkv, _ = self.qkv_proj(hidden_states)
        q_gate, k, v = qkv.split([2 * self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k, v, gate = self.split_and_rotate(step.positions, q_gate, k, v)
        out = self.attn(q.reshape(num_tokens, self.q_size), k.reshape(num_tokens, self.kv_size),
                        v.reshape(num_tokens, self.kv_size))
        out, _ = self.o_proj(self.gate_output(out, gate))
        return out
