"""Sizes and counts in a unit that fits them."""

import pytest

from vllm_gdn_neuron.units import format_bytes, format_count


@pytest.mark.parametrize(("count", "text"), [
    (0, "0 B"), (256, "256 B"), (2048, "2.0 KiB"), (29_184, "28.5 KiB"), (3.1 * 2**20, "3.1 MiB"),
    (1.37 * 2**30, "1.37 GiB"), (-1.5 * 2**30, "-1.50 GiB"), (-3 * 2**10, "-3.0 KiB"),
])
def test_bytes_take_the_largest_unit_they_reach(count, text):
    assert format_bytes(count) == text


@pytest.mark.parametrize(("count", "text"), [
    (42, "42"), (229_824, "230 k"), (737_000_000, "737 M"), (1_880_000_000, "1.88 B"), (12_345, "12.3 k"),
])
def test_counts_keep_three_significant_digits(count, text):
    assert format_count(count) == text
