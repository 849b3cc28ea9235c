"""The README's serve command as a real server: OpenAI-compatible endpoints and the ids again.

One server for the module: ``bash scripts/serve.sh --port <free port>`` (the README
command: venv set-up, the default tiny model built if missing, ``vllm-gdn-serve`` with
``configs/serve-cpu.yaml``), engine core in its own process as in production; killed
by its process-group id at the end. It runs eagerly, as every test server does unless asked
(``tests.support.serving.EAGER``); the shipped compiled mode: ``test_compiled_server.py``.
"""

import random

import pytest
import requests
import torch

from tests.support.oracle import assert_greedy_matches, hf_greedy
from tests.support.serving import (TINY_MODEL_DIR, TINY_SERVED_NAME, Server, all_at_once, completion, generated_ids,
                                   mixed_requests)
from tests.support.serving import running_server, stream_events

MODEL_DIR = TINY_MODEL_DIR
SERVED_NAME = TINY_SERVED_NAME
SERVED_DTYPE = torch.bfloat16  # the checkpoint's dtype ("auto")
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    with running_server(tmp_path_factory.mktemp("server") / "server.log") as running:
        yield running


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(n)]


def _completion(server: Server, **body) -> dict:
    return completion(server, **{"max_tokens": MAX_TOKENS, **body})


def _stream_text(server: Server, path: str, body: dict, field) -> str:
    pieces = []
    for event in stream_events(server, path, {"max_tokens": MAX_TOKENS, **body}):
        pieces.extend(field(choice) or "" for choice in event["choices"])
    return "".join(pieces)


@pytest.mark.slow
def test_models_lists_the_served_model(server):
    listed = requests.get(f"{server.base}/v1/models", timeout=10).json()
    assert [m["id"] for m in listed["data"]] == [SERVED_NAME]


@pytest.mark.slow
def test_completion_ids_match_transformers(server):
    prompts = [_prompt(1, 10), _prompt(40, 11), _prompt(700, 12)]
    out = _completion(server, prompt=prompts, return_token_ids=True)
    choices = sorted(out["choices"], key=lambda c: c["index"])
    assert out["usage"]["completion_tokens"] == MAX_TOKENS * len(prompts)
    for prompt, choice in zip(prompts, choices):
        want, want_logits = hf_greedy(MODEL_DIR, SERVED_DTYPE, prompt, MAX_TOKENS)
        assert_greedy_matches(choice["token_ids"], want, want_logits, SERVED_DTYPE)


@pytest.mark.slow
def test_chat_completion_ids_match_transformers(server):
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "the river and the mountain"}]
    body = {"model": SERVED_NAME, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    response = requests.post(f"{server.base}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    reply = response.json()
    choice = reply["choices"][0]
    assert choice["message"]["role"] == "assistant"
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])
    assert reply["prompt_token_ids"] == prompt  # the chat template was applied as transformers does
    want, want_logits = hf_greedy(MODEL_DIR, SERVED_DTYPE, prompt, MAX_TOKENS)
    assert_greedy_matches(choice["token_ids"], want, want_logits, SERVED_DTYPE)


@pytest.mark.slow
def test_streaming_gives_the_same_text(server):
    prompt = "the state gate decays the key"
    whole = _completion(server, prompt=prompt)["choices"][0]["text"]
    assert _stream_text(server, "/v1/completions", {"prompt": prompt}, lambda c: c.get("text")) == whole

    messages = [{"role": "user", "content": "a small quiet city"}]
    body = {"model": SERVED_NAME, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True}
    whole_chat = requests.post(f"{server.base}/v1/chat/completions", json=body, timeout=120).json()
    streamed_chat = _stream_text(
        server, "/v1/chat/completions", {"messages": messages}, lambda c: c.get("delta", {}).get("content")
    )
    assert streamed_chat == whole_chat["choices"][0]["message"]["content"]


BAD_REQUESTS = {
    "prompt longer than max-model-len": {"prompt": [5] * 5000},
    "token id outside the vocabulary": {"prompt": [5, 10**6, 7]},
    "negative max_tokens": {"prompt": "the river", "max_tokens": -3},
    "unknown model name": {"prompt": "the river", "model": "no-such-model"},
}


@pytest.mark.slow
def test_bad_requests_are_refused_and_the_server_keeps_serving(server):
    prompt = _prompt(40, 21)
    before = _completion(server, prompt=prompt, return_token_ids=True)["choices"][0]["token_ids"]
    for name, overrides in BAD_REQUESTS.items():
        body = {"model": SERVED_NAME, "max_tokens": MAX_TOKENS, "temperature": 0.0, **overrides}
        response = requests.post(f"{server.base}/v1/completions", json=body, timeout=120)
        assert 400 <= response.status_code < 500, (name, response.status_code, response.text)
    assert requests.get(f"{server.base}/health", timeout=10).status_code == 200
    after = _completion(server, prompt=prompt, return_token_ids=True)["choices"][0]["token_ids"]
    assert after == before


@pytest.mark.slow
def test_64_concurrent_mixed_requests_equal_the_same_requests_alone(server):
    """Prompts of 1 to 1500 tokens, 1-16 new tokens, streaming and not, all at once, in the
    served bf16. A request whose ids differ from the same request alone must be a bf16
    rounding tie: both runs then match transformers' ids under the tie rule (the exact
    fp32 equality is ``test_load.py``'s)."""
    batch = mixed_requests(64, seed=5, max_prompt=1500)
    alone = [generated_ids(server, request) for request in batch]
    together = all_at_once(server, batch, workers=len(batch))
    for request, want_alone, got in zip(batch, alone, together):
        assert len(got) == request["max_tokens"]
        if got != want_alone:
            want, want_logits = hf_greedy(MODEL_DIR, SERVED_DTYPE, request["prompt"], request["max_tokens"])
            assert_greedy_matches(got, want, want_logits, SERVED_DTYPE)
            assert_greedy_matches(want_alone, want, want_logits, SERVED_DTYPE)
