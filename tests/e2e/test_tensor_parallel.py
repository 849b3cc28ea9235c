"""Tensor parallelism (TP=2, one CPU core per rank): GDN heads, attention heads and experts
sharded by vLLM's parallel layers give transformers' greedy ids.

The Qwen3-Next tiny model covers the most: packed per-key-head projections un-interleaved
before sharding, GQA 2:4 GDN heads (one key head and its two value heads per rank),
conv channels split per q | k | v part, MoE and dense layers.
"""

import random

import pytest
import torch

from tests.support.engines import engine
from tests.support.oracle import assert_greedy_matches, hf_greedy

MAX_NEW_TOKENS = 8


@pytest.mark.slow
def test_tp2_greedy_ids_match_transformers(tiny_model, monkeypatch):
    from vllm import SamplingParams

    # vLLM's CPU workers bind one NUMA node each unless told which cores to use.
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 37, 300)]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    model_dir = tiny_model("qwen3-next")
    with engine(model_dir, dtype="float32", tensor_parallel_size=2, distributed_executor_backend="mp") as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        want, want_logits = hf_greedy(model_dir, torch.float32, prompt, MAX_NEW_TOKENS)
        assert_greedy_matches(list(out.outputs[0].token_ids), want, want_logits, torch.float32)
