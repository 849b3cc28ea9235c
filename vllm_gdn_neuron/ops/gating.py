"""The gating of Qwen3.5 / Qwen3-Next's GatedDeltaNet, and the recurrence phases that take it raw.

Per token and value head the layer's gating is

```
g    = -exp(A_log) * softplus(a + dt_bias)   (<= 0, the log decay)
beta = sigmoid(b)
```

from the token's projections ``a, b [T, Hv]`` and the layer's ``A_log, dt_bias [Hv]``. The
paged recurrence ops take g and beta (``vllm_gdn_neuron.ops.paged``); a layer's recurrence
phases (``vllm_gdn_neuron.ops.phases``) take the raw gating ``(a, b, A_log, dt_bias)``, so
a backend whose kernel computes the gating itself (vLLM's fused decode and speculative-verify
kernels) gets it as the model has it, and every other backend gets ``gdn_gates``' g and beta
through :class:`GatesFirst` (``recurrence_op``: the one statement of that rule, for the layers'
phases and ``auto``'s start-up timing).
"""

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """``g = -exp(A_log) * softplus(a + dt_bias)`` (<= 0) and ``beta = sigmoid(b)``.

    Args:
        a, b: ``[N, Hv]`` projections, any float dtype.
        A_log, dt_bias: ``[Hv]`` float32.

    Returns:
        ``(g, beta)``, both ``[N, Hv]`` float32.
    """
    f32 = torch.float32
    g = -torch.exp(in_dtype(A_log, f32)) * F.softplus(in_dtype(a, f32) + in_dtype(dt_bias, f32))
    return g, torch.sigmoid(in_dtype(b, f32))


def in_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in ``dtype``, without a dispatched op where it already is (the gating runs per layer
    call, and its A_log / dt_bias are mostly in the dtype wanted already)."""
    return x if x.dtype == dtype else x.to(dtype)


@dataclass(frozen=True)
class GatesFirst:
    """A recurrence phase on the raw gating, from a paged op ``op`` that takes g and beta.

    Called as ``(q, k, v, a, b, A_log, dt_bias, ssm_cache, step, **options)``: runs
    ``op(q, k, v, g, beta, ssm_cache, step, **options)`` on ``gdn_gates``' g and beta.
    Two wrap the same op equal each other (a layer's phases can be compared with what a
    backend binds).
    """

    op: Callable

    def __call__(self, q, k, v, a, b, A_log, dt_bias, ssm_cache, step, **options):
        g, beta = gdn_gates(a, b, A_log, dt_bias)
        return self.op(q, k, v, g, beta, ssm_cache, step, **options)


#: a paged recurrence op's name -> the name of a backend's op of the same phase that takes the
#: raw gating ``(q, k, v, a, b, A_log, dt_bias, ssm_cache, step, *, scale, use_qk_l2norm)``.
#: Prefill has none: vLLM's chunked CPU kernel takes g and beta.
RAW_GATING_OPS = {"paged_gdn_decode": "paged_gdn_decode_raw_gating",
                  "paged_gdn_verify": "paged_gdn_verify_raw_gating"}


def recurrence_op(module, paged_op: str) -> Callable:
    """The recurrence phase of paged op ``paged_op`` (``"paged_gdn_decode"``, ...) on backend
    ``module``, called with the raw gating: the backend's raw-gating op where it has one
    (``RAW_GATING_OPS``), else its paged op behind ``GatesFirst``."""
    raw = RAW_GATING_OPS.get(paged_op)
    if raw is not None and hasattr(module, raw):
        return getattr(module, raw)
    return GatesFirst(getattr(module, paged_op))
