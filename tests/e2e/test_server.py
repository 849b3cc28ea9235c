"""The README's serve command as a real server: OpenAI-compatible endpoints and the ids again.

One server for the module: ``bash scripts/serve.sh --port <free port>`` (the README
command: venv set-up, the default tiny model built if missing, ``vllm-gdn-serve`` with
``configs/serve-cpu.yaml``), engine core in its own process as in production; killed
by its process-group id at the end.
"""

import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import time

import pytest
import requests
import torch

from oracle import assert_greedy_matches, hf_greedy

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL_DIR = str(REPO / "configs" / "tiny-models" / "qwen3_5-dense")
SERVED_NAME = "qwen3_5-tiny"  # configs/serve-cpu.yaml
SERVED_DTYPE = torch.bfloat16  # the checkpoint's dtype ("auto")
START_TIMEOUT_S = 240
MAX_TOKENS = 8


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the production process layout
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            ["bash", str(REPO / "scripts" / "serve.sh"), "--port", str(port)],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {START_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(1)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(n)]


def _completion(base: str, **body) -> dict:
    body = {"model": SERVED_NAME, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True, **body}
    response = requests.post(f"{base}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def _stream_text(base: str, path: str, body: dict, field) -> str:
    body = {"model": SERVED_NAME, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
            "stream": True, **body}
    pieces = []
    with requests.post(f"{base}{path}", json=body, stream=True, timeout=120) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            for choice in json.loads(line[len(b"data: "):])["choices"]:
                pieces.append(field(choice) or "")
    return "".join(pieces)


@pytest.mark.slow
def test_models_lists_the_served_model(server):
    listed = requests.get(f"{server}/v1/models", timeout=10).json()
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
    response = requests.post(f"{server}/v1/chat/completions", json=body, timeout=120)
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
    whole_chat = requests.post(f"{server}/v1/chat/completions", json=body, timeout=120).json()
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
        response = requests.post(f"{server}/v1/completions", json=body, timeout=120)
        assert 400 <= response.status_code < 500, (name, response.status_code, response.text)
    assert requests.get(f"{server}/health", timeout=10).status_code == 200
    after = _completion(server, prompt=prompt, return_token_ids=True)["choices"][0]["token_ids"]
    assert after == before
