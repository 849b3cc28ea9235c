"""Prefix caching under vLLM's mamba ``align`` mode: a cache hit changes no greedy id.

In ``align`` mode vLLM prefills in chunks that end on cache-block boundaries and
keeps the GDN states (conv ``[C, K]`` and recurrent) of each finished block in that
block's slot; a later request with the same prefix starts from the copied slot
(the plugin's whole-slot copy functions). The ids must equal both the run without
a hit and transformers' ids.
"""

import random

import pytest
import torch

from tests.support.engines import engine
from tests.support.oracle import assert_greedy_matches, hf_greedy

MAX_NEW_TOKENS = 8
BLOCK = 128  # hits are whole cache blocks


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3_5-dense", "qwen3-next"])
def test_cache_hit_gives_the_same_ids(tiny_model, model):
    from vllm import SamplingParams

    rng = random.Random(2)
    prefix = [rng.randrange(3, 512) for _ in range(3 * BLOCK + 40)]
    same = list(prefix)
    extended = prefix + [rng.randrange(3, 512) for _ in range(29)]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)

    with engine(tiny_model(model), dtype="float32", enable_prefix_caching=True, block_size=BLOCK) as llm:
        assert llm.llm_engine.vllm_config.cache_config.mamba_cache_mode == "align"
        first = llm.generate([{"prompt_token_ids": prefix}], params, use_tqdm=False)[0]
        again = llm.generate([{"prompt_token_ids": same}], params, use_tqdm=False)[0]
        longer = llm.generate([{"prompt_token_ids": extended}], params, use_tqdm=False)[0]

    assert not first.num_cached_tokens
    assert again.num_cached_tokens >= 3 * BLOCK, again.num_cached_tokens
    assert longer.num_cached_tokens >= 3 * BLOCK, longer.num_cached_tokens
    assert list(again.outputs[0].token_ids) == list(first.outputs[0].token_ids)
    for prompt, out in ((prefix, first), (extended, longer)):
        want, want_logits = hf_greedy(tiny_model(model), torch.float32, prompt, MAX_NEW_TOKENS)
        assert_greedy_matches(list(out.outputs[0].token_ids), want, want_logits, torch.float32)
