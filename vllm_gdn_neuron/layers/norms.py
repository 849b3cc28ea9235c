"""The RMS norms of Qwen3.5: zero-centred (decoder and q/k norms) and gated (GDN output).

Both follow the Hugging Face reference's casts exactly, so bf16 runs round at the
same places as the oracle.
"""

import torch
from torch import nn


class ZeroCentredRMSNorm(nn.Module):
    """``rmsnorm(x) * (1 + weight)``, normalised and scaled in float32, cast back once.

    With ``residual`` the residual add comes first, in the activation dtype (one
    rounding, as in the reference decoder layer), and the sum is returned beside the
    normalised value for the next residual add.

    Args:
        hidden_size: the normalised (last) dimension D.
        eps: added to the mean square before the reciprocal square root.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Normalise.

        Args:
            x: ``[..., D]`` any float dtype.
            residual: ``[..., D]`` in x's dtype, or None.

        Returns:
            ``[..., D]`` in x's dtype; with ``residual``, the pair ``(normed, x + residual)``.
        """
        if residual is not None:
            x = x + residual
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        out = (normed * (1.0 + self.weight.float())).to(x.dtype)
        return out if residual is None else (out, x)


class GatedRMSNorm(nn.Module):
    """RMS-normalise each head's output, scale it, and gate it with ``silu(z)``.

    The normalisation runs in float32. The casts follow the Hugging Face reference
    (``Qwen3_5RMSNormGated``) exactly, so bf16 runs round at the same places:
    the normalised value is cast back to the input dtype before the weight is
    applied, the gate is applied in float32, and the result is cast once more.

    Dimensions:
        T: tokens, H: value heads (local to this tensor-parallel rank), D: head size.

    Args:
        head_dim: D, the normalised size (one head).
        eps: added to the mean square before the reciprocal square root.
    """

    def __init__(self, head_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(head_dim))
        self.eps = eps

    def forward(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Normalise and gate.

        Args:
            o: [T, H, D] the recurrence output, any float dtype.
            z: [T, H, D] the gate projection, same dtype as ``o``.

        Returns:
            [T, H, D] in ``o``'s dtype.
        """
        dtype = o.dtype
        o32 = o.float()
        normed = o32 * torch.rsqrt(o32.pow(2).mean(-1, keepdim=True) + self.eps)
        scaled = self.weight * normed.to(dtype)
        return (scaled * nn.functional.silu(z.float())).to(dtype)
