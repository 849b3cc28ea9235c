"""The Hugging Face transformers oracle for greedy generation, and the comparison rule.

fp32: vLLM's greedy ids must equal transformers' ids exactly.
bf16: they must be equal up to the first step where transformers' own top logits
are a near-tie (within ``BF16_TIE_ULPS`` bf16 units in the last place of the top
logit): there two correct bf16 implementations may round to different tokens, and
the continuations then differ. Any other difference fails.

bf16 with fp32 logits along transformers' path (``hf_bf16_oracle_in_subprocess``, for
the real-dimension checkpoints): a step also counts as a tie when transformers' fp32 logits
separate the two tokens by no more than transformers' own bf16 logits stray from its fp32
ones at that step (the largest difference over the vocabulary). Through 2048-wide hidden
states and a 248,320-row head that error outgrows any fixed number of ulps; which correct
bf16 evaluation order wins such a step is machine-dependent (oneDNN's AMX and AVX-512 BF16
kernels accumulate differently).

bf16 logprob error ratio (``assert_logprob_error_ratio``, for the real-dimension
checkpoints, whatever backend serves them): transformers' fp32 model, teacher-forced along
vLLM's own greedy ids, scores vLLM's top logprobs at every generated step; so does
transformers' bf16 model along the same ids. Per prompt, an error is the mean absolute
difference from fp32 over those steps and tokens. The median of vLLM's errors over the
prompts must be at most ``MAX_BF16_ERROR_RATIO`` (1.5) times the median of transformers'
own bf16 errors: a backend may round differently from transformers, but not by more than
bf16 itself does. Unlike the greedy rule it does not end at the first near-tie, and it
holds the logprobs of every step, not only their arg max.

Sampled tokens (``chi2_homogeneity``): two samples of one generated position's tokens (say
with and without speculative decoding, independent seeds) are drawn from one distribution
unless Pearson's chi-square homogeneity test over their token counts (rare tokens pooled)
says otherwise at the caller's false-alarm rate.
"""

import collections
import concurrent.futures
import functools
import gc
import math
import multiprocessing
import statistics

import torch

