"""The plugin serves the committed trained checkpoint (``configs/trained/qwen3_5-tiny-mtp``):
greedy text that continues held-out templates, equal to transformers' greedy ids (fp32), and
its ``mtp.*`` tensors do not stop a serving model from loading."""

import pytest
import torch
from scripts import train_tiny_mtp as trainer

from tests.support.engines import engine
from tests.support.oracle import hf_greedy

PROMPTS = {
    "count from three to nine:": " three four five six seven eight nine.",
    "the days from friday to tuesday:": " friday saturday sunday monday tuesday.",
}


@pytest.mark.slow
def test_plugin_serves_the_trained_model_text():
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    folder = str(trainer.DEFAULT_OUT)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [tokenizer(prompt)["input_ids"] for prompt in PROMPTS]
    lengths = [len(tokenizer(text)["input_ids"]) for text in PROMPTS.values()]
    with engine(folder, dtype="float32", enable_prefix_caching=False) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths],
                            use_tqdm=False)
    for prompt, out, n, continuation in zip(prompts, outs, lengths, PROMPTS.values()):
        ids = list(out.outputs[0].token_ids)
        assert tokenizer.decode(ids) == continuation
        assert ids == hf_greedy(folder, torch.float32, prompt, n)[0]
