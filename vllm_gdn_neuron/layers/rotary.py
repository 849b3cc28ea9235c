"""Partial rotary position embedding of Qwen3.5's full-attention layers (text positions).

Only the first ``rotary_dim = head_dim * partial_rotary_factor`` dims of each head
rotate, in the ``rotate_half`` convention. On text-only positions the three M-RoPE
axes carry the same value, where M-RoPE equals this plain RoPE. The angles are
computed in float32 and cast to the activation dtype before they are applied, as
in the Hugging Face reference.
"""

import torch
from torch import nn

# Multimodal RoPE fields of the Qwen3.5 configs, meaningless for text-only positions.
MROPE_KEYS = ("mrope_section", "mrope_interleaved")


def text_rope_parameters(config) -> dict:
    """The config's ``rope_parameters`` without the multimodal M-RoPE fields."""
    return {k: v for k, v in (config.rope_parameters or {}).items() if k not in MROPE_KEYS}


def check_rope_parameters(config) -> None:
    """Refuse a RoPE variant this module does not implement (only ``default`` is).

    Raises:
        ValueError: naming ``rope_parameters.rope_type`` and the value given.
    """
    rope_type = text_rope_parameters(config).get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"rope_parameters.rope_type must be 'default' (no scaling); got {rope_type!r}")


class PartialRotaryEmbedding(nn.Module):
    """Rotate the leading ``rotary_dim`` dims of q and k by their token positions.

    Args:
        head_dim: D.
        rope_parameters: ``rope_theta`` and optionally ``partial_rotary_factor`` (default 1).

    The inverse frequencies are computed in the forward (a few constant-folded ops), not
    held in a buffer: a model built on the meta device and materialised with ``to_empty``
    has no buffer values to keep.
    """

    def __init__(self, head_dim: int, rope_parameters: dict) -> None:
        super().__init__()
        self.rotary_dim = int(head_dim * rope_parameters.get("partial_rotary_factor", 1.0))
        self.theta = float(rope_parameters.get("rope_theta", 10000.0))

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """Rotate.

        Args:
            positions: ``[T]`` integer token positions.
            q: ``[T, Hq, D]``; k: ``[T, Hkv, D]``; same float dtype.

        Returns:
            ``(q, k)`` rotated, same shapes and dtype.
        """
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.float32, device=positions.device) / self.rotary_dim
        inv_freq = 1.0 / self.theta**exponents
        angles = positions.float()[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        cos = angles.cos().to(q.dtype)[:, None, :]
        sin = angles.sin().to(q.dtype)[:, None, :]
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        half = self.rotary_dim // 2
        turned = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
        return torch.cat((rot * cos + turned * sin, rest), dim=-1)