# Largest logit gap accepted as a bf16 rounding tie, in bf16 ulps of the top logit.
BF16_TIE_ULPS = 4
# Largest ratio of vLLM's bf16 logprob error to transformers' own (medians over prompts).
MAX_BF16_ERROR_RATIO = 1.5


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers around ``x``."""
    return torch.finfo(torch.bfloat16).eps * 2.0 ** math.floor(math.log2(max(abs(x), 1e-30)))


@functools.lru_cache(maxsize=8)
def hf_model(model_dir: str, dtype: torch.dtype):
    return _load(model_dir, dtype)


def hf_greedy(model_dir: str, dtype: torch.dtype, prompt_ids: list[int], max_new_tokens: int):
    """Greedy continuation by transformers ``generate``: (ids, per-step logits [n, vocab]).

    End-of-sequence tokens are generated like any other and do not stop generation
    (vLLM's ``ignore_eos=True``): no logit is masked. ``eos_token_id=-1`` is an id no
    token has (``None`` falls back to the model config's end-of-sequence id).
    """
    return _generate(hf_model(model_dir, dtype), prompt_ids, max_new_tokens)


def _generate(model, prompt_ids: list[int], max_new_tokens: int, **model_inputs):
    """Greedy ids and logits (``hf_greedy``); ``model_inputs``: more ``generate`` inputs (pixel values)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            **model_inputs,
            eos_token_id=-1,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            return_dict_in_generate=True,
            output_logits=True,
        )
    ids = out.sequences[0, len(prompt_ids):].tolist()
    logits = torch.stack([step[0].float() for step in out.logits])
    return ids, logits


def _load(model_dir: str, dtype: torch.dtype):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()


def _greedy_many(model_dir: str, dtype: torch.dtype, prompts: list[list[int]], max_new_tokens: int):
    model = _load(model_dir, dtype)
    return [_generate(model, prompt, max_new_tokens) for prompt in prompts]


def _forced_logits(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    """float32 logits ``[len(ids), vocab]`` teacher-forced along ``ids``: row s sees prompt + ids[:s]."""
    with torch.no_grad():
        return model(torch.tensor([prompt + ids[:-1]])).logits[0, len(prompt) - 1:].float()


def _forced_logprobs(model, prompt: list[int], ids: list[int], tokens: list[list[int]]) -> torch.Tensor:
    """Teacher-forced log-probabilities ``[len(ids), k]`` of ``tokens[s]`` (k ids) at each step s."""
    logprobs = torch.log_softmax(_forced_logits(model, prompt, ids), dim=-1)
    return torch.gather(logprobs, 1, torch.tensor(tokens))


def in_subprocess(function, *args):
    """``function(*args)`` in a fresh ``spawn`` process (its memory goes back to the system on exit)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(function, *args).result()


def _bf16_oracle(model_dir: str, prompts: list[list[int]], max_new_tokens: int, scored):
    """The bf16 model, then the fp32 model (never both loaded): greedy runs of ``prompts`` with
    fp32 logits along them, and bf16 / fp32 logprobs along each ``(prompt, ids, tokens)`` of ``scored``."""
    model = _load(model_dir, torch.bfloat16)
    runs = [_generate(model, prompt, max_new_tokens) for prompt in prompts] if max_new_tokens else []
    forced_bf16 = [_forced_logprobs(model, *path) for path in scored]
    del model
    gc.collect()
    model = _load(model_dir, torch.float32)
    greedy = [(ids, logits, _forced_logits(model, prompt, ids)) for prompt, (ids, logits) in zip(prompts, runs)]
    forced_fp32 = [_forced_logprobs(model, *path) for path in scored]
    return greedy, list(zip(forced_bf16, forced_fp32))


def hf_bf16_oracle_in_subprocess(model_dir: str, prompts: list[list[int]], max_new_tokens: int = 0,
                                 scored: list[tuple[list[int], list[int], list[list[int]]]] = ()):
    """Transformers' bf16 oracle with its fp32 reference, in a fresh process: ``(greedy, forced)``.

    ``greedy`` (when ``max_new_tokens`` > 0): per prompt, the bf16 ``hf_greedy`` run plus the
    fp32 logits at the same steps, ``(ids, bf16 logits [n, vocab], fp32 logits [n, vocab])``;
    the fp32 model is teacher-forced along the bf16 ids, so row s of both follows the same
    prefix. ``forced``: per ``(prompt, ids of n steps, k token ids to score at each step)``
    of ``scored``, ``(bf16 logprobs [n, k], fp32 logprobs [n, k])`` of those tokens, both
    models teacher-forced along the given ids. The two models are loaded one after the
    other, not side by side.
    """
    return in_subprocess(_bf16_oracle, model_dir, prompts, max_new_tokens, list(scored))


def hf_greedy_in_subprocess(model_dir: str, dtype: torch.dtype, prompts: list[list[int]], max_new_tokens: int):
    """``hf_greedy`` of each prompt, in a fresh process: its memory goes back to the system on exit.

    For multi-GB checkpoints, where a second copy of the weights in this process (next
    to a vLLM engine) would not fit a shared machine.
    """
    return in_subprocess(_greedy_many, model_dir, dtype, prompts, max_new_tokens)


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


def logprob_error(logprobs: torch.Tensor, reference: torch.Tensor) -> float:
    """Mean absolute difference of two ``[steps, k]`` logprob tables of the same tokens."""
    return float((logprobs.double() - reference.double()).abs().mean())


def assert_logprob_error_ratio(got: list[torch.Tensor], forced: list[tuple[torch.Tensor, torch.Tensor]],
                               max_ratio: float = MAX_BF16_ERROR_RATIO) -> float:
    """Check vLLM's bf16 logprobs against transformers fp32 under the error-ratio rule (module doc).

    Args:
        got: per prompt, vLLM's logprobs ``[steps, k]`` of the tokens it scored.
        forced: per prompt, transformers' ``(bf16, fp32)`` logprobs of the same tokens along
            vLLM's ids (``hf_bf16_oracle_in_subprocess``'s ``forced``).
        max_ratio: the largest ratio of the medians accepted.

    Returns:
        The ratio: median over prompts of vLLM's error over the median of transformers' bf16 error.
    """
    if not got or len(got) != len(forced):
        raise ValueError(f"got must have one table per prompt of forced ({len(forced)}); got {len(got)}")
    ours = [logprob_error(lp, fp32) for lp, (_, fp32) in zip(got, forced)]
    theirs = [logprob_error(bf16, fp32) for bf16, fp32 in forced]
    ratio = statistics.median(ours) / statistics.median(theirs)
    assert ratio <= max_ratio, (
        f"vLLM's bf16 logprob error against transformers fp32 is {ratio:.2f}x transformers' own bf16 error "
        f"(medians over prompts: {statistics.median(ours):.4f} and {statistics.median(theirs):.4f}; per prompt "
        f"vLLM {[round(e, 4) for e in ours]}, transformers {[round(e, 4) for e in theirs]}); at most {max_ratio}x allowed"
    )
    return ratio


def chi2_homogeneity(a: list[int], b: list[int], min_count: int = 10) -> tuple[float, int]:
    """(p-value, degrees of freedom) of Pearson's chi-square test that the values ``a`` and ``b``
    are drawn from one distribution (two independent, non-empty samples).

    A value seen at least ``min_count`` times in both samples together has a bin of its own
    (with samples of equal size, an expected count of at least ``min_count / 2`` in each);
    the rarer values share one bin, itself folded into the smallest bin when it stays under
    ``min_count``. The bins depend on the pooled counts only, never on which sample a value
    came from, so the test keeps its size. One bin (dof 0) tests nothing: p = 1.
    """
    if not a or not b:
        raise ValueError(f"a and b must be non-empty samples; got {len(a)} and {len(b)} values")
    count_a, count_b = collections.Counter(a), collections.Counter(b)
    pooled = count_a + count_b
    rare = [v for v in pooled if pooled[v] < min_count]
    bins = [[count_a[v], count_b[v]] for v in sorted(pooled) if pooled[v] >= min_count]
    rest = [sum(count_a[v] for v in rare), sum(count_b[v] for v in rare)]
    if sum(rest) >= min_count or not bins:
        bins.append(rest)
    elif rare:
        smallest = min(bins, key=sum)
        smallest[0] += rest[0]
        smallest[1] += rest[1]
    dof = len(bins) - 1
    if dof == 0:
        return 1.0, 0
    size_a, size_b = len(a), len(b)
    statistic = 0.0
    for n_a, n_b in bins:
        share = (n_a + n_b) / (size_a + size_b)
        statistic += (n_a - share * size_a) ** 2 / (share * size_a) + (n_b - share * size_b) ** 2 / (share * size_b)
    p = torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                torch.tensor(statistic / 2, dtype=torch.float64))
    return float(p), dof
