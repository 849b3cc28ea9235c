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

The recurrences, the conv and the cache reads / writes are the trace-safe paged ops of
``vllm_gdn_neuron.ops``; this module only splits heads and computes the gates. The
shells adapt their engine's metadata into ``ops.DecodeStep`` / ``ops.PrefillStep`` and
their cache into ``[P, C, K]`` conv and ``[P, Hv, Dk, Dv]`` recurrent pages.
"""

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.model.dims import GDNDims


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """``g = -exp(A_log) * softplus(a + dt_bias)`` (<= 0) and ``beta = sigmoid(b)``.

    Args:
        a, b: ``[N, Hv]`` projections, any float dtype.
        A_log, dt_bias: ``[Hv]`` float32.

    Returns:
        ``(g, beta)``, both ``[N, Hv]`` float32.
    """
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


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
    paged: bool = True,
    paged_ops=ops,
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
        decode, prefill, verify: the step's metadata (None for a part with no tokens). The
            verify part runs ``ops.paged_*_verify``: its recurrence on the backend
            ``paged_ops`` binds for it where that provider has one (a layer's
            ``LayerBackends``: the decode phase's), else the trace-safe torch math.
        paged: run the trace-safe paged ops (torch math; the only choice inside a compiled
            graph). False: the public ops, which dispatch to ``$VLLM_GDN_BACKEND`` (``nki``
            in its interpreter, ``vllm_cpu``) and check their inputs on the host at every
            call: eager engines only.
        paged_ops: the provider of the four paged ops: ``ops`` (torch math), or
            ``ops.paged_nki`` (the NKI kernels through their adapter, same signatures).

    Returns:
        ``core [T, Hv, Dv]`` in qkv's dtype; zeros for tokens of neither part.
    """
    parts = []
    start = 0
    step_parts = (
        (verify, verify.num_tokens if verify else 0,
         _paged(ops.paged_conv1d_verify, getattr(paged_ops, "paged_gdn_verify", _torch_gdn_verify))),
        (decode, decode.num_rows if decode else 0,
         _paged(paged_ops.paged_conv1d_decode, paged_ops.paged_gdn_decode) if paged else _dispatched_decode),
        (prefill, prefill.num_tokens if prefill else 0,
         _paged(paged_ops.paged_conv1d_prefill, paged_ops.paged_gdn_prefill) if paged else _dispatched_prefill),
    )
    for step, size, mix in step_parts:
        if step is None:
            continue
        stop = start + size
        g, beta = gdn_gates(a[start:stop], b[start:stop], A_log, dt_bias)
        parts.append(mix(dims, qkv[start:stop], conv_weight, g, beta, caches, step))
        start = stop
    rest = qkv.shape[0] - start
    if rest or not parts:
        parts.append(qkv.new_zeros(rest, dims.num_v_heads, dims.head_v_dim))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


_torch_gdn_verify = functools.partial(ops.paged_gdn_verify, backend="torch")


def _paged(conv_op, gdn_op):
    """One part of the step through a paged conv op and the paged gated delta rule after it."""

    def mix(dims, qkv, conv_weight, g, beta, caches, step):
        q, k, v = dims.split_heads(conv_op(qkv, conv_weight, caches.conv, step))
        return gdn_op(q, k, v, g, beta, caches.ssm, step, use_qk_l2norm=True)

    return mix


def _dispatched_decode(dims, qkv, conv_weight, g, beta, caches, step):
    pages, ssm = step.pages, caches.ssm
    q, k, v = dims.split_heads(ops.conv1d_decode(qkv, conv_weight, caches.conv, pages))
    if ssm.dtype == torch.float32:
        return ops.gdn_decode(q, k, v, g, beta, ssm, pages, use_qk_l2norm=True)
    staged = ssm.index_select(0, pages).float()  # a bf16 recurrent cache, staged through float32 rows
    o = ops.gdn_decode(q, k, v, g, beta, staged, torch.arange(staged.shape[0], device=pages.device),
                       use_qk_l2norm=True)
    ssm.index_copy_(0, pages, staged.to(ssm.dtype))
    return o


def _dispatched_prefill(dims, qkv, conv_weight, g, beta, caches, step):
    real = int(step.query_start_loc[-1])  # host read: eager only
    pages, fresh, bounds = step.pages, ~step.has_state, step.query_start_loc
    conv0 = torch.where(fresh[:, None, None], 0, caches.conv.index_select(0, pages))
    x, conv1 = ops.conv1d_prefill(qkv[:real], conv_weight, bounds, initial_state=conv0)
    caches.conv.index_copy_(0, pages, conv1.to(caches.conv.dtype))
    q, k, v = dims.split_heads(x)
    ssm0 = torch.where(fresh[:, None, None, None], 0, caches.ssm.index_select(0, pages).float())
    o, ssm1 = ops.gdn_prefill(q, k, v, g[:real], beta[:real], bounds, initial_state=ssm0, use_qk_l2norm=True)
    caches.ssm.index_copy_(0, pages, ssm1.to(caches.ssm.dtype))
    return torch.cat([o, o.new_zeros(qkv.shape[0] - real, dims.num_v_heads, dims.head_v_dim)])
