"""Float64, token-by-token references: the oracle every kernel and backend is tested against.

Every function accepts torch tensors or NumPy arrays of any float dtype, computes in float64
on the CPU and returns float64 torch tensors; inputs are never modified. Layouts are those of
``docs/gdn-math.md``; sequences are packed end to end with ``cu_seqlens`` boundaries
(None = one sequence), states carry a leading sequence axis N.

API:
    gdn_recurrence(q, k, v, g, beta, cu_seqlens=None, initial_state=None, scale=None,
                   use_qk_l2norm=False) -> (o [T, Hv, Dv], final_state [N, Hv, Dk, Dv])
    gdn2_recurrence(q, k, v, g, beta, w=None, cu_seqlens=None, initial_state=None, scale=None,
                    use_qk_l2norm=False) -> (o [T, Hv, Dv], final_state [N, Hv, Dk, Dv])
        g, beta [T, Hv, Dk]; w [T, Hv, Dv] or None = ones; state K-major.
    causal_conv1d(x, weight, cu_seqlens=None, initial_state=None, activation="silu")
        -> (y [T, C], final_state [N, C, K])
    causal_conv1d_step(x, weight, state, activation="silu") -> (y [..., C], new_state [..., C, K])
    qwen35_gating(a, b, A_log, dt_bias) -> (g [T, Hv], beta [T, Hv])
    l2norm(x, eps=1e-6) -> x * rsqrt(sum(x^2) + eps) over the last axis
    tolerance(dtype, reference) -> the largest max abs error the tests accept against a reference
"""

from .conv1d import causal_conv1d, causal_conv1d_step
from .gating import qwen35_gating
from .gdn import gdn2_recurrence, gdn_recurrence
from .norms import L2NORM_EPS, l2norm
from .tolerance import tolerance

__all__ = [
    "L2NORM_EPS",
    "causal_conv1d",
    "causal_conv1d_step",
    "gdn2_recurrence",
    "gdn_recurrence",
    "l2norm",
    "qwen35_gating",
    "tolerance",
]
