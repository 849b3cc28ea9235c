"""What ``python -m vllm_gdn_neuron.sizing`` prints when a configuration does not fit: the cause, no negative size."""

import re

import pytest

from vllm_gdn_neuron import sizing
from vllm_gdn_neuron.units import GiB, MiB

NEGATIVE_SIZE = re.compile(r"-\d[\d.]* (GiB|MiB|KiB)")


def _report(*argv: str, capsys) -> tuple[int, str]:
    code = sizing.main(list(argv))
    return code, capsys.readouterr().out


def test_weights_over_one_core_say_so_and_name_the_tensor_parallel_size_that_fits(capsys):
    code, out = _report("Qwen/Qwen3.5-27B", capsys=capsys)
    assert code == 1
    assert not NEGATIVE_SIZE.search(out), out
    last = out.splitlines()[-1]
    assert last.startswith("  DOES NOT FIT: the weights alone take 50.10 GiB per core at tensor-parallel-size 1, "
                           "over the memory cap of 21.60 GiB; tensor-parallel-size 4 gives "), last
    assert "none: weights + cache (upper) exceed the HBM by" in out
    four = sizing.resolve("Qwen/Qwen3.5-27B", None, {"tensor_parallel_size": 4})
    assert last.endswith(f"{four.weights_per_core / GiB:.2f} GiB of weights per core")


def test_too_small_a_block_override_names_the_override_that_holds_the_sequences(capsys):
    code, out = _report("configs/trn2/qwen3_5-27b.yaml", "--num-gpu-blocks-override", "10", capsys=capsys)
    needed = sizing.resolve("configs/trn2/qwen3_5-27b.yaml", None, {}).blocks_for_max_num_seqs
    assert code == 1
    assert out.splitlines()[-1] == (f"  DOES NOT FIT: the blocks hold 1 sequence, max-num-seqs is 4 "
                                    f"(set num-gpu-blocks-override to {needed})")


def test_too_few_blocks_without_an_override_say_what_the_cap_leaves(capsys):
    code, out = _report("Qwen/Qwen3.5-2B", "--max-num-seqs", "400", "--max-model-len", "32768", capsys=capsys)
    assert code == 1 and not NEGATIVE_SIZE.search(out), out
    assert re.search(r"DOES NOT FIT: the blocks hold \d+ sequences, max-num-seqs is 400 \(the [\d.]+ GiB the cap "
                     r"leaves after the weights holds \d+ blocks of [\d.]+ MiB; 400 sequences need \d+\)$", out)


def test_a_fitting_config_says_fits(capsys):
    code, out = _report("configs/trn2/qwen3_5-27b.yaml", capsys=capsys)
    assert code == 0 and out.splitlines()[-1] == "  fits"


@pytest.mark.parametrize(("value", "text"), [(-1.5 * GiB, "-1.50 GiB"), (-3 * MiB, "-3.00 MiB"),
                                             (-2048, "-2.0 KiB"), (0, "0.00 GiB")])
def test_sizes_take_the_unit_of_their_magnitude(value, text):
    assert sizing._gib(value) == text
