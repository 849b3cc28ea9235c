"""The comparison rules of ``oracle`` on hand-made numbers: greedy ids (``assert_greedy_matches``),
the bf16 logprob error ratio (``assert_logprob_error_ratio``) and the chi-square homogeneity
test of sampled tokens (``chi2_homogeneity``: its value on a hand-computed table, its false-alarm
rate on samples of one distribution, its power on two)."""

import pytest
import torch

from tests.support.oracle import (assert_greedy_matches, assert_logprob_error_ratio, bf16_ulp, chi2_homogeneity,
                                  logprob_error)


def _logits(top: float, runner_up: float, vocab: int = 6) -> torch.Tensor:
    """One step: token 0 at ``top``, token 1 at ``runner_up``, the rest far below."""
    row = torch.full((1, vocab), -10.0)
    row[0, 0], row[0, 1] = top, runner_up
    return row


def test_equal_ids_pass_and_fp32_holds_to_exact_ids():
    assert_greedy_matches([0], [0], _logits(4.0, 3.99), torch.float32)
    with pytest.raises(AssertionError, match="differ at step 0"):
        assert_greedy_matches([1], [0], _logits(4.0, 4.0 - bf16_ulp(4.0)), torch.float32)


def test_bf16_near_tie_in_ulps_ends_the_comparison():
    ulp = bf16_ulp(3.9)
    assert_greedy_matches([1, 5], [0, 2], _logits(3.9, 3.9 - 4 * ulp).repeat(2, 1), torch.bfloat16)
    with pytest.raises(AssertionError, match="prefers 0 over 1"):
        assert_greedy_matches([1], [0], _logits(3.9, 3.9 - 5 * ulp), torch.bfloat16)


def test_bf16_fp32_error_rule():
    """A 13-ulp bf16 gap is a tie when fp32 separates the tokens by less than bf16 strays from it."""
    want = _logits(3.97, 3.97 - 0.2031)
    close = _logits(3.9, 3.9 - 0.1018)
    close[0, 4] = want[0, 4] + 0.2932  # transformers' bf16 logits off fp32 by up to 0.2932
    assert_greedy_matches([1], [0], want, torch.bfloat16, tie_ulps=8, fp32_logits=close)
    far = _logits(3.9, 3.9 - 0.5)
    with pytest.raises(AssertionError, match=r"in fp32 by 0\.5000, transformers' bf16 logits off fp32 by up to 0\.3669"):
        assert_greedy_matches([1], [0], want, torch.bfloat16, tie_ulps=8, fp32_logits=far)
    with pytest.raises(AssertionError):
        assert_greedy_matches([1], [0], want, torch.float32, fp32_logits=close)


def _forced(fp32_rows, error_rows):
    """Per prompt: transformers' (bf16, fp32) logprob tables, bf16 = fp32 + the given errors."""
    return [(torch.tensor(fp32) + torch.tensor(err), torch.tensor(fp32)) for fp32, err in zip(fp32_rows, error_rows)]


def test_logprob_error_is_the_mean_absolute_difference():
    assert logprob_error(torch.tensor([[-1.0, -2.0], [-3.0, -4.5]]), torch.tensor([[-1.5, -2.0], [-2.0, -4.0]])) == 0.5


def test_error_ratio_rule_holds_medians_over_prompts_to_1_5x():
    fp32 = [[[-10.0, -11.0]], [[-9.0, -12.0]], [[-10.5, -10.6]]]
    forced = _forced(fp32, [[[0.1, -0.1]], [[0.2, 0.2]], [[-0.3, 0.3]]])  # transformers: 0.1, 0.2, 0.3 (median 0.2)
    ours = [torch.tensor(f) + d for f, d in zip(fp32, (0.05, 0.29, 2.0))]  # vLLM: 0.05, 0.29, 2.0 (median 0.29)
    assert assert_logprob_error_ratio(ours, forced) == pytest.approx(1.45, rel=1e-4)
    worse = [torch.tensor(f) + d for f, d in zip(fp32, (0.05, 0.31, 2.0))]
    with pytest.raises(AssertionError, match=r"1\.55x transformers' own bf16 error .*medians over prompts: 0\.3100 and "
                                             r"0\.2000.*at most 1\.5x allowed"):
        assert_logprob_error_ratio(worse, forced)
    assert assert_logprob_error_ratio(worse, forced, max_ratio=1.6) == pytest.approx(1.55, rel=1e-4)


def test_error_ratio_rule_needs_one_table_per_prompt():
    forced = _forced([[[-1.0]]], [[[0.1]]])
    with pytest.raises(ValueError, match=r"one table per prompt of forced \(1\); got 2"):
        assert_logprob_error_ratio([torch.tensor([[-1.0]])] * 2, forced)


def test_chi2_homogeneity_on_a_hand_computed_table():
    # Bins 0 (30 + 10), 1 (10 + 30) and the rare values 2..7 pooled (6 + 6), 46 values per
    # sample: expected 20, 20, 6 in each; chi-square 4 * 10^2 / 20 = 20 on 2 dof: p = exp(-10).
    a = [0] * 30 + [1] * 10 + [2, 3, 4, 5, 6, 7]
    b = [0] * 10 + [1] * 30 + [2, 2, 5, 5, 6, 6]
    p, dof = chi2_homogeneity(a, b)
    assert dof == 2
    assert p == pytest.approx(torch.exp(torch.tensor(-10.0, dtype=torch.float64)).item(), rel=1e-9)
    assert chi2_homogeneity(a, a) == (1.0, 2)
    # Rare values under 10 together join the smallest bin: 2 bins left.
    assert chi2_homogeneity(a[:41], b[:41])[1] == 1
    assert chi2_homogeneity([7] * 5, [7] * 5) == (1.0, 0)  # one bin: nothing to test
    with pytest.raises(ValueError, match="non-empty"):
        chi2_homogeneity([], a)


def _categorical(logits: torch.Tensor, n: int, gen: torch.Generator) -> list[int]:
    return torch.multinomial(torch.softmax(logits, 0), n, replacement=True, generator=gen).tolist()


def test_chi2_homogeneity_keeps_its_false_alarm_rate_and_sees_a_wrong_temperature():
    """A skewed 512-token distribution with a long tail of rare tokens (as the tiny models
    sample at temperature 0.7): over 400 pairs of samples of it, the 5% test fails about 5% of
    them; against the same logits at temperature 1 it fails nearly every pair."""
    gen = torch.Generator().manual_seed(0)
    logits = 3.0 * torch.randn(512, generator=gen)
    pairs = 400
    alarms = sum(chi2_homogeneity(_categorical(logits / 0.7, 1200, gen), _categorical(logits / 0.7, 1200, gen))[0]
                 < 0.05 for _ in range(pairs))
    assert 0.02 * pairs <= alarms <= 0.09 * pairs, alarms
    caught = sum(chi2_homogeneity(_categorical(logits / 0.7, 1200, gen), _categorical(logits, 1200, gen))[0]
                 < 1e-4 for _ in range(20))
    assert caught >= 19, caught
