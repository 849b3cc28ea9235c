"""The GatedDeltaNet token mixer of Qwen3.5 / Qwen3-Next: the math both shells run.

One call mixes one engine step whose tokens come verify rows first (speculative decoding),
then decodes, then prefills:

```
qkv [T, C], a, b [T, Hv]  (projected by the shell)
  verify tokens  : paged_conv1d_verify + paged_gdn_verify   from the page of each row's last
                   accepted token, the state after each token to its draft position's page
  decode rows    : paged_conv1d_decode + paged_gdn_decode   on their cache pages
  prefill tokens : paged_conv1d_prefill + paged_gdn_prefill from their pages' states
                   (zeros for new sequences), final states written back to the pages
core [T, Hv, Dv] --GatedRMSNorm(z)--> (the shell's out_proj)
```

The recurrences, the conv and the cache reads / writes are the layer's phases
(``vllm_gdn_neuron.ops.phases``); this module only splits heads and routes each part's tokens
and raw gating ``(a, b, A_log, dt_bias)`` to its phases, which compute the gates
(``vllm_gdn_neuron.ops.gating``) or hand them to a kernel that does. The shells adapt their
engine's metadata into ``ops.DecodeStep`` / ``ops.PrefillStep`` and their cache into
``[P, C, K]`` conv and ``[P, Hv, Dk, Dv]`` recurrent pages.
"""

from dataclasses import dataclass

import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.model.dims import GDNDims
from vllm_gdn_neuron.ops.phases import TORCH_PHASES, GDNPhases


@dataclass
class GDNCaches:
    """One layer's state pages: ``conv [P, C, K]`` and ``ssm [P, Hv, Dk, Dv]`` (see ``ops.paged``)."""

    conv: torch.Tensor
    ssm: torch.Tensor


def gdn_mix(
    dims: GDNDims,
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    caches: GDNCaches,
    decode: "ops.DecodeStep | None",
    prefill: "ops.PrefillStep | None",
    *,
    verify: "ops.VerifyStep | None" = None,
    phases: GDNPhases = TORCH_PHASES,
) -> torch.Tensor:
    """Run the verify tokens, the decode rows, then the prefill tokens, of one step; the pages
    advance in place.

    Dimensions:
        T: the step's tokens = ``verify.num_tokens`` verify tokens, then N decode rows, then
        ``prefill.num_tokens`` prefill tokens, then (the shell's padding) tokens of none.

    Args:
        dims: this rank's head layout.
        qkv: ``[T, C]`` in the model dtype; a, b: ``[T, Hv]``.
        conv_weight: ``[C, K]``; A_log, dt_bias: ``[Hv]`` float32.
        caches: the layer's pages.
        decode, prefill, verify: the step's metadata (None for a part with no tokens).
        phases: the layer's paged op of each phase (``ops.phases.resolve_phases``, resolved
            when the layer was built); the torch math by default.

    Returns:
        ``core [T, Hv, Dv]`` in qkv's dtype; zeros for tokens of neither part.
    """
    parts = []
    start = 0
    step_parts = (
        (verify, verify.num_tokens if verify else 0, phases.conv_verify, phases.gdn_verify),
        (decode, decode.num_rows if decode else 0, phases.conv_decode, phases.gdn_decode),
        (prefill, prefill.num_tokens if prefill else 0, phases.conv_prefill, phases.gdn_prefill),
    )
    for step, size, conv_op, gdn_op in step_parts:
        if step is None:
            continue
        stop = start + size
        x, a_part, b_part = (t if (start, stop) == (0, t.shape[0]) else t[start:stop] for t in (qkv, a, b))
        q, k, v = dims.split_heads(conv_op(x, conv_weight, caches.conv, step))
        parts.append(gdn_op(q, k, v, a_part, b_part, A_log, dt_bias, caches.ssm, step, use_qk_l2norm=True))
        start = stop
    rest = qkv.shape[0] - start
    if rest or not parts:
        parts.append(qkv.new_zeros(rest, dims.num_v_heads, dims.head_v_dim))
    return torch.cat(parts) if len(parts) > 1 else parts[0]
