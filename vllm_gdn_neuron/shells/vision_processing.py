"""vLLM's multimodal processing for the Qwen3.5 vision-language checkpoints, without torchvision.

vLLM renders the chat template (each image part becomes ``<|vision_start|><|image_pad|>
<|vision_end|>``, each video part ``<|vision_start|><|video_pad|><|vision_end|>``) and
tokenizes the prompt; this processor turns the request's media into pixel patches and
tells vLLM how to expand each placeholder:

- images: the checkpoint's ``preprocessor_config.json`` read by transformers' PIL/numpy
  Qwen2-VL image processor (``Qwen2VLImageProcessorPil``: the same resize, rescale,
  normalise and patch order as its torchvision twin); ``<|image_pad|>`` becomes the
  image's ``h*w / m^2`` placeholder tokens.
- video (checkpoints with a ``video_preprocessor_config.json``): the frames vLLM's video
  loader sampled (``--media-io-kwargs '{"video": {"num_frames": N}}'``, 32 by default) are
  resized together (Qwen3-VL's video ``smart_resize``: all frames to one size, the pixel
  budget shared by the clip), rescaled and normalised by the same PIL primitives, and each
  pair of frames (``temporal_patch_size``) becomes one temporal patch; the placeholder
  becomes, per temporal patch, ``<{t:.1f} seconds><|vision_start|>`` + ``h*w / m^2``
  ``<|video_pad|>`` + ``<|vision_end|>`` (t: the mean time of its frames), as Qwen3-VL
  prompts a video.

vLLM's own Qwen3-VL processor is not used: it builds transformers' ``Qwen3VLProcessor``,
whose video processor needs torchvision, and torchvision's PyPI wheels do not import next
to this project's CPU torch.
"""

import functools
import json
import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from transformers import BatchFeature
from transformers.image_processing_backends import PilBackend
from transformers.image_utils import PILImageResampling, SizeDict
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
    Qwen2VLImageProcessorKwargs,
    Qwen2VLImageProcessorPil,
)
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as video_smart_resize
from transformers.utils import cached_file

from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from vllm.multimodal.parse import MultiModalDataItems, MultiModalDataParser
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseMultiModalProcessor,
    BaseProcessingInfo,
    PromptReplacement,
    PromptUpdate,
    PromptUpdateDetails,
)

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"


def placeholder_str(modality: str) -> str:
    """The prompt text of one ``modality`` item (vLLM's ``SupportsMultiModal.get_placeholder_str``)."""
    if modality.startswith("image"):
        return IMAGE_PLACEHOLDER
    if modality.startswith("video"):
        return VIDEO_PLACEHOLDER
    raise ValueError(f"modality must be 'image' or 'video'; got {modality!r}")
