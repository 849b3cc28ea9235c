"""The project's tolerance for a kernel, op or layer output against these float64 references."""

import torch

# Max abs error <= RTOL * max|reference| (+ ATOL in float32), per dtype of the computation.
FLOAT32_RTOL, FLOAT32_ATOL = 1e-4, 1e-6
BFLOAT16_RTOL = 2e-2


def tolerance(dtype: torch.dtype, reference: torch.Tensor) -> float:
    """The largest max abs error accepted against ``reference`` (any shape; empty: 0 peak).

    float32: ``1e-4 max|ref| + 1e-6``; bfloat16 (and any other low-precision dtype):
    ``2e-2 max|ref|``.
    """
    peak = reference.detach().abs().max().item() if reference.numel() else 0.0
    if dtype == torch.float32:
        return FLOAT32_RTOL * peak + FLOAT32_ATOL
    return BFLOAT16_RTOL * peak
