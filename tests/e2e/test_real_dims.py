"""Greedy ids and bf16 logprobs at the published per-layer dimensions, against transformers.

Random-weight checkpoints with Qwen3.5-2B's and Qwen3.5-35B-A3B's per-layer shapes
(GatedDeltaNet heads of 128, attention heads of 256, the 248,320-token vocabulary;
four layers, eight experts: see ``scripts/build_tiny_models.py``), fp32 and bf16.
Prompts of 1 to 300 tokens with ids across the whole vocabulary, one mixed batch with
``max_num_batched_tokens=128``: the long prompts are prefilled in chunks while the
others decode.

The default backend (``auto``, whatever it resolves to on this CPU) is held to the
oracle's bf16 logprob error-ratio rule (``oracle`` module doc): its logprobs at every
generated step, against transformers' fp32 model teacher-forced along its ids, stray
by at most 1.5x what transformers' own bf16 model does (medians over the prompts).
``auto`` may pick vLLM's C++ CPU kernels for bf16 at these head sizes; those keep bf16
intermediates (~0.5 % state error per decode step by their own tests), and their greedy
ids may part from transformers' beyond the bf16 tie rule (seen: 35B-A3B dims,
300-token prompt, step 5, a 6-ulp gap), so greedy ids are held only on the torch backend.

Backend ``torch`` (``VLLM_GDN_BACKEND=torch``: the plugin's GDN math, float32 state and
accumulation): greedy ids in fp32 and bf16, and in bf16 the error-ratio rule too.
bf16 tie allowance: ``REAL_DIMS_TIE_ULPS`` (8) ulps of the top logit, not the tiny models' 4.
Through 2048-wide hidden states and a 248,320-row head, two correct bf16 evaluation orders
part by more: with the shared model math (one definition for the vLLM and the Neuron shell)
the 35B-A3B dims parted from transformers at step 2 by 0.156 logits (5 ulps) while fp32
stayed exact. On an AVX-512 BF16 CPU without AMX the same step parted by 0.203 logits (13
ulps), where transformers' fp32 gap was 0.102 and its own bf16 logits were off its fp32 ones
by up to 0.293: bf16 also gets the oracle's fp32-error rule (``oracle`` module doc). fp32 is
held to exact equality.

Cost: the bf16 runs of both backends and one transformers run that scores both (plus its
own greedy run) are made once per checkpoint (``bf16_runs``) and shared by the tests.
Memory: each checkpoint is 1.5-2.6 GB in bf16, twice that in fp32. Each vLLM engine and
then the transformers oracle run in a child process of their own, so only one copy of
the weights is alive at a time and all of it is returned on exit.
"""

import random

import pytest
import torch

from scripts import build_tiny_models as builder
from tests.support.engines import greedy_in_subprocess, greedy_logprobs_in_subprocess
from tests.support.oracle import (assert_greedy_matches, assert_logprob_error_ratio, hf_bf16_oracle_in_subprocess,
                                  hf_greedy_in_subprocess)
from vllm_gdn_neuron.preflight import load_checkpoint, parameter_count

from .test_checkpoint_sizes import served_tensor_sizes

MAX_NEW_TOKENS = 8
PROMPT_LENGTHS = (1, 17, 300, 64, 129)
# vLLM's logprobs of each step's best LOGPROBS tokens are scored by the error-ratio rule.
LOGPROBS = 5
REAL_DIMS_TIE_ULPS = 8
MODELS = ("qwen3_5-2b-real", "qwen3_5-35b-a3b-real")


@pytest.fixture(scope="module", params=MODELS)
def real_model(request, tiny_model) -> str:
    return tiny_model(request.param)


