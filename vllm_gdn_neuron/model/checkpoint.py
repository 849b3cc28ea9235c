"""The Hugging Face checkpoint layouts of Qwen3.5 / Qwen3-Next, shared by both shells.

- Vision-language checkpoints keep the text decoder under ``model.language_model.`` and
  the vision tower under ``model.visual.`` (``visual.`` in older exports): see
  :func:`vision_tensor_name`.
- The multi-token-prediction head (``mtp.``, every layout alike) is not part of the
  target model; the MTP drafter reads it and the target's embedding / ``lm_head``
  (:func:`mtp_tensor_name`).
- Qwen3.5 stores the GatedDeltaNet projections separately: ``in_proj_qkv`` (flat
  ``[q all heads | k all heads | v all heads]``), ``in_proj_z``, ``in_proj_b``, ``in_proj_a``.
- Qwen3-Next packs them per key-head group: ``in_proj_qkvz`` rows are, for each of
  the Hk groups, ``[q_g (Dk) | k_g (Dk) | v_g (r*Dv) | z_g (r*Dv)]`` with r = Hv / Hk,
  and ``in_proj_ba`` rows are ``[b_g (r) | a_g (r)]``. :func:`flat_gdn_tensors` un-interleaves
  them into Qwen3.5's names, the one layout both shells' loaders map onto their parameters,
  so the forward has one code path.
"""

import torch

from vllm_gdn_neuron.model.dims import GDNDims

RENAMED_PREFIXES = (("model.language_model.", "model."),)
MTP_PREFIX = "mtp."
VISION_PREFIXES = ("model.visual.", "visual.")


def text_tensor_name(name: str) -> str | None:
    """The text-decoder name of a checkpoint tensor, or None for a tensor not served (MTP, vision)."""
    if name.startswith(MTP_PREFIX) or name.startswith(VISION_PREFIXES):
        return None
    for old, new in RENAMED_PREFIXES:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def vision_tensor_name(name: str) -> str | None:
    """The :class:`vllm_gdn_neuron.model.vision.VisionTower` parameter name of a checkpoint
    tensor (``model.visual.blocks.0.attn.qkv.weight`` -> ``blocks.0.attn.qkv.weight``), or None
    for a tensor outside the tower."""
    for prefix in VISION_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return None


def mtp_tensor_name(name: str) -> str | None:
    """The MTP drafter's name of a checkpoint tensor (``model.`` for the head, ``lm_head.``),
    or None for a tensor of the target only."""
    if name.startswith(MTP_PREFIX):
        return "model." + name[len(MTP_PREFIX):]
    text = text_tensor_name(name)
    if text in ("model.embed_tokens.weight", "lm_head.weight"):
        return text
    return None


def split_flat_qkv(weight: torch.Tensor, text_config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Qwen3.5 ``in_proj_qkv`` [2*Hk*Dk + Hv*Dv, H] -> q, k [Hk*Dk, H], v [Hv*Dv, H]."""
    dims = GDNDims.from_config(text_config)
    return weight.split([dims.key_dim, dims.key_dim, dims.value_dim], dim=0)


def unpack_grouped_qkvz(weight: torch.Tensor, text_config) -> tuple[torch.Tensor, ...]:
    """Qwen3-Next ``in_proj_qkvz`` [Hk*(2*Dk + 2*r*Dv), H] -> flat q, k, v, z (head-major rows)."""
    hk, dk, dv = text_config.linear_num_key_heads, text_config.linear_key_head_dim, text_config.linear_value_head_dim
    ratio = text_config.linear_num_value_heads // hk
    grouped = weight.reshape(hk, 2 * dk + 2 * ratio * dv, weight.shape[-1])
    parts = grouped.split([dk, dk, ratio * dv, ratio * dv], dim=1)
    return tuple(part.reshape(-1, weight.shape[-1]) for part in parts)


def unpack_grouped_ba(weight: torch.Tensor, text_config) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next ``in_proj_ba`` [Hk*2*r, H] -> b, a [Hv, H] (value-head-major rows)."""
    hk = text_config.linear_num_key_heads
    ratio = text_config.linear_num_value_heads // hk
    grouped = weight.reshape(hk, 2 * ratio, weight.shape[-1])
    b, a = grouped.split([ratio, ratio], dim=1)
    return b.reshape(-1, weight.shape[-1]), a.reshape(-1, weight.shape[-1])


def flat_gdn_tensors(name: str, tensor: torch.Tensor, text_config) -> list[tuple[str, torch.Tensor]]:
    """One text-decoder tensor in Qwen3.5's flat GatedDeltaNet layout.

    Qwen3-Next's ``in_proj_qkvz`` becomes ``in_proj_qkv`` (q | k | v rows) and ``in_proj_z``,
    its ``in_proj_ba`` becomes ``in_proj_b`` and ``in_proj_a``; a flat ``in_proj_qkv`` is
    checked against the config's q / k / v sizes; any other tensor is returned as it is.
    """
    if name.endswith(".linear_attn.in_proj_qkvz.weight"):
        q, k, v, z = unpack_grouped_qkvz(tensor, text_config)
        base = name[: -len("in_proj_qkvz.weight")]
        return [(base + "in_proj_qkv.weight", torch.cat([q, k, v])), (base + "in_proj_z.weight", z)]
    if name.endswith(".linear_attn.in_proj_ba.weight"):
        b, a = unpack_grouped_ba(tensor, text_config)
        base = name[: -len("in_proj_ba.weight")]
        return [(base + "in_proj_b.weight", b), (base + "in_proj_a.weight", a)]
    if name.endswith(".linear_attn.in_proj_qkv.weight"):
        split_flat_qkv(tensor, text_config)  # the sizes must add up
    return [(name, tensor)]
