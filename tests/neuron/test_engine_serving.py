"""The trn2 route served end to end through vLLM's own engine on CPU.

``vllm-gdn-serve MODEL --config <a shipped trn2 config, scaled>`` with ``VLLM_NEURON_STANDIN=1``
and ``tests/neuron`` on ``PYTHONPATH``: vLLM picks the Neuron platform stand-in
(``tests/neuron/vllm_neuron``) as its platform plugin, resolves the config's ``VllmGdnNeuron*``
architecture, and starts its API server and engine core, whose scheduler is the stand-in
``NeuronAsyncScheduler`` (``NeuronScheduler`` without async scheduling) and whose worker is
the stand-in ``NeuronWorker`` hosting the runner stand-in (``runner.py``) with the Neuron
shell. Every request below goes through vLLM's OpenAI server, its input processing,
scheduler, executor and output processing.

The config is the shipped one scaled to a tiny checkpoint of its family
(``serve_config.scaled`` / ``tiny_checkpoint``: every token count divided by one
power of two, the bucket structure kept), in float32 (transformers' ids must match exactly),
at tensor-parallel size 1 (the worker stand-in runs one rank on this 2-core machine).

What the worker reports (``VLLM_NEURON_STANDIN_STATS``: graphs traced at warm-up and since,
step kinds, buckets used) shows one static graph per bucket and no recompile: every step
after warm-up runs under ``torch.compiler.set_stance("fail_on_recompile")``, so a recompile
would also fail the request.

One server per config kind (module-scoped), shared by the tests of that kind.
"""

import contextlib
import glob
import json
import os
import pathlib

import pytest
import requests
import torch
import yaml

from tests.support import oracle
from tests.support.serving import (REQUEST_TIMEOUT_S, Server, all_at_once, completion, free_port, generated_ids,
                                   serving_process, stream_events)

from .serve_config import scaled, tiny_checkpoint
from .standin_stats import STATS_ENV

REPO = pathlib.Path(__file__).resolve().parents[2]
NEURON_TESTS = pathlib.Path(__file__).resolve().parent
SERVED_NAME = "trn2-tiny"
MAX_TOKENS = 6
VISION_BUCKET = 32  # patches

pytestmark = pytest.mark.slow


def served_settings(path: pathlib.Path, **overrides) -> dict:
    """A shipped config scaled to the tiny checkpoints (one rank), float32, ``overrides`` on top."""
    settings = scaled(yaml.safe_load(path.read_text()))
    settings.update({"dtype": "float32", "served-model-name": SERVED_NAME}, **overrides)
    return settings


@contextlib.contextmanager
def neuron_server(settings: dict, model_dir: str, folder: pathlib.Path):
    """``vllm-gdn-serve model_dir --config <settings>`` on the Neuron platform stand-in, healthy, stopped on exit."""
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(settings))
    stats = folder / "stats"
    stats.mkdir()
    env = {"VLLM_NEURON_STANDIN": "1", STATS_ENV: str(stats),
           "PYTHONPATH": os.pathsep.join([str(NEURON_TESTS), str(REPO), os.environ.get("PYTHONPATH", "")])}
    port = free_port()
    command = ["vllm-gdn-serve", model_dir, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    with serving_process(command, port, folder / "server.log", model=SERVED_NAME, env=env) as server:
        yield server


def reported(server: Server, who: str) -> dict:
    """What the stand-in ``who`` (``worker`` or ``scheduler``) last wrote to the stats folder."""
    (path,) = glob.glob(str(server.log_path.parent / "stats" / f"{who}-*.json"))
    return json.loads(pathlib.Path(path).read_text())


def prompt_of(length: int, seed: int, vocab_size: int = 512) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (length,), generator=generator).tolist()


@pytest.fixture(scope="module")
def dense(tiny_model, tmp_path_factory):
    """``configs/serve-trn2.yaml`` as shipped (async scheduling, on-device sampling), scaled."""
    settings = served_settings(REPO / "configs" / "serve-trn2.yaml")
    assert settings["async-scheduling"] is True
    model_dir = tiny_checkpoint(settings, tiny_model)
    with neuron_server(settings, model_dir, tmp_path_factory.mktemp("serve-trn2")) as server:
        yield server, settings, model_dir


