"""An image request to a real server with the official OpenAI client (the README's example).

One server (``scripts/serve.sh`` with the tiny vision-language checkpoint, fp32): the
answer's ids equal transformers' for the same expanded prompt and pixels; a malformed
image and too many images get a 400 naming the problem; the server then answers an image
request (the same ids) and a video request.
"""

import pathlib

import pytest
import torch

from tests.support.oracle import assert_greedy_matches
from tests.support.serving import running_server
from tests.support.vision_oracle import data_url, hf_vl_greedy, noise_image, video_data_url

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    folder = tiny_model("qwen3_5-vl")
    args = ("--dtype", "float32", "--limit-mm-per-prompt", '{"image": 2}', "--max-model-len", "1024")
    with running_server(tmp_path_factory.mktemp("vision-server") / "server.log", *args,
                        model=pathlib.Path(folder).name, env={"MODEL": folder}) as running:
        yield running, folder


def _ask(client, model: str, urls: list[str]):
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [
            *({"type": "image_url", "image_url": {"url": url}} for url in urls),
            {"type": "text", "text": "what is in the picture"},
        ]}],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )


@pytest.mark.slow
def test_image_chat_with_the_openai_client(server):
    import openai

    running, folder = server
    client = openai.OpenAI(base_url=f"{running.base}/v1", api_key="unused")
    image = noise_image(100, 60, 5)

    def check_answer():
        answer = _ask(client, running.model, [data_url(image)])
        choice = answer.choices[0]
        want, logits = hf_vl_greedy(folder, torch.float32, list(answer.prompt_token_ids), [image], MAX_TOKENS)
        assert_greedy_matches(list(choice.token_ids), want, logits, torch.float32)

    check_answer()
    for urls, problem in [(["data:image/png;base64,bm90IGFuIGltYWdl"], "image"),
                          ([data_url(image)] * 3, "At most 2 image")]:
        with pytest.raises(openai.BadRequestError, match=problem):
            _ask(client, running.model, urls)
    check_answer()
    frames = [noise_image(48, 32, 30 + i) for i in range(4)]
    video = client.chat.completions.create(model=running.model, max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": video_data_url(frames)}}, {"type": "text", "text": "what"}]}])
    assert video.usage.completion_tokens == 2
