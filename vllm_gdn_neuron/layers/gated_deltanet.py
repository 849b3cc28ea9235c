"""The GatedDeltaNet token mixer of Qwen3.5 / Qwen3-Next as a vLLM mamba-style layer.

One forward runs one engine step over a batch that vLLM orders decodes first:

```
hidden [T, H] --in_proj_qkvz--> q|k|v [T, C], z [T, Hv*Dv]   --in_proj_ba--> b, a [T, Hv]
  decode tokens   : conv1d_decode + gdn_decode   on the cache slots, in place
  prefill tokens  : conv1d_prefill + gdn_prefill from the slots' states (zeros for new
                    sequences), final states written back to the slots
o [T, Hv, Dv] --GatedRMSNorm(z)--> out_proj --> [T, H]
```

The GDN math lives in ``vllm_gdn_neuron.ops`` (the one seam to the kernels); this
module only projects, gates, moves states between the cache and the ops, and
normalises. Heads are sharded over tensor-parallel ranks by vLLM's parallel linear
layers; each rank holds ``Hk / tp`` key heads and their ``Hv / tp`` value heads.
"""

import torch
import torch.nn.functional as F
from torch import nn

from vllm.config import VllmConfig, get_current_vllm_config
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.utils import set_weight_attrs
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.layers.gated_rmsnorm import GatedRMSNorm
from vllm_gdn_neuron.layers.gdn_cache import gdn_state_dtypes, gdn_state_shapes


def _rank_slice(size: int, tp_size: int, tp_rank: int) -> slice:
    """The contiguous part of ``size`` rows that one tensor-parallel rank owns."""
    part = size // tp_size
    return slice(tp_rank * part, (tp_rank + 1) * part)


