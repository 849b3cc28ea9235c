"""The Hugging Face transformers oracle for greedy generation, and the comparison rule.

fp32: vLLM's greedy ids must equal transformers' ids exactly.
bf16: they must be equal up to the first step where transformers' own top logits
are a near-tie (within ``BF16_TIE_ULPS`` bf16 units in the last place of the top
logit): there two correct bf16 implementations may round to different tokens, and
the continuations then differ. Any other difference fails.
"""

import concurrent.futures
import functools
import math
import multiprocessing

import torch

# Largest logit gap accepted as a bf16 rounding tie, in bf16 ulps of the top logit.
BF16_TIE_ULPS = 4


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers around ``x``."""
    return torch.finfo(torch.bfloat16).eps * 2.0 ** math.floor(math.log2(max(abs(x), 1e-30)))


@functools.lru_cache(maxsize=8)
def hf_model(model_dir: str, dtype: torch.dtype):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    return model.eval()


def hf_greedy(model_dir: str, dtype: torch.dtype, prompt_ids: list[int], max_new_tokens: int):
    """Greedy continuation by transformers ``generate``: (ids, per-step logits [n, vocab]).

    End-of-sequence tokens are generated like any other and do not stop generation
    (vLLM's ``ignore_eos=True``): no logit is masked. ``eos_token_id=-1`` is an id no
    token has (``None`` falls back to the model config's end-of-sequence id).
    """
    return _generate(hf_model(model_dir, dtype), prompt_ids, max_new_tokens)


def _generate(model, prompt_ids: list[int], max_new_tokens: int):
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            eos_token_id=-1,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            return_dict_in_generate=True,
            output_logits=True,
        )
    ids = out.sequences[0, len(prompt_ids):].tolist()
    logits = torch.stack([step[0].float() for step in out.logits])
    return ids, logits


def _greedy_many(model_dir: str, dtype: torch.dtype, prompts: list[list[int]], max_new_tokens: int):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    return [_generate(model, prompt, max_new_tokens) for prompt in prompts]


def hf_greedy_in_subprocess(model_dir: str, dtype: torch.dtype, prompts: list[list[int]], max_new_tokens: int):
    """``hf_greedy`` of each prompt, in a fresh process: its memory goes back to the system on exit.

    For multi-GB checkpoints, where a second copy of the weights in this process (next
    to a vLLM engine) would not fit a shared machine.
    """
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_greedy_many, model_dir, dtype, prompts, max_new_tokens).result()


def assert_greedy_matches(got: list[int], want: list[int], want_logits: torch.Tensor, dtype: torch.dtype,
                          tie_ulps: int = BF16_TIE_ULPS) -> None:
    """Check vLLM's ids ``got`` against the oracle's ``want`` under the rule in the module doc
    (``tie_ulps``: the bf16 tie allowance, in ulps of the top logit)."""
    assert len(got) == len(want), (got, want)
    for step, (g, w) in enumerate(zip(got, want)):
        if g == w:
            continue
        gap = float(want_logits[step, w] - want_logits[step, g])
        if dtype == torch.bfloat16 and gap <= tie_ulps * bf16_ulp(float(want_logits[step, w])):
            return  # a rounding tie: the continuations legitimately differ from here
        raise AssertionError(
            f"greedy ids differ at step {step}: vLLM {got}, transformers {want} "
            f"(transformers prefers {w} over {g} by {gap:.4f} logits)"
        )
