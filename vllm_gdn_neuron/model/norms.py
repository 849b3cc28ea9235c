"""The RMS norms of Qwen3.5: zero-centred (decoder and q/k norms) and gated (GDN output).

Both follow the Hugging Face reference's casts exactly, so bf16 runs round at the
same places as the oracle.

Run eagerly on the CPU, a norm over many tokens goes through its rows a block at a time
(``in_row_blocks``): each of its ~10 elementwise passes then works on a float32 block that
stays in cache, instead of allocating and streaming a fresh tensor of the whole step.
Every output element is computed from the same values in the same order either way, so the
results are bit for bit the same.
"""

import math

import torch
from torch import nn

#: Elements per row block (1 MiB of float32). Measured for the GDN output norm of a 2048-token
#: bf16 step on this project's 2-core AVX-512 CPU, [2048, 32, 128]: 77 ms whole, 14 ms in
#: blocks of 64 tokens (256 Ki elements); blocks of 16 to 256 tokens all took 14-15 ms.
CPU_BLOCK_ELEMENTS = 2**18


def in_row_blocks(fn, x: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
    """``fn(x, *others)``, evaluated over blocks of the leading (token) dimension.

    Args:
        fn: a row-wise function: output row i depends on the inputs' rows i only; its output
            has x's shape and dtype.
        x, others: ``[T, ...]`` tensors with one leading dimension T.

    Returns:
        ``fn(x, *others)``. Traced, or off the CPU, or for a step of one block, ``fn`` runs
        once on the whole tensors.
    """
    row = max(1, math.prod(x.shape[1:]))  # from the shape: x[0].numel() would dispatch an op per call
    rows = max(1, CPU_BLOCK_ELEMENTS // row)
    if torch.compiler.is_compiling() or x.device.type != "cpu" or x.shape[0] <= rows:
        return fn(x, *others)
    out = torch.empty_like(x)
    for start in range(0, x.shape[0], rows):
        block = slice(start, start + rows)
        out[block] = fn(x[block], *(t[block] for t in others))
    return out


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
        out = in_row_blocks(self._normalise, x)
        return out if residual is None else (out, x)

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


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
        return in_row_blocks(self._normalise_and_gate, o, z)

    def _normalise_and_gate(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = o.dtype
        o32 = o.float()
        normed = o32 * torch.rsqrt(o32.pow(2).mean(-1, keepdim=True) + self.eps)
        scaled = self.weight * normed.to(dtype)
        return (scaled * nn.functional.silu(z.float())).to(dtype)
