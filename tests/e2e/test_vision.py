"""Images and video through vLLM's multimodal path (in-process engine) against transformers.

Prompts with 1 and 3 images of different sizes (data URLs and a local file) through
``LLM.chat`` (the chat template, the checkpoint's image processor, M-RoPE); greedy ids
equal transformers' ``Qwen3_5ForConditionalGeneration`` / ``Qwen3_5MoeForConditionalGeneration``
given the same expanded prompt and pixels (fp32 exact; bf16 under the tie rule, where a
step also ties when transformers' fp32 logits separate the two tokens by no more than its
own bf16 logits stray from them: ``oracle.py``). A mixed
batch (text-only and image requests), a repeat (prefix cache hits across the image) and
bad requests (refused with the problem named; the engine serves on) share one engine.
"""

import pytest
import torch

from tests.support.engines import engine
from tests.support.oracle import assert_greedy_matches
from tests.support.vision_oracle import (data_url, hf_vl_fp32_logits, hf_vl_greedy, noise_image, oversized_png_url,
                                         png_bytes, video_data_url)

MAX_NEW_TOKENS = 6
MAX_IMAGES = 3
# (width, height) -> after resizing to multiples of 16 px within 256..16384 px: 4, 24 and 54 merged tokens.
SIZES = [(40, 24), (100, 60), (200, 150)]


def _params():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)


def _message(text: str, urls: list[str]) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


DENSE_FP32, DENSE_BF16, MOE_FP32 = ("qwen3_5-vl", "float32"), ("qwen3_5-vl", "bfloat16"), ("qwen3_5-moe-vl", "float32")


def engines(*params):
    """Run a test on these engines (one engine per kind for the module, shared by its tests)."""
    return pytest.mark.parametrize("vl_engine", params, indirect=True, ids=["-".join(p) for p in params])


@pytest.fixture(scope="module")
def vl_engine(request, tiny_model, tmp_path_factory):
    model, dtype = request.param
    media = tmp_path_factory.mktemp("media")
    with engine(tiny_model(model), dtype=dtype, enable_prefix_caching=True,
                limit_mm_per_prompt={"image": MAX_IMAGES}, allowed_local_media_path=str(media)) as llm:
        yield llm, tiny_model(model), getattr(torch, dtype), media


def _check(llm_output, model_dir, dtype, images, video_frames=None):
    """vLLM's greedy ids against transformers' (bf16: ties by the fp32 model's logits as well)."""
    prompt = list(llm_output.prompt_token_ids)
    got = list(llm_output.outputs[0].token_ids)
    want, logits = hf_vl_greedy(model_dir, dtype, prompt, images, MAX_NEW_TOKENS, video_frames)
    fp32 = hf_vl_fp32_logits(model_dir, prompt, want, images, video_frames) if dtype == torch.bfloat16 else None
    assert_greedy_matches(got, want, logits, dtype, fp32_logits=fp32)
    return prompt, got


@pytest.mark.slow
@engines(DENSE_FP32, DENSE_BF16, MOE_FP32)
def test_images_match_transformers(vl_engine):
    llm, model_dir, dtype, media = vl_engine
    images = [noise_image(w, h, seed) for seed, (w, h) in enumerate(SIZES)]
    local = media / "third.png"
    local.write_bytes(png_bytes(images[2]))
    one = _message("the red house", [data_url(images[1])])
    three = _message("two cats", [data_url(images[0]), data_url(images[1]), f"file://{local}"])
    outs = llm.chat([one, three], _params(), use_tqdm=False)
    prompt_one, _ = _check(outs[0], model_dir, dtype, images[1:2])
    prompt_three, _ = _check(outs[1], model_dir, dtype, images)
    image_token = llm.llm_engine.model_config.hf_config.image_token_id
    assert prompt_one.count(image_token) == 24
    assert prompt_three.count(image_token) == 4 + 24 + 54


@pytest.mark.slow
@engines(DENSE_FP32)
def test_mixed_batch_and_prefix_cache(vl_engine):
    """Text-only and image requests in one batch; then the image prompts again (their
    prefix blocks, image tokens included, come from the cache) and the same text with
    another image (which must not hit the first image's blocks)."""
    llm, model_dir, dtype, _ = vl_engine
    first, other = noise_image(200, 150, 7), noise_image(200, 150, 8)
    long_text = "light rain " * 150  # past the hybrid cache's 128-token blocks: some are cached whole
    batch = [_message("one two three", []), _message(long_text, [data_url(first)]),
             [{"role": "user", "content": "quiet river mountain"}]]
    outs = llm.chat(batch, _params(), use_tqdm=False)
    expected = [_check(out, model_dir, dtype, images) for out, images in zip(outs, ([], [first], []))]
    again = llm.chat([batch[1], _message(long_text, [data_url(other)])], _params(), use_tqdm=False)
    assert again[0].num_cached_tokens >= 128
    assert (list(again[0].prompt_token_ids), list(again[0].outputs[0].token_ids)) == expected[1]
    assert again[1].num_cached_tokens == 0  # the image is in the first block: another image misses
    _check(again[1], model_dir, dtype, [other])


# (image URLs of one prompt, what the refusal must name)
BAD_REQUESTS = [
    (["data:image/png;base64,bm90IGFuIGltYWdl"], "image"),  # bytes that are not an image
    (["data:image/png;base64,@@@"], "base64"),
    ([data_url(noise_image(16, 16, 0))] * (MAX_IMAGES + 1), f"At most {MAX_IMAGES} image"),
    ([data_url(noise_image(3000, 10, 0))], "aspect ratio must be smaller than 200"),
    ([oversized_png_url()], "exceeds limit"),  # 400 M pixels declared: Pillow's decompression-bomb limit
]


@pytest.mark.slow
@engines(DENSE_FP32)
def test_bad_images_are_refused_and_the_engine_serves_on(vl_engine):
    llm, model_dir, dtype, _ = vl_engine
    for urls, problem in BAD_REQUESTS:
        with pytest.raises(Exception, match=problem):
            llm.chat(_message("the", urls), _params(), use_tqdm=False)
    image = noise_image(40, 24, 3)
    _check(llm.chat(_message("the", [data_url(image)]), _params(), use_tqdm=False)[0], model_dir, dtype, [image])


@pytest.mark.slow
@engines(DENSE_FP32, DENSE_BF16, MOE_FP32)
def test_video_matches_transformers_or_is_refused(vl_engine):
    """A 5-frame clip (3 temporal patches, the last frame repeated) on the checkpoint with a video
    processor; the one without (the MoE one) refuses it with a 400 naming the video."""
    llm, model_dir, dtype, _ = vl_engine
    frames = [noise_image(48, 32, 20 + i) for i in range(5)]
    message = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video_data_url(frames)}},
                                            {"type": "text", "text": "what happens"}]}]
    if "moe" in model_dir:
        with pytest.raises(Exception, match="At most 0 video"):
            llm.chat(message, _params(), use_tqdm=False)
        return
    prompt, _ = _check(llm.chat(message, _params(), use_tqdm=False)[0], model_dir, dtype, [], frames)
    video_token = llm.llm_engine.model_config.hf_config.video_token_id
    assert prompt.count(video_token) == 3 * (32 // 16) * (48 // 16)
