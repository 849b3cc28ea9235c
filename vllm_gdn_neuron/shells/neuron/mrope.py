"""M-RoPE positions of a prompt with images, on the host (the runner's ``SupportsMRoPE`` call).

vllm-neuron's runner, for a model config that uses M-RoPE, calls
``model.get_mrope_input_positions(prompt_token_ids, mm_features)`` once per request when
it is first scheduled, keeps the ``[3, L]`` positions for the prompt's prefill chunks, and
gives each later token ``delta + cache position`` on all three axes (``delta`` the second
value returned). The runner raises at the first request if the model lacks the method.

Positions (as Hugging Face's Qwen3.5 ``get_rope_index`` and vLLM's Qwen3-VL give them):
text tokens count up on all three axes; an image of merged grid ``h x w`` (the
processor's ``image_grid_thw`` divided by ``spatial_merge_size`` on both spatial axes)
starting at position ``p`` gives its row-major token ``(r, c)`` the positions
``(p, p + r, p + c)``, and the text after it resumes at ``p + max(h, w)``.

``mm_features`` are vLLM ``MultiModalFeatureSpec`` objects; this reads ``modality``,
``mm_position.offset`` (the first placeholder token) and, for images,
``data["image_grid_thw"].data`` (``[t, h, w]``, t = 1).
"""

import torch

from vllm_gdn_neuron.model.vision import mrope_positions


def mrope_input_positions(input_tokens, mm_features, spatial_merge_size: int) -> tuple[torch.Tensor, int]:
    """``([3, L] int64 positions, delta)`` of a prompt of ``L`` tokens
    (:func:`vllm_gdn_neuron.model.vision.mrope_positions` of its images' token grids).

    Args:
        input_tokens: the prompt's token ids (length L).
        mm_features: its multimodal items (see the module docstring), in any order.
        spatial_merge_size: the vision config's ``spatial_merge_size``.

    Returns:
        The positions and ``delta = max position + 1 - L`` (0 for a text prompt).

    Raises:
        ValueError: for a video (not implemented here), an image grid with ``t != 1`` or
            not divisible by ``spatial_merge_size``, or items that overlap or run past
            the prompt.
    """
    groups = []
    for feature in mm_features:
        if feature.modality != "image":
            raise ValueError(f"M-RoPE positions are implemented for images only; got a {feature.modality!r} item "
                             "(set limit-mm-per-prompt video to 0)")
        t, h, w = (int(v) for v in feature.data["image_grid_thw"].data.tolist())
        if t != 1 or h % spatial_merge_size or w % spatial_merge_size:
            raise ValueError(f"image_grid_thw must be [1, h, w] with h and w multiples of spatial_merge_size="
                             f"{spatial_merge_size}; got {[t, h, w]}")
        groups.append((feature.mm_position.offset, h // spatial_merge_size, w // spatial_merge_size))
    return mrope_positions(len(input_tokens), groups)
