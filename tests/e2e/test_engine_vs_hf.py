"""Greedy ids of the in-process vLLM engine against transformers ``generate``.

Every tiny model (dense, MoE, Qwen3-Next packed layout, dense and MoE vision-language text parts) in
fp32 and bf16; prompts of 1 to 1000 tokens; ``max_num_batched_tokens=128`` so the long
prompts are prefilled in chunks (GDN states carried between chunks through the cache).
The same prompts run once as one mixed batch (decodes and prefills in one step) and
once one at a time; both must match the oracle.
"""

import random

import pytest
import torch

from tests.support.engines import engine
from tests.support.oracle import assert_greedy_matches, hf_greedy

MAX_NEW_TOKENS = 8
PROMPT_LENGTHS = (1, 17, 300, 1000)


def prompts(vocab_size: int = 512, first_id: int = 3) -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(first_id, vocab_size) for _ in range(n)] for n in PROMPT_LENGTHS]


def _greedy(llm, batch: list[list[int]]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", ["qwen3_5-dense", "qwen3_5-moe", "qwen3-next", "qwen3_5-vl", "qwen3_5-moe-vl"])
def test_greedy_ids_match_transformers(tiny_model, model, dtype):
    torch_dtype = getattr(torch, dtype)
    batch = prompts()
    with engine(tiny_model(model), dtype=dtype, enable_prefix_caching=False) as llm:
        batched = _greedy(llm, batch)
        one_by_one = [_greedy(llm, [p])[0] for p in batch]
    for prompt, got_batched, got_single in zip(batch, batched, one_by_one):
        want, want_logits = hf_greedy(tiny_model(model), torch_dtype, prompt, MAX_NEW_TOKENS)
        assert_greedy_matches(got_batched, want, want_logits, torch_dtype)
        assert_greedy_matches(got_single, want, want_logits, torch_dtype)
    if dtype == "float32":
        assert batched == one_by_one