def test_the_engine_runs_the_neuron_scheduler_and_worker(dense):
    server, settings, _ = dense
    log = server.log_path.read_text()
    assert "Neuron scheduler stand-in: NeuronAsyncScheduler" in log
    assert "Neuron worker stand-in: warm-up traced" in log
    assert reported(server, "scheduler")["scheduler"] == "NeuronAsyncScheduler"
    models = requests.get(f"{server.base}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [SERVED_NAME]


def test_completions_of_every_prefill_bucket_equal_transformers(dense):
    """Prompts for the small and the large prefill bucket (``num_batched_tokens_buckets`` scaled),
    one at a time, streamed and not."""
    server, settings, model_dir = dense
    small, large = settings["additional-config"]["neuron_config"]["num_batched_tokens_buckets"]
    for i, (length, stream) in enumerate([(1, False), (small - 1, True), (small + 5, False), (large - 8, True)]):
        prompt = prompt_of(length, i)
        got = generated_ids(server, {"prompt": prompt, "max_tokens": MAX_TOKENS, "stream": stream})
        want, _ = oracle.hf_greedy(model_dir, torch.float32, prompt, MAX_TOKENS)
        assert got == want, (length, stream)


def test_concurrent_requests_arriving_while_others_decode_equal_transformers(dense):
    """More requests than ``max-num-seqs`` at once: prompts wait in the holdback queue, prefill one
    per step while the rest decode between them; every other one streams."""
    server, settings, model_dir = dense
    lengths = [3, 40, 9, 70, 1, 25, 50]
    batch = [{"prompt": prompt_of(n, 100 + i), "max_tokens": 3 + i % 4, "stream": bool(i % 2)}
             for i, n in enumerate(lengths)]
    assert len(batch) > settings["max-num-seqs"]
    before = reported(server, "scheduler")
    got = all_at_once(server, batch, workers=len(batch))
    for request, ids in zip(batch, got):
        want, _ = oracle.hf_greedy(model_dir, torch.float32, request["prompt"], request["max_tokens"])
        assert ids == want, len(request["prompt"])
    steps = reported(server, "scheduler")
    assert steps["prefill_steps"] - before["prefill_steps"] == len(batch)  # one prompt per prefill step
    assert steps["most_prefills_in_a_step"] == 1
    assert steps["most_decodes_in_a_step"] == settings["max-num-seqs"]
    assert steps["most_held_back"] >= 1  # prompts waited while another one prefilled
    assert steps["steps_hiding_decodes"] > before["steps_hiding_decodes"]  # decodes waited for a prefill


def test_chat_n_and_stop_strings(dense):
    server, _, model_dir = dense
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": "the river and the mountain"}]
    body = {"model": SERVED_NAME, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    reply = requests.post(f"{server.base}/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    assert reply.status_code == 200, reply.text
    reply = reply.json()
    prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])
    assert reply["prompt_token_ids"] == prompt
    want, _ = oracle.hf_greedy(model_dir, torch.float32, prompt, MAX_TOKENS)
    assert reply["choices"][0]["token_ids"] == want
    streamed = "".join(event["choices"][0]["delta"].get("content") or ""
                       for event in stream_events(server, "/v1/chat/completions",
                                                  {"messages": messages, "max_tokens": MAX_TOKENS}))
    assert streamed == reply["choices"][0]["message"]["content"]

    # n (vLLM takes n > 1 only for sampled requests): top-k 1 sampled on the device is transformers'
    # greedy continuation in every choice.
    text_prompt = prompt_of(12, 7)
    choices = completion(server, prompt=text_prompt, max_tokens=MAX_TOKENS, n=3, temperature=1.0, top_k=1,
                         return_token_ids=True)["choices"]
    want, _ = oracle.hf_greedy(model_dir, torch.float32, text_prompt, MAX_TOKENS)
    assert len(choices) == 3 and all(c["token_ids"] == want for c in choices)

    # A stop string taken from the greedy text: the answer ends right before it.
    whole = completion(server, prompt=text_prompt, max_tokens=MAX_TOKENS)["choices"][0]
    text = whole["text"]
    stop = text[len(text) // 2:][:2]
    assert stop and "\ufffd" not in stop, text
    stopped = completion(server, prompt=text_prompt, max_tokens=MAX_TOKENS, stop=[stop])["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["text"] == text[:text.index(stop)]


REFUSED = {
    "structured outputs with enable_structured_outputs off": (
        {"response_format": {"type": "json_object"}}, "enable_structured_outputs"),
    "a structured-outputs choice with enable_structured_outputs off": (
        {"structured_outputs": {"choice": ["yes", "no"]}}, "enable_structured_outputs"),
    "logprobs under async scheduling": ({"logprobs": 2}, "async scheduling"),
}


def test_refused_requests_get_a_4xx_with_the_reason_and_the_server_keeps_serving(dense):
    server, _, model_dir = dense
    prompt = prompt_of(10, 3)
    want, _ = oracle.hf_greedy(model_dir, torch.float32, prompt, MAX_TOKENS)
    for name, (overrides, reason) in REFUSED.items():
        body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, **overrides}
        response = requests.post(f"{server.base}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S)
        assert 400 <= response.status_code < 500, (name, response.status_code, response.text)
        assert reason in response.text, (name, response.text)
        assert requests.get(f"{server.base}/health", timeout=10).status_code == 200
        assert generated_ids(server, {"prompt": prompt, "max_tokens": MAX_TOKENS}) == want


def test_one_static_graph_per_bucket_and_no_recompile(dense):
    """The graphs the worker traced (at warm-up and since) and the steps it ran, after a prompt per prefill
    bucket and whatever the other tests sent."""
    server, settings, _ = dense
    neuron = settings["additional-config"]["neuron_config"]
    buckets = len(neuron["num_batched_tokens_buckets"]) + len(neuron["num_seqs_buckets"])
    for bucket in neuron["num_batched_tokens_buckets"]:  # a prompt filling each prefill bucket
        generated_ids(server, {"prompt": prompt_of(bucket - 2, bucket), "max_tokens": 2})
    stats = reported(server, "worker")
    assert stats["buckets"] == buckets
    assert stats["warm_graphs"] == buckets and stats["graphs"] == buckets, stats
    assert stats["symbolic"] == 0
    assert stats["prefill_buckets_used"] == sorted(neuron["num_batched_tokens_buckets"])
    assert stats["decode_buckets_used"] == neuron["num_seqs_buckets"]
    assert stats["async_outputs"] == stats["prefill_steps"] + stats["decode_steps"] > 0


@pytest.fixture(scope="module")
def moe_synchronous(tiny_model, tmp_path_factory):
    """``configs/trn2/qwen3_5-35b-a3b.yaml`` scaled, with synchronous scheduling (``no-async-scheduling``,
    the configs' route for logprobs) and one image a prompt (its ``vision_neuron_config`` served: the
    tower compiled per vision bucket, M-RoPE positions): the MoE shell under ``NeuronScheduler``."""
    settings = served_settings(REPO / "configs" / "trn2" / "qwen3_5-35b-a3b.yaml")
    settings.pop("async-scheduling")
    settings["no-async-scheduling"] = True
    settings["limit-mm-per-prompt"] = {"image": 1, "video": 0}
    # The vision sizes scaled to the tiny tower (8-pixel patches, at most 16,384 pixels an image):
    # one 32-patch bucket, so that an image can exceed it.
    settings["additional-config"]["vision_neuron_config"] = {"vision_attention_block_size": VISION_BUCKET,
                                                             "num_vision_tokens_buckets": [VISION_BUCKET]}
    model_dir = tiny_checkpoint(settings, tiny_model)
    with neuron_server(settings, model_dir, tmp_path_factory.mktemp("moe-sync")) as server:
        yield server, settings, model_dir


def test_synchronous_moe_server_serves_concurrent_requests_with_transformers_ids(moe_synchronous):
    server, settings, model_dir = moe_synchronous
    assert "Neuron scheduler stand-in: NeuronScheduler," in server.log_path.read_text()
    small, large = settings["additional-config"]["neuron_config"]["num_batched_tokens_buckets"]
    lengths = [2, small - 3, large - 10, 17, 30]
    batch = [{"prompt": prompt_of(n, 200 + i), "max_tokens": 4, "stream": bool(i % 2)} for i, n in enumerate(lengths)]
    got = all_at_once(server, batch, workers=len(batch))
    for request, ids in zip(batch, got):
        want, _ = oracle.hf_greedy(model_dir, torch.float32, request["prompt"], request["max_tokens"])
        assert ids == want, len(request["prompt"])
    steps, stats = reported(server, "scheduler"), reported(server, "worker")
    assert steps["scheduler"] == "NeuronScheduler" and steps["most_prefills_in_a_step"] == 1
    assert steps["prefill_steps"] == len(batch)
    neuron = settings["additional-config"]["neuron_config"]
    buckets = len(neuron["num_batched_tokens_buckets"]) + len(neuron["num_seqs_buckets"])
    vision_buckets = len(settings["additional-config"]["vision_neuron_config"]["num_vision_tokens_buckets"])
    assert stats["vision_buckets"] == vision_buckets
    assert stats["warm_graphs"] == stats["graphs"] == buckets + vision_buckets and stats["symbolic"] == 0
    assert stats["async_outputs"] == 0


def _ask_about(server: Server, image) -> requests.Response:
    from tests.support.vision_oracle import data_url

    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}},
                                             {"type": "text", "text": "what is in the picture"}]}]
    body = {"model": SERVED_NAME, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    return requests.post(f"{server.base}/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)


def test_an_image_is_served_and_one_over_the_vision_bucket_refused(moe_synchronous):
    """An image inside the compiled vision bucket: transformers' ids (encoded by the compiled tower into
    the encoder cache, M-RoPE positions). One whose embeddings exceed the bucket: a 4xx naming it, and
    the server answers the first image again."""
    from tests.support.vision_oracle import hf_vl_greedy, noise_image

    server, settings, model_dir = moe_synchronous
    image = noise_image(64, 32, 5)  # 8 x 4 patches: the bucket

    def answer_equals_transformers():
        reply = _ask_about(server, image)
        assert reply.status_code == 200, reply.text
        reply = reply.json()
        want, _ = hf_vl_greedy(model_dir, torch.float32, list(reply["prompt_token_ids"]), [image], MAX_TOKENS)
        assert reply["choices"][0]["token_ids"] == want

    images_before = reported(server, "worker")["images"]
    answer_equals_transformers()
    assert reported(server, "worker")["images"] == images_before + 1
    refused = _ask_about(server, noise_image(128, 128, 6))  # 256 patches, 64 embeddings: over the bucket
    assert 400 <= refused.status_code < 500, (refused.status_code, refused.text[:500])
    assert "the compiled vision encoder takes" in refused.text
    answer_equals_transformers()


def test_logprobs_in_synchronous_mode_are_transformers_log_softmax(moe_synchronous):
    """The sampled token's logprob and the top 3 at every step, against transformers' fp32 logits."""
    server, _, model_dir = moe_synchronous
    prompt = prompt_of(20, 11)
    choice = completion(server, prompt=prompt, max_tokens=4, logprobs=3, return_tokens_as_token_ids=True,
                        return_token_ids=True)["choices"][0]
    want, logits = oracle.hf_greedy(model_dir, torch.float32, prompt, 4)
    assert choice["token_ids"] == want
    expected = torch.log_softmax(logits, dim=-1)
    for step, (token, logprob, top) in enumerate(zip(choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"],
                                                     choice["logprobs"]["top_logprobs"])):
        assert token == f"token_id:{want[step]}"
        assert logprob == pytest.approx(float(expected[step, want[step]]), abs=1e-4)
        values, ids = torch.topk(expected[step], 3)
        assert {int(k.removeprefix("token_id:")) for k in top} == set(ids.tolist())
        for key, value in top.items():
            assert value == pytest.approx(float(expected[step, int(key.removeprefix("token_id:"))]), abs=1e-4)