VIDEO_CONFIG = "video_preprocessor_config.json"
# The video processor's fields this processor reads, with Qwen3VLVideoProcessor's defaults.
VIDEO_DEFAULTS = dict(patch_size=16, temporal_patch_size=2, merge_size=2, rescale_factor=1 / 255,
                      image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                      size={"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768})
# vLLM's dummy video for profiling: one temporal patch.
DUMMY_VIDEO_FRAMES = 2


@functools.lru_cache(maxsize=8)
def _image_processor(model: str, revision: str | None) -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil.from_pretrained(model, revision=revision)


@functools.lru_cache(maxsize=8)
def _video_config(model: str, revision: str | None) -> dict | None:
    path = cached_file(model, VIDEO_CONFIG, revision=revision, _raise_exceptions_for_missing_entries=False)
    if path is None:
        return None
    with open(path) as handle:
        return {**VIDEO_DEFAULTS, **json.load(handle)}


def video_patches(frames: np.ndarray, config: dict, processor: Qwen2VLImageProcessorPil):
    """One video's pixel patches.

    Args:
        frames: ``[F, H, W, 3]`` uint8 RGB frames.
        config: the video processor fields (``VIDEO_DEFAULTS`` keys).
        processor: the image processor whose PIL resize / rescale / normalise are used.

    Returns:
        ``(patches [t*h*w, 3*Tp*P*P] float32, (t, h, w))`` with ``t = ceil(F / Tp)`` (the last
        frame repeated to fill the last temporal patch), patches in merge-block order.

    Raises:
        ValueError: for an empty video or one more than 200 times longer than wide.
    """
    if frames.ndim != 4 or frames.shape[0] == 0 or frames.shape[-1] != 3:
        raise ValueError(f"video frames must be a non-empty [F, H, W, 3] array; got {list(frames.shape)}")
    patch, temporal, merge = config["patch_size"], config["temporal_patch_size"], config["merge_size"]
    # Sized by the frames given (at least one temporal patch), as Qwen3-VL's video processor does.
    height, width = video_smart_resize(max(frames.shape[0], temporal), frames.shape[1], frames.shape[2],
                                       temporal_factor=temporal,
                                       factor=patch * merge, min_pixels=config["size"]["shortest_edge"],
                                       max_pixels=config["size"]["longest_edge"])
    num_frames = math.ceil(frames.shape[0] / temporal) * temporal
    frames = np.concatenate([frames, np.repeat(frames[-1:], num_frames - frames.shape[0], axis=0)])
    target = SizeDict(height=height, width=width)
    chw = []
    for frame in frames:
        image = PilBackend.resize(processor, np.ascontiguousarray(frame.transpose(2, 0, 1)), target,
                                  resample=PILImageResampling.BICUBIC)
        image = processor.rescale(image, config["rescale_factor"])
        chw.append(processor.normalize(image.astype(np.float32), config["image_mean"], config["image_std"]))
    grid_t, grid_h, grid_w = num_frames // temporal, height // patch, width // patch
    video = np.stack(chw).astype(np.float32).reshape(
        grid_t, temporal, 3, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
    patches = video.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(grid_t * grid_h * grid_w, -1)
    return patches, (grid_t, grid_h, grid_w)


def group_timestamps(frame_indices: list[int], fps: float, temporal_patch_size: int) -> list[float]:
    """Seconds of each temporal patch: the mean of its first and last frame's time (last frame repeated)."""
    padded = list(frame_indices) + [frame_indices[-1]] * (-len(frame_indices) % temporal_patch_size)
    seconds = [index / fps for index in padded]
    return [(seconds[i] + seconds[i + temporal_patch_size - 1]) / 2 for i in range(0, len(seconds), temporal_patch_size)]


class Qwen3_5VisionProcessingInfo(BaseProcessingInfo):
    """What vLLM needs to know of the checkpoint's image (and video) processing."""

    def get_image_processor(self) -> Qwen2VLImageProcessorPil:
        model_config = self.ctx.model_config
        return _image_processor(model_config.model, model_config.revision)

    def get_video_config(self) -> dict | None:
        """The checkpoint's video processor fields, or None where it has no video processor."""
        model_config = self.ctx.model_config
        return _video_config(model_config.model, model_config.revision)

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {"image": None, "video": None} if self.get_video_config() is not None else {"image": None}

    def get_data_parser(self) -> MultiModalDataParser:
        return MultiModalDataParser(video_needs_metadata=True, expected_hidden_size=self._get_expected_hidden_size(),
                                    allow_missing_mm_embeddings=self.allow_missing_mm_embeddings)

    def get_supported_mm_processor_kwargs(self) -> dict[str, set[str]]:
        keys = Qwen2VLImageProcessorKwargs.__required_keys__ | Qwen2VLImageProcessorKwargs.__optional_keys__
        return {"text_kwargs": set(), "images_kwargs": set(keys)}

    def images_kwargs(self, mm_kwargs: Mapping[str, object]) -> dict:
        """The image processor's keyword arguments: the server's ``--mm-processor-kwargs`` and the request's."""
        return dict(self._merge_and_resolve_mm_processor_kwargs(mm_kwargs).get("images_kwargs", {}))

    def pixel_budget(self, mm_kwargs: Mapping[str, object]) -> tuple[int, int]:
        """``(factor, max_pixels)``: resized sides are multiples of ``factor`` = patch x merge,
        and an image has at most ``max_pixels`` pixels after resizing."""
        processor = self.get_image_processor()
        kwargs = self.images_kwargs(mm_kwargs)
        size = dict(kwargs.get("size") or processor.size)
        max_pixels = kwargs.get("max_pixels") or size["longest_edge"]
        patch = kwargs.get("patch_size") or processor.patch_size
        merge = kwargs.get("merge_size") or processor.merge_size
        return patch * merge, int(max_pixels)

    def max_side(self, factor: int, max_pixels: int, seq_len: int) -> int:
        """Side of the square frame with the most placeholder tokens within ``max_pixels``, at most ``seq_len`` of them."""
        per_side = min(math.isqrt(max_pixels // (factor * factor)), math.isqrt(max(seq_len, 1)))
        return max(per_side, 1) * factor

    def max_image_side(self, seq_len: int) -> int:
        return self.max_side(*self.pixel_budget({}), seq_len)

    def max_video_side(self, seq_len: int) -> int:
        config = self.get_video_config()
        factor = config["patch_size"] * config["merge_size"]
        return self.max_side(factor, config["size"]["longest_edge"] // DUMMY_VIDEO_FRAMES, seq_len)

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts: Mapping[str, int]) -> Mapping[str, int]:
        factor = self.pixel_budget({})[0]
        tokens = {"image": (self.max_image_side(seq_len) // factor) ** 2}
        config = self.get_video_config()
        if config is not None:
            # The clip shares one pixel budget: at most longest_edge / (Tp * factor^2) tokens, and
            # one factor x factor tile per frame pair at least.
            video_factor = config["patch_size"] * config["merge_size"]
            budget = config["size"]["longest_edge"] // (config["temporal_patch_size"] * video_factor**2)
            tokens["video"] = min(max(budget, 1), seq_len)
        return tokens


class Qwen3_5VisionDummyInputsBuilder(BaseDummyInputsBuilder[Qwen3_5VisionProcessingInfo]):
    """Profiling inputs: the largest images (and one-temporal-patch videos) the processor can produce."""

    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return IMAGE_PLACEHOLDER * mm_counts.get("image", 0) + VIDEO_PLACEHOLDER * mm_counts.get("video", 0)

    def get_dummy_mm_data(self, seq_len: int, mm_counts: Mapping[str, int], mm_options=None):
        side = self.info.max_image_side(seq_len)
        options = mm_options or {}
        data = {"image": self._get_dummy_images(width=side, height=side, num_images=mm_counts.get("image", 0),
                                                overrides=options.get("image"))}
        if mm_counts.get("video", 0):
            side = self.info.max_video_side(seq_len)
            frames = np.full((DUMMY_VIDEO_FRAMES, side, side, 3), 255, dtype=np.uint8)
            metadata = {"fps": 2.0, "frames_indices": list(range(DUMMY_VIDEO_FRAMES)),
                        "total_num_frames": DUMMY_VIDEO_FRAMES, "duration": DUMMY_VIDEO_FRAMES / 2.0,
                        "video_backend": "opencv"}
            data["video"] = [(frames, metadata)] * mm_counts["video"]
        return data


class Qwen3_5VisionMultiModalProcessor(BaseMultiModalProcessor[Qwen3_5VisionProcessingInfo]):
    """Images -> ``pixel_values`` ``[sum of h*w, C*Tp*P*P]`` float32 and ``image_grid_thw`` ``[images, 3]``;
    videos -> ``pixel_values_videos`` and ``video_grid_thw`` likewise, and ``video_timestamps``
    (seconds of each temporal patch)."""

    def _call_hf_processor(self, hf_data: Mapping[str, object], hf_kwargs: Mapping[str, object]) -> BatchFeature:
        out = {}
        images = hf_data.get("images") or []
        processor = self.info.get_image_processor()
        if images:
            out.update(processor(images=images, return_tensors="pt", **self.info.images_kwargs(hf_kwargs)))
        videos = hf_data.get("videos") or []
        if videos:
            config = self.info.get_video_config()
            patches, grids, timestamps = [], [], []
            for frames, metadata in videos:
                pixels, grid = video_patches(np.asarray(frames), config, processor)
                patches.append(torch.from_numpy(pixels))
                grids.append(grid)
                indices = list(metadata.get("frames_indices") or range(len(frames)))
                timestamps.append(torch.tensor(group_timestamps(indices, float(metadata.get("fps") or 2.0),
                                                                config["temporal_patch_size"])))
            out.update(pixel_values_videos=torch.cat(patches), video_grid_thw=torch.tensor(grids),
                       video_timestamps=timestamps)
        return BatchFeature(out)

    def _get_mm_fields_config(self, hf_inputs: BatchFeature, hf_processor_mm_kwargs: Mapping[str, object]):
        empty = torch.empty((0, 3), dtype=torch.int64)
        image_grid, video_grid = hf_inputs.get("image_grid_thw", empty), hf_inputs.get("video_grid_thw", empty)
        return {
            "pixel_values": MultiModalFieldConfig.flat_from_sizes("image", image_grid.prod(-1)),
            "image_grid_thw": MultiModalFieldConfig.batched("image", keep_on_cpu=True),
            "pixel_values_videos": MultiModalFieldConfig.flat_from_sizes("video", video_grid.prod(-1)),
            "video_grid_thw": MultiModalFieldConfig.batched("video", keep_on_cpu=True),
            "video_timestamps": MultiModalFieldConfig.batched("video", keep_on_cpu=True),
        }

    def _get_prompt_updates(self, mm_items: MultiModalDataItems, hf_processor_mm_kwargs: Mapping[str, object],
                            out_mm_kwargs: MultiModalKwargsItems) -> Sequence[PromptUpdate]:
        config = self.info.get_hf_config()
        merge = config.vision_config.spatial_merge_size
        tokenizer = self.info.get_tokenizer()

        def image_tokens(item_idx: int) -> list[int]:
            grid_thw = out_mm_kwargs["image"][item_idx]["image_grid_thw"].data
            return [config.image_token_id] * (int(grid_thw.prod()) // (merge * merge))

        def video_tokens(item_idx: int) -> PromptUpdateDetails:
            item = out_mm_kwargs["video"][item_idx]
            _, height, width = (int(v) for v in item["video_grid_thw"].data.tolist())
            tokens: list[int] = []
            for seconds in item["video_timestamps"].data.tolist():
                tokens += tokenizer.encode(f"<{seconds:.1f} seconds>", add_special_tokens=False)
                tokens += [config.vision_start_token_id, *[config.video_token_id] * (height * width // (merge * merge)),
                           config.vision_end_token_id]
            return PromptUpdateDetails.select_token_id(tokens, config.video_token_id)

        video_target = [config.vision_start_token_id, config.video_token_id, config.vision_end_token_id]
        return [PromptReplacement(modality="image", target=[config.image_token_id], replacement=image_tokens),
                PromptReplacement(modality="video", target=video_target, replacement=video_tokens)]
