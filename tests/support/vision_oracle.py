"""Images for the vision tests, and transformers' vision-language model as their oracle."""

import base64
import functools
import io

import torch

from .oracle import _generate


def noise_image(width: int, height: int, seed: int):
    """A deterministic RGB image of random pixels (every patch differs, so every patch matters)."""
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), "RGB")


def png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(image) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()


def oversized_png_url(side: int = 20_000) -> str:
    """A PNG whose header declares ``side x side`` pixels (400 M by default, past Pillow's
    decompression-bomb limit) and holds no pixel data: a few bytes that claim a huge image."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)  # 8-bit RGB
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(png).decode()


@functools.lru_cache(maxsize=4)
def hf_vl_model(model_dir: str, dtype: torch.dtype):
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    model_class = getattr(transformers, config.architectures[0])
    return model_class.from_pretrained(model_dir, dtype=dtype).eval()


def hf_image_inputs(model_dir: str, images) -> dict:
    """The checkpoint's image processor (transformers' PIL implementation) on ``images``."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return dict(Qwen2VLImageProcessorPil.from_pretrained(model_dir)(images=images, return_tensors="pt"))


def video_data_url(frames) -> str:
    """vLLM's frame-sequence video URL (``video/jpeg``: comma-separated base64 frames; PNG frames
    decode losslessly through it), one frame per second."""
    return "data:video/jpeg;base64," + ",".join(base64.b64encode(png_bytes(f)).decode() for f in frames)


def hf_video_inputs(model_dir: str, frames) -> dict:
    """Pixel patches of one video by the plugin's processor (its PIL steps are checked against the
    image processor's in ``tests/vllm_shell/test_vision_processing.py``)."""
    import json
    import pathlib

    import numpy as np
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from vllm_gdn_neuron.shells.vision_processing import VIDEO_CONFIG, VIDEO_DEFAULTS, video_patches

    config = {**VIDEO_DEFAULTS, **json.loads((pathlib.Path(model_dir) / VIDEO_CONFIG).read_text())}
    pixels, grid = video_patches(np.stack([np.asarray(f) for f in frames]), config,
                                 Qwen2VLImageProcessorPil.from_pretrained(model_dir))
    return {"pixel_values_videos": torch.from_numpy(pixels), "video_grid_thw": torch.tensor([grid])}


def _media_inputs(model, model_dir: str, ids: torch.Tensor, images, video_frames) -> dict:
    extra = {}
    if images:
        extra.update(hf_image_inputs(model_dir, images))
    if video_frames:
        extra.update(hf_video_inputs(model_dir, video_frames))
    if extra:
        extra["mm_token_type_ids"] = ((ids == model.config.image_token_id).int()
                                      + 2 * (ids == model.config.video_token_id).int())
    return extra


def hf_vl_greedy(model_dir: str, dtype: torch.dtype, prompt_ids: list[int], images, max_new_tokens: int,
                 video_frames=None):
    """Transformers' greedy continuation of an expanded prompt (one ``<|image_pad|>`` /
    ``<|video_pad|>`` per merged token, as vLLM sends it to the model) with its images and
    video: ``(ids, per-step logits [n, vocab])``."""
    model = hf_vl_model(model_dir, dtype)
    model.model.rope_deltas = None  # the model keeps the last prompt's M-RoPE offset between calls
    extra = _media_inputs(model, model_dir, torch.tensor([prompt_ids]), images, video_frames)
    return _generate(model, prompt_ids, max_new_tokens, **extra)


def hf_vl_fp32_logits(model_dir: str, prompt_ids: list[int], ids: list[int], images, video_frames=None):
    """Transformers' fp32 logits ``[len(ids), vocab]`` teacher-forced along ``ids`` (row s sees the
    prompt and ``ids[:s]``): the bf16 rule's reference (``oracle.assert_greedy_matches``)."""
    model = hf_vl_model(model_dir, torch.float32)
    model.model.rope_deltas = None
    forced = torch.tensor([prompt_ids + ids[:-1]])
    with torch.no_grad():
        logits = model(input_ids=forced, **_media_inputs(model, model_dir, forced, images, video_frames)).logits
    model.model.rope_deltas = None
    return logits[0, len(prompt_ids) - 1:].float()
