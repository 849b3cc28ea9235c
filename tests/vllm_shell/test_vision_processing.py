"""The video processing steps against transformers' image processor, and the timestamps."""

import numpy as np
import torch

from vllm_gdn_neuron.shells.vision_processing import VIDEO_DEFAULTS, group_timestamps, video_patches


def _noise(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def test_two_equal_frames_patch_like_the_image_processor():
    """A clip of one frame twice is one temporal patch equal to the image processor's patches of
    that frame (which repeats an image over the temporal patch), same resize, same numbers."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil(patch_size=8, merge_size=2, temporal_patch_size=2,
                                         size={"shortest_edge": 256, "longest_edge": 16384},
                                         image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    config = dict(VIDEO_DEFAULTS, patch_size=8, merge_size=2, size={"shortest_edge": 512, "longest_edge": 32768})
    for height, width in [(60, 100), (150, 200)]:  # kept as is, and scaled down to the budget
        frame = _noise(height, width, seed=height)
        want = processor(images=[Image.fromarray(frame)], return_tensors="pt")
        got, grid = video_patches(np.stack([frame, frame]), config, processor)
        assert grid == tuple(want["image_grid_thw"][0].tolist())
        torch.testing.assert_close(torch.from_numpy(got), want["pixel_values"].float(), rtol=0, atol=1e-6)


def test_odd_frame_counts_repeat_the_last_frame():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil(patch_size=8, merge_size=2)
    config = dict(VIDEO_DEFAULTS, patch_size=8, merge_size=2, size={"shortest_edge": 512, "longest_edge": 32768})
    frames = np.stack([_noise(32, 48, i) for i in range(3)])
    padded = np.concatenate([frames, frames[-1:]])
    got, grid = video_patches(frames, config, processor)
    assert grid == (2, 4, 6)
    np.testing.assert_array_equal(got, video_patches(padded, config, processor)[0])


def test_group_timestamps():
    assert group_timestamps([0, 1, 2, 3], 2.0, 2) == [0.25, 1.25]
    assert group_timestamps([0, 4, 8], 4.0, 2) == [0.5, 2.0]
