"""Partial rotary position embedding of Qwen3.5's full-attention layers, 1-D or M-RoPE.

Only the first ``rotary_dim = head_dim * partial_rotary_factor`` dims of each head
rotate, in the ``rotate_half`` convention. With M-RoPE (multimodal prompts) each token
has three positions (temporal, height, width) and each of the ``rotary_dim / 2``
frequencies turns with one of them (:func:`mrope_axes`); on text tokens the three
axes carry the same value, where M-RoPE equals plain RoPE. The angles are computed in
float32 and cast to the activation dtype before they are applied, as in the Hugging
Face reference.
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
        ValueError: naming ``rope_parameters.rope_type`` and the value given (read from the older
            ``type`` key where ``rope_type`` is absent, as old ``rope_scaling`` dicts spell it).
    """
    parameters = text_rope_parameters(config)
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"rope_parameters.rope_type must be 'default' (no scaling); got {rope_type!r}")


def mrope_axes(num_frequencies: int, mrope_section: list[int], interleaved: bool) -> list[int]:
    """Which M-RoPE axis (0 temporal, 1 height, 2 width) turns each frequency.

    Interleaved (Qwen3.5, ``mrope_interleaved``): frequency j turns with height when
    ``j % 3 == 1`` and ``j < 3 * section[1]``, with width when ``j % 3 == 2`` and
    ``j < 3 * section[2]``, else with the temporal axis. Otherwise the sections are
    consecutive: ``section[0]`` temporal frequencies, then height, then width.

    Raises:
        ValueError: unless ``mrope_section`` has 3 entries (and, not interleaved, sums to
            ``num_frequencies``).
    """
    if len(mrope_section) != 3:
        raise ValueError(f"rope_parameters.mrope_section must have 3 entries (t, h, w); got {mrope_section}")
    if interleaved:
        return [1 if j % 3 == 1 and j < 3 * mrope_section[1] else 2 if j % 3 == 2 and j < 3 * mrope_section[2]
                else 0 for j in range(num_frequencies)]
    if sum(mrope_section) != num_frequencies:
        raise ValueError(f"rope_parameters.mrope_section must sum to rotary_dim / 2 = {num_frequencies}; "
                         f"got {mrope_section}")
    return [axis for axis, count in enumerate(mrope_section) for _ in range(count)]


class PartialRotaryEmbedding(nn.Module):
    """Rotate the leading ``rotary_dim`` dims of q and k by their token positions.

    Args:
        head_dim: D.
        rope_parameters: ``rope_theta``, optionally ``partial_rotary_factor`` (default 1) and
            the M-RoPE fields ``mrope_section`` / ``mrope_interleaved`` (without them, 3-axis
            positions are refused).

    The inverse frequencies are computed in the forward (a few constant-folded ops), not
    held in a buffer: a model built on the meta device and materialised with ``to_empty``
    has no buffer values to keep.
    """

    def __init__(self, head_dim: int, rope_parameters: dict) -> None:
        super().__init__()
        self.rotary_dim = int(head_dim * rope_parameters.get("partial_rotary_factor", 1.0))
        self.theta = float(rope_parameters.get("rope_theta", 10000.0))
        section = rope_parameters.get("mrope_section")
        self.mrope_axes = None if section is None else mrope_axes(
            self.rotary_dim // 2, list(section), bool(rope_parameters.get("mrope_interleaved", False)))

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """Rotate.

        Args:
            positions: ``[T]`` integer token positions, or ``[3, T]`` M-RoPE positions
                (temporal, height, width) when the config has ``mrope_section``.
            q: ``[T, Hq, D]``; k: ``[T, Hkv, D]``; same float dtype.

        Returns:
            ``(q, k)`` rotated, same shapes and dtype.
        """
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.float32, device=positions.device) / self.rotary_dim
        inv_freq = 1.0 / self.theta**exponents
        if positions.dim() == 2:
            if self.mrope_axes is None or positions.shape[0] != 3:
                raise ValueError(f"positions must be [T], or [3, T] with an mrope_section in the config; "
                                 f"got {list(positions.shape)} (mrope_section given: {self.mrope_axes is not None})")
            axes = torch.tensor(self.mrope_axes, device=positions.device)
            angles = positions.float()[axes].T * inv_freq[None, :]
        else:
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