def test_real_dims_are_the_published_ones():
    """What the builder writes: the documented defaults of transformers' config classes."""
    import transformers as tf

    moe = builder.published_dims("qwen3_5-35b-a3b-real")
    defaults = tf.Qwen3_5MoeTextConfig()
    assert moe["vocab_size"] == defaults.vocab_size == 248_320
    assert (moe["hidden_size"], moe["head_dim"], moe["num_attention_heads"], moe["num_key_value_heads"]) == (2048, 256, 16, 2)
    assert (moe["linear_num_key_heads"], moe["linear_num_value_heads"], moe["linear_key_head_dim"]) == (16, 32, 128)
    assert (moe["moe_intermediate_size"], moe["num_experts_per_tok"]) == (512, 8)
    dense = builder.published_dims("qwen3_5-2b-real")
    assert (dense["hidden_size"], dense["num_attention_heads"], dense["linear_num_value_heads"]) == (2048, 8, 16)
    assert dense["linear_key_head_dim"] == dense["linear_value_head_dim"] == 128
    assert dense["vocab_size"] == 248_320 and dense["tie_word_embeddings"]


@pytest.mark.slow
def test_parameter_count_equals_the_real_dims_checkpoint(real_model):
    assert parameter_count(load_checkpoint(real_model).text) == served_tensor_sizes(real_model)[0]


def _prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in PROMPT_LENGTHS]


# The bf16 runs: the torch backend, and the default one as a user gets it (no backend named).
BF16_BACKENDS = {"torch": "torch", "default": None}


@pytest.fixture(scope="module")
def bf16_runs(real_model):
    """vLLM's bf16 runs on each of ``BF16_BACKENDS`` and transformers' oracle for them, once per
    checkpoint: ``(vllm {backend: [(ids, tokens, logprobs)]}, greedy, forced {backend: [...]})``
    (``greedy``, ``forced``: :func:`oracle.hf_bf16_oracle_in_subprocess`; one oracle run scores
    both backends' paths)."""
    prompts = _prompts(248_320)
    runs = {}
    for name, backend in BF16_BACKENDS.items():
        with pytest.MonkeyPatch.context() as patch:  # the engine's child process inherits the variable
            if backend is None:
                patch.delenv("VLLM_GDN_BACKEND", raising=False)
            else:
                patch.setenv("VLLM_GDN_BACKEND", backend)
            runs[name] = greedy_logprobs_in_subprocess(real_model, prompts, MAX_NEW_TOKENS, LOGPROBS,
                                                       dtype="bfloat16", enable_prefix_caching=False)
    scored = [(prompt, ids, tokens) for name in BF16_BACKENDS for prompt, (ids, tokens, _) in zip(prompts, runs[name])]
    greedy, forced = hf_bf16_oracle_in_subprocess(real_model, prompts, MAX_NEW_TOKENS, scored)
    per_backend = {name: forced[i * len(prompts):(i + 1) * len(prompts)] for i, name in enumerate(BF16_BACKENDS)}
    return runs, greedy, per_backend


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_ids_match_transformers_at_real_dims(real_model, dtype, monkeypatch, request):
    """The torch backend's greedy ids (bf16: its run in ``bf16_runs``)."""
    torch_dtype = getattr(torch, dtype)
    if torch_dtype == torch.bfloat16:
        runs, expected, _ = request.getfixturevalue("bf16_runs")
        got = [ids for ids, _, _ in runs["torch"]]
    else:
        monkeypatch.setenv("VLLM_GDN_BACKEND", "torch")  # the engine's child process inherits it
        prompts = _prompts(248_320)
        runs = hf_greedy_in_subprocess(real_model, torch_dtype, prompts, MAX_NEW_TOKENS)
        expected = [(ids, logits, None) for ids, logits in runs]
        got = greedy_in_subprocess(real_model, prompts, MAX_NEW_TOKENS, dtype=dtype, enable_prefix_caching=False)
    for ids, (want, want_logits, fp32_logits) in zip(got, expected):
        assert_greedy_matches(ids, want, want_logits, torch_dtype, tie_ulps=REAL_DIMS_TIE_ULPS, fp32_logits=fp32_logits)


@pytest.mark.slow
@pytest.mark.parametrize("backend", list(BF16_BACKENDS))
def test_bf16_logprobs_are_within_transformers_bf16_error_at_real_dims(real_model, bf16_runs, backend):
    """The error-ratio rule, on the torch backend and on the default one (``auto``, unpinned)."""
    runs, _, forced = bf16_runs
    ratio = assert_logprob_error_ratio([torch.tensor(logprobs) for _, _, logprobs in runs[backend]], forced[backend])
    print(f"{real_model} {backend}: bf16 logprob error {ratio:.3f}x transformers' own")