class GatedDeltaNet(nn.Module, MambaBase):
    """Qwen3.5 GatedDeltaNet layer whose states live in vLLM's mamba cache.

    Dimensions:
        T: tokens in the step; H: hidden size; Hk / Hv: key / value heads on this
        rank; Dk / Dv: key / value head sizes; C = 2*Hk*Dk + Hv*Dv conv channels;
        K: conv kernel width.

    Args:
        config: Hugging Face text config (``linear_*``, ``hidden_size``, ``rms_norm_eps``).
        vllm_config: the engine config (dtypes of the states, TP size).
        prefix: the layer's dotted name; it keys the step's attention metadata.

    Parameters (checkpoint names, after the model's loader maps them):
        in_proj_qkvz.weight [2*Hk*Dk + 2*Hv*Dv, H] shards (q, k, v, z);
        in_proj_ba.weight [2*Hv, H] shards (b, a); conv1d.weight [C, K];
        A_log, dt_bias [Hv] float32; norm.weight [Dv]; out_proj.weight [H, Hv*Dv].
    """

    def __init__(self, config, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.text_config = config
        self.model_dtype = vllm_config.model_config.dtype
        self.cache_config = vllm_config.cache_config

        total_k_heads = config.linear_num_key_heads
        total_v_heads = config.linear_num_value_heads
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        self.num_k_heads = total_k_heads // self.tp_size
        self.num_v_heads = total_v_heads // self.tp_size
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_kernel = config.linear_conv_kernel_dim
        total_key_dim = total_k_heads * self.head_k_dim
        total_value_dim = total_v_heads * self.head_v_dim

        self.in_proj_qkvz = MergedColumnParallelLinear(
            config.hidden_size,
            [total_key_dim, total_key_dim, total_value_dim, total_value_dim],
            bias=False,
            prefix=f"{prefix}.in_proj_qkvz",
        )
        self.in_proj_ba = MergedColumnParallelLinear(
            config.hidden_size, [total_v_heads, total_v_heads], bias=False, prefix=f"{prefix}.in_proj_ba"
        )
        self.conv1d = _ConvWeight(
            (total_key_dim, total_key_dim, total_value_dim), self.conv_kernel, self.tp_size, self.tp_rank
        )
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads, dtype=torch.float32))
        for head_param in (self.A_log, self.dt_bias):
            set_weight_attrs(head_param, {"weight_loader": self._load_head_vector})
        self.norm = GatedRMSNorm(self.head_v_dim, eps=config.rms_norm_eps)
        self.out_proj = RowParallelLinear(
            total_value_dim, config.hidden_size, bias=False, input_is_parallel=True, prefix=f"{prefix}.out_proj"
        )

        # vLLM finds attention-like layers (and binds their cache) through this table.
        static_forward_context = get_current_vllm_config().compilation_config.static_forward_context
        if prefix in static_forward_context:
            raise ValueError(f"duplicate layer name {prefix!r}")
        static_forward_context[prefix] = self

    # --- MambaBase: what the cache holds for this layer -------------------------------

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.GDN_ATTN

    def get_state_shape(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        return gdn_state_shapes(self.text_config, self.tp_size)

    def get_state_dtype(self) -> tuple[torch.dtype, torch.dtype]:
        return gdn_state_dtypes(
            self.model_dtype, self.cache_config.mamba_cache_dtype, self.cache_config.mamba_ssm_cache_dtype
        )

    # --- forward ----------------------------------------------------------------------

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Mix the tokens of one engine step.

        Args:
            hidden_states: [T, H] in the model dtype.

        Returns:
            [T, H] in the model dtype.
        """
        num_tokens = hidden_states.shape[0]
        qkvz, _ = self.in_proj_qkvz(hidden_states)
        ba, _ = self.in_proj_ba(hidden_states)
        qkv, z = qkvz.split([2 * self.key_dim + self.value_dim, self.value_dim], dim=-1)
        b, a = ba.split([self.num_v_heads, self.num_v_heads], dim=-1)

        core = torch.zeros(num_tokens, self.num_v_heads, self.head_v_dim, dtype=qkv.dtype, device=qkv.device)
        metadata = get_forward_context().attn_metadata
        step = metadata.get(self.prefix) if isinstance(metadata, dict) else None
        if step is not None:  # None during vLLM's profiling run: no cache yet
            self._mix(step, qkv, a, b, core)

        out = self.norm(core, z.view(num_tokens, self.num_v_heads, self.head_v_dim))
        out, _ = self.out_proj(out.view(num_tokens, self.value_dim))
        return out

    def _mix(self, step, qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, core: torch.Tensor) -> None:
        """Run the decode and prefill parts of the step, writing ``core`` [T, Hv, Dv]."""
        conv_cache, ssm_cache = self.kv_cache
        weight = self.conv1d.weight
        num_decodes = step.num_decodes
        if num_decodes:
            slots = step.non_spec_state_indices_tensor[:num_decodes]
            x = ops.conv1d_decode(qkv[:num_decodes], weight, conv_cache, slots)
            q, k, v = self._split_heads(x)
            g, beta = self._gates(a[:num_decodes], b[:num_decodes])
            core[:num_decodes] = self._decode_recurrence(q, k, v, g, beta, ssm_cache, slots)
        num_prefills = step.num_prefills
        if num_prefills:
            start = step.num_decode_tokens
            stop = start + step.num_prefill_tokens
            slots = step.prefill_state_indices[:num_prefills]
            fresh = ~step.prefill_has_initial_state[:num_prefills]
            cu_seqlens = step.prefill_query_start_loc[: num_prefills + 1]

            conv_init = conv_cache[slots]
            conv_init[fresh] = 0
            x, conv_final = ops.conv1d_prefill(qkv[start:stop], weight, cu_seqlens, initial_state=conv_init)
            conv_cache[slots] = conv_final.to(conv_cache.dtype)

            q, k, v = self._split_heads(x)
            g, beta = self._gates(a[start:stop], b[start:stop])
            ssm_init = ssm_cache[slots].float()
            ssm_init[fresh] = 0
            o, ssm_final = ops.gdn_prefill(
                q, k, v, g, beta, cu_seqlens, initial_state=ssm_init, use_qk_l2norm=True
            )
            ssm_cache[slots] = ssm_final.to(ssm_cache.dtype)
            core[start:stop] = o

    @staticmethod
    def _decode_recurrence(q, k, v, g, beta, ssm_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """One recurrent step per sequence; the state rows are updated in place.

        The ops keep the recurrent state in float32; a cache in another dtype (asked
        for with ``--mamba-ssm-cache-dtype``) is staged through float32 rows.
        """
        if ssm_cache.dtype == torch.float32:
            return ops.gdn_decode(q, k, v, g, beta, ssm_cache, slots, use_qk_l2norm=True)
        staged = ssm_cache[slots].float()
        rows = torch.arange(staged.shape[0], dtype=slots.dtype, device=slots.device)
        o = ops.gdn_decode(q, k, v, g, beta, staged, rows, use_qk_l2norm=True)
        ssm_cache[slots] = staged.to(ssm_cache.dtype)
        return o

    def _split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[N, C] conv output -> q, k [N, Hk, Dk] and v [N, Hv, Dv] (views)."""
        n = x.shape[0]
        q, k, v = x.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return (
            q.view(n, self.num_k_heads, self.head_k_dim),
            k.view(n, self.num_k_heads, self.head_k_dim),
            v.view(n, self.num_v_heads, self.head_v_dim),
        )

    def _gates(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, both [N, Hv] fp32."""
        g = -torch.exp(self.A_log) * F.softplus(a.float() + self.dt_bias)
        return g, torch.sigmoid(b.float())

    def _load_head_vector(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Load this rank's heads of a per-value-head vector (``A_log``, ``dt_bias``)."""
        rows = _rank_slice(loaded_weight.shape[0], self.tp_size, self.tp_rank)
        param.data.copy_(loaded_weight[rows])


class _ConvWeight(nn.Module):
    """The depthwise conv kernel ``weight`` [C_local, K] of this rank's q|k|v channels.

    The checkpoint stores ``[C, 1, K]`` (``nn.Conv1d``) over all heads, channels in
    q | k | v order; each rank keeps its slice of each of the three parts.
    """

    def __init__(self, part_sizes: tuple[int, int, int], kernel: int, tp_size: int, tp_rank: int) -> None:
        super().__init__()
        self.part_sizes = part_sizes
        self.tp_size, self.tp_rank = tp_size, tp_rank
        local = sum(part_sizes) // tp_size
        self.weight = nn.Parameter(torch.empty(local, kernel))
        set_weight_attrs(self.weight, {"weight_loader": self._load})

    def _load(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        full = loaded_weight.reshape(sum(self.part_sizes), -1)
        parts = full.split(list(self.part_sizes), dim=0)
        local = [part[_rank_slice(part.shape[0], self.tp_size, self.tp_rank)] for part in parts]
        param.data.copy_(torch.cat(local, dim=0))
