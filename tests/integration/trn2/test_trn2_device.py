"""End to end on a trn2 machine: the SDK, the plugin's Neuron registration, every GDN op on the
device against the float64 references, and models served through the OpenAI API with greedy
ids equal to the CPU oracle's. Skipped, with the reason, where /dev/neuron0 does not exist."""

import pathlib

import pytest
import torch
from . import trn2_checks

pytestmark = [
    pytest.mark.neuron,
    pytest.mark.skipif(not trn2_checks.neuron_devices(), reason=trn2_checks.NO_DEVICE),
]

HERE = pathlib.Path(__file__).resolve().parent
OP_CASES = list(trn2_checks.op_cases(torch.device("cpu"), "nki"))


def _assert_passed(checks):
    failed = [check.line() for check in checks if check.status != "PASS"]
    assert not failed, "\n".join(failed)


def test_driver_and_device():
    _assert_passed(trn2_checks.check_device())


def test_sdk_packages_import():
    _assert_passed(trn2_checks.check_packages())


def test_plugin_registers_its_neuron_architectures():
    _assert_passed(trn2_checks.check_plugin())


@pytest.mark.parametrize("name", OP_CASES)
def test_op_through_nki_on_device_matches_float64_reference(name):
    device = trn2_checks.neuron_torch_device()
    assert device is not None, "torch sees no Neuron device (neither 'neuron' nor 'xla')"
    failed = trn2_checks.failures(trn2_checks.op_cases(device, "nki")[name]())
    assert not failed, "\n".join(failed)


# The tiny models on one core, and a small real-dims one (Qwen3.5-2B dimensions, 4 layers,
# built locally: no download) on two.
SERVED = [("qwen3_5-dense", "tiny-trn2.yaml"), ("qwen3_5-moe", "tiny-trn2.yaml"),
          ("qwen3_5-2b-real", "small-real-trn2.yaml")]


@pytest.mark.slow
@pytest.mark.parametrize("model_name, config", SERVED)
def test_served_greedy_ids_equal_the_cpu_oracle(tmp_path, model_name, config):
    if model_name not in trn2_checks.builder_models():
        pytest.skip(f"scripts/build_tiny_models.py builds no {model_name!r} in this checkout")
    model = trn2_checks.build_model(model_name, tmp_path)
    prompts = [trn2_checks.TINY_PROMPT, [5, 6, 7], list(range(3, 200, 3))]
    with trn2_checks.served(model, HERE / config) as url:
        got = [trn2_checks.greedy_ids(url, prompt, 16) for prompt in prompts]
    for prompt, ids in zip(prompts, got):
        want, logits = trn2_checks.cpu_greedy_ids(model, prompt, 16)
        trn2_checks.assert_greedy_matches(ids, want, logits)
