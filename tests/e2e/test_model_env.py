"""``MODEL=<checkpoint> bash scripts/serve.sh``: a checkpoint other than the tiny model, end to end.

A random checkpoint with Qwen3.5-2B's per-layer dimensions (4 layers, the 248,320-token
vocabulary) served by the README's command with ``MODEL`` set, and a memory budget
(``VLLM_GDN_SERVE_MEMORY_GIB``) small enough that the derived cache caps the context
below the checkpoint's 262,144 positions. The server must use the derived settings
(served under the folder's name, the auto-fitted context, printed once) and give
transformers' greedy ids.
"""

import pathlib

import pytest
import requests
import torch

from scripts import build_tiny_models as builder
from tests.support.oracle import assert_greedy_matches, hf_greedy_in_subprocess
from tests.support.serving import REPO, Server, completion, running_server

MEMORY_GIB = 5.0
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def model_dir(tiny_model) -> str:
    return tiny_model("qwen3_5-2b-real")


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory) -> Server:
    log_path = tmp_path_factory.mktemp("model-env") / "server.log"
    # The plugin's torch GDN math, as in test_real_dims.py (whose docstring says why).
    env = {"MODEL": model_dir, "VLLM_GDN_SERVE_MEMORY_GIB": str(MEMORY_GIB), "VLLM_GDN_BACKEND": "torch"}
    with running_server(log_path, model=pathlib.Path(model_dir).name, env=env) as running:
        yield running


@pytest.mark.slow
def test_the_checkpoint_is_served_with_settings_derived_from_it(server, model_dir):
    from vllm_gdn_neuron import cli
    from vllm_gdn_neuron.preflight import load_checkpoint

    listed = requests.get(f"{server.base}/v1/models", timeout=30).json()["data"]
    assert [m["id"] for m in listed] == ["qwen3_5-2b-real"]
    served_len = listed[0]["max_model_len"]
    log = server.log_path.read_text()
    assert log.count("vllm-gdn-serve: ") == 2 and log.count("vllm-gdn-serve: LD_PRELOAD") == 1  # report, preload
    assert "derived: --served-model-name qwen3_5-2b-real" in log
    assert "Auto-fit max_model_len: reduced from 262144" in log
    # The context vLLM fitted is the one the printed arithmetic predicts, up to its page rounding.
    settings = cli.derive_settings(load_checkpoint(model_dir), cli.given_settings(["--config", str(REPO / "configs" / "serve-cpu.yaml")]),
                                   (int(MEMORY_GIB * cli.GiB), cli.MEMORY_ENV), cli.worker_nodes({}))
    estimate = settings.context_estimate(load_checkpoint(model_dir))
    assert 0.9 * estimate <= served_len <= estimate < 262_144


@pytest.mark.slow
def test_the_checkpoint_gives_transformers_ids(server, model_dir):
    prompts = [[5, 900, 248_000, 17], list(range(1000, 1300))]
    out = completion(server, prompt=prompts, max_tokens=MAX_TOKENS, return_token_ids=True)
    choices = sorted(out["choices"], key=lambda c: c["index"])
    got = [choice["token_ids"] for choice in choices]
    assert all(choice["text"].strip() for choice in choices), choices  # the tokenizer covers the vocabulary
    for ids, (want, want_logits) in zip(got, hf_greedy_in_subprocess(model_dir, torch.bfloat16, prompts, MAX_TOKENS)):
        assert_greedy_matches(ids, want, want_logits, torch.bfloat16)


def test_the_real_dims_tokenizer_decodes_every_id_of_the_vocabulary():
    vocab_size = builder.published_dims("qwen3_5-2b-real")["vocab_size"]
    tokenizer = builder.build_tokenizer(vocab_size)
    assert len(tokenizer) == vocab_size
    assert sorted(tokenizer.get_vocab().values()) == list(range(vocab_size))  # one token per id, no gaps
    past_trained = [builder.VOCAB_SIZE, 100_000, vocab_size - 1]
    assert all(tokenizer.decode([i]).strip() for i in past_trained)
    assert tokenizer("the state gate").input_ids == builder.build_tokenizer()("the state gate").input_ids
