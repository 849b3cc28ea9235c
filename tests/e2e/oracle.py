"""The Hugging Face transformers oracle for greedy generation, and the comparison rule.

fp32: vLLM's greedy ids must equal transformers' ids exactly.
bf16: they must be equal up to the first step where transformers' own top logits
are a near-tie (within ``BF16_TIE_ULPS`` bf16 units in the last place of the top
logit): there two correct bf16 implementations may round to different tokens, and
the continuations then differ. Any other difference fails.

bf16 with fp32 logits along transformers' path (``hf_greedy_with_fp32_in_subprocess``, for
the real-dimension checkpoints): a step also counts as a tie when transformers' fp32 logits
separate the two tokens by no more than transformers' own bf16 logits stray from its fp32
ones at that step (the largest difference over the vocabulary). Through 2048-wide hidden
states and a 248,320-row head that error outgrows any fixed number of ulps; which correct
bf16 evaluation order wins such a step is machine-dependent (oneDNN's AMX and AVX-512 BF16
kernels accumulate differently).
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


def _greedy_with_fp32_many(model_dir: str, prompts: list[list[int]], max_new_tokens: int):
    import transformers

    runs = _greedy_many(model_dir, torch.bfloat16, prompts, max_new_tokens)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for prompt, (ids, logits) in zip(prompts, runs):
        with torch.no_grad():  # teacher-forced on the bf16 path: step s sees prompt + ids[:s]
            fp32 = model(torch.tensor([prompt + ids[:-1]])).logits[0, len(prompt) - 1:].float()
        out.append((ids, logits, fp32))
    return out


def _in_subprocess(function, *args):
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(function, *args).result()


def hf_greedy_with_fp32_in_subprocess(model_dir: str, prompts: list[list[int]], max_new_tokens: int):
    """bf16 ``hf_greedy`` of each prompt plus transformers' fp32 logits at the same steps, in a
    fresh process: ``[(ids, bf16 logits [n, vocab], fp32 logits [n, vocab])]``.

    The fp32 model is teacher-forced along the bf16 ids, so row s of both logits follows the
    same prefix. The two models are loaded one after the other, not side by side.
    """
    return _in_subprocess(_greedy_with_fp32_many, model_dir, prompts, max_new_tokens)


def hf_greedy_in_subprocess(model_dir: str, dtype: torch.dtype, prompts: list[list[int]], max_new_tokens: int):
    """``hf_greedy`` of each prompt, in a fresh process: its memory goes back to the system on exit.

    For multi-GB checkpoints, where a second copy of the weights in this process (next
    to a vLLM engine) would not fit a shared machine.
    """
    return _in_subprocess(_greedy_many, model_dir, dtype, prompts, max_new_tokens)


def _within_bf16_error(step: int, w: int, g: int, want_logits: torch.Tensor, fp32_logits: torch.Tensor):
    """(tie?, why): transformers' fp32 gap between ``w`` and ``g`` against its bf16 logits' error."""
    fp32_gap = float(fp32_logits[step, w] - fp32_logits[step, g])
    error = float((want_logits[step] - fp32_logits[step]).abs().max())
    return fp32_gap <= error, f"; in fp32 by {fp32_gap:.4f}, transformers' bf16 logits off fp32 by up to {error:.4f}"


def assert_greedy_matches(got: list[int], want: list[int], want_logits: torch.Tensor, dtype: torch.dtype,
                          tie_ulps: int = BF16_TIE_ULPS, fp32_logits: torch.Tensor | None = None) -> None:
    """Check vLLM's ids ``got`` against the oracle's ``want`` under the rules in the module doc
    (``tie_ulps``: the bf16 tie allowance, in ulps of the top logit; ``fp32_logits``: transformers'
    fp32 logits along ``want``, for the bf16 error rule)."""
    assert len(got) == len(want), (got, want)
    for step, (g, w) in enumerate(zip(got, want)):
        if g == w:
            continue
        gap = float(want_logits[step, w] - want_logits[step, g])
        tie, why = dtype == torch.bfloat16 and gap <= tie_ulps * bf16_ulp(float(want_logits[step, w])), ""
        if dtype == torch.bfloat16 and not tie and fp32_logits is not None:
            tie, why = _within_bf16_error(step, w, g, want_logits, fp32_logits)
        if tie:
            return  # a rounding tie: the continuations legitimately differ from here
        raise AssertionError(
            f"greedy ids differ at step {step}: vLLM {got}, transformers {want} "
            f"(transformers prefers {w} over {g} by {gap:.4f} logits{why})"
        )
