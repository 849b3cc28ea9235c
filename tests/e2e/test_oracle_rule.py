"""The greedy comparison rule of ``oracle.assert_greedy_matches`` on hand-made logits."""

import pytest
import torch

from oracle import assert_greedy_matches, bf16_ulp


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
