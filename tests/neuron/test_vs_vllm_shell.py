"""Both shells of the one model definition give the same greedy ids: vLLM's engine (vLLM shell) and
the compiled Neuron shell on the harness, on the same prompts.

A GQA 4:1 variant with Dk == Dv (built here with the builder's own functions) runs too, so the
head layouts the tiny checkpoints lack are covered by both shells and by transformers.
"""

import pathlib

import pytest
import torch

from scripts import build_tiny_models as builder
from tests.support.engines import engine
from .test_harness import FAST_WORKLOAD, check, run_harness


def build_gqa4_model(out: pathlib.Path) -> str:
    """Qwen3.5 dense with 4 value heads per key head (Dk = Dv = 32) and 4 query heads per KV head."""
    import transformers as tf

    torch.manual_seed(3)
    tokenizer = builder.build_tokenizer()
    kwargs = builder._text_kwargs(tokenizer, intermediate_size=128, tie_word_embeddings=False,
                                  linear_num_key_heads=1, linear_num_value_heads=4, linear_key_head_dim=32,
                                  linear_value_head_dim=32, num_key_value_heads=1)
    model = tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**kwargs)).to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="200KB")
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3_5-dense", "qwen3_5-moe", "gqa4"])
def test_neuron_shell_ids_equal_the_vllm_shell_ids(tiny_model, tmp_path, model):
    from vllm import SamplingParams

    model_dir = build_gqa4_model(tmp_path / "gqa4") if model == "gqa4" else tiny_model(model)
    result = run_harness(model_dir, FAST_WORKLOAD, prefill_buckets=(32,), decode_buckets=(4,), num_gpu_blocks_override=24)
    check(result, model_dir, FAST_WORKLOAD)
    with engine(model_dir, dtype="float32", enable_prefix_caching=False) as llm:
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in result["prompts"]],
            [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n, _ in FAST_WORKLOAD],
            use_tqdm=False,
        )
    assert [list(o.outputs[0].token_ids) for o in outs] == result["ids"]
