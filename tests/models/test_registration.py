"""The plugin entry point: what it registers, idempotence, and the opt-out switch.

Each case runs in a fresh interpreter: vLLM's registry is process-global and vLLM
loads the entry point itself (``load_general_plugins``), exactly as in a server.
"""

import json
import os
import subprocess
import sys

import pytest

from vllm_gdn_neuron.plugin import ARCHITECTURES

_PROBE = """
import json
from vllm.plugins import load_general_plugins
from vllm import ModelRegistry
from vllm.model_executor.models.config import MODELS_CONFIG_MAP
load_general_plugins()
import vllm_gdn_neuron
vllm_gdn_neuron.register()   # a second call (vLLM may load plugins more than once)
report = {}
for arch in %r:
    hook = MODELS_CONFIG_MAP.get(arch)
    report[arch] = {
        "module": ModelRegistry.models[arch].module_name,
        "hook_is_ours": bool(getattr(hook, "is_vllm_gdn_neuron_hook", False)),
        "hook_qualname": getattr(hook, "__qualname__", None),
    }
print("REPORT" + json.dumps(report))
"""


def _probe(**env) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE % (ARCHITECTURES,)],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(l for l in result.stdout.splitlines() if l.startswith("REPORT"))
    return json.loads(line[len("REPORT"):])


@pytest.mark.slow
def test_entry_point_registers_every_architecture_once():
    report = _probe()
    assert set(report) == set(ARCHITECTURES)
    for arch, entry in report.items():
        assert entry["module"] == "vllm_gdn_neuron.models.qwen3_5", arch
        assert entry["hook_is_ours"], arch


def test_the_hook_wraps_vllms_own_hook_once():
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from vllm_gdn_neuron.plugin import _config_hook, register

    register()
    register()
    hook = MODELS_CONFIG_MAP["Qwen3_5ForCausalLM"]
    assert hook.is_vllm_gdn_neuron_hook
    assert _config_hook(hook) is not hook  # a fresh wrapper is only made for a foreign hook
    # vLLM's own Qwen3.5 hook (mamba_ssm_dtype from the checkpoint) still runs first:
    base = hook.verify_and_update_config.__closure__
    assert any(getattr(cell.cell_contents, "__name__", "") == "Qwen3_5ForCausalLMConfig" for cell in base)


@pytest.mark.slow
def test_disable_switch_leaves_vllms_builtins_alone():
    report = _probe(VLLM_GDN_NEURON_DISABLE="1")
    assert report["Qwen3_5ForCausalLM"]["module"] == "vllm.model_executor.models.qwen3_5"
    assert report["Qwen3NextForCausalLM"]["module"] == "vllm.model_executor.models.qwen3_next"
    assert not any(entry["hook_is_ours"] for entry in report.values())


def _fresh_registration(monkeypatch, on_neuron: bool):
    from vllm_gdn_neuron import plugin

    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin, "on_neuron_platform", lambda: on_neuron)
    plugin.register()
    return plugin


def test_on_neuron_only_the_neuron_shell_is_registered_under_its_own_names(monkeypatch):
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    before = {arch: ModelRegistry.models[arch].module_name for arch in ARCHITECTURES}
    plugin = _fresh_registration(monkeypatch, on_neuron=True)
    for name, checkpoint_arch in plugin.NEURON_ARCHITECTURES.items():
        assert name.startswith("VllmGdnNeuron") and name.endswith(checkpoint_arch)
        assert ModelRegistry.models[name].module_name == "vllm_gdn_neuron.neuron.model"
        assert ModelRegistry.models[name].class_name == "Qwen3_5NeuronForCausalLM"
        assert MODELS_CONFIG_MAP[name].is_vllm_gdn_neuron_hook
    # the checkpoints' own names are left to whoever else registers them (vllm-neuron)
    assert {arch: ModelRegistry.models[arch].module_name for arch in ARCHITECTURES} == before


def test_which_class_serves_does_not_depend_on_load_order(monkeypatch):
    from vllm import ModelRegistry

    plugin = _fresh_registration(monkeypatch, on_neuron=True)
    # vllm-neuron's worker registers its own list after the general plugins ran:
    for arch in ARCHITECTURES:
        ModelRegistry.register_model(arch, "vllm_gdn_neuron.models.qwen3_5:Qwen3_5ForCausalLM")
    for name in plugin.NEURON_ARCHITECTURES:
        assert ModelRegistry.models[name].module_name == "vllm_gdn_neuron.neuron.model"
    assert not set(plugin.NEURON_ARCHITECTURES) & set(ARCHITECTURES)


def test_the_cpu_platform_is_not_neuron():
    from vllm_gdn_neuron.plugin import on_neuron_platform

    assert not on_neuron_platform()


def test_disable_switch_registers_nothing_on_neuron_either(monkeypatch):
    from vllm import ModelRegistry
    from vllm_gdn_neuron import plugin

    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin, "on_neuron_platform", lambda: True)
    names = set(ModelRegistry.models)
    plugin.register()
    assert set(ModelRegistry.models) == names and not plugin._registered
