"""Every shipped trn2 config through vLLM's own front end to the Neuron shell, under the Neuron platform stand-in.

One fresh process (``front_end.py``: vLLM picks its platform once per process) runs, for each
shipped config scaled to a tiny checkpoint (``serve_config.scaled``), vLLM's CLI as ``vllm serve
MODEL --config FILE`` with the stand-in platform (``vllm_neuron/``) activated: argument parsing,
``create_engine_config`` (the model config's registry inspection, which refused the Neuron
names before they had a registry entry vLLM recognises as a text-generation model), the
platform's hooks (worker and scheduler classes, executor, structured-outputs switch), the
model's config hooks, then what a Neuron worker does: the registry's class, ``from_configs`` on
the meta device, and the platform's hybrid block-size alignment after the model is built.

Held, per config: the front end resolves the registry entry (multimodal for the
vision-language names), the worker builds the Neuron shell itself, vLLM's hybrid alignment
gives the block size and padded state page that the runner stand-in's cache plan derives
(``runner_cache.align_hybrid_pages``), prefix caching and chunked prefill are off, and the
Neuron scheduler and worker are chosen. The same file runs on vLLM 0.24 (the lane's venv) and
0.32.
"""

import json

import pytest
import yaml

from . import front_end
from .serve_config import CONFIGS, scaled, tiny_checkpoint, write

ENTRY = "vllm_gdn_neuron.shells.neuron.registry_entry.Qwen3_5NeuronRegistryEntry"
MULTIMODAL_ENTRY = "vllm_gdn_neuron.shells.neuron.multimodal_entry.Qwen3_5NeuronMultiModal"
SHELL = "vllm_gdn_neuron.shells.neuron.model.Qwen3_5NeuronForCausalLM"
VISION_SHELL = "vllm_gdn_neuron.shells.neuron.model.Qwen3_5NeuronForConditionalGeneration"
# The tiny vision-language checkpoint's tower takes these buckets (tests/neuron/test_shell_vision.py).
TINY_VISION = {"num_vision_tokens_buckets": [32, 64], "vision_attention_block_size": 32}


def _invocation(settings: dict, model_dir: str, folder) -> list[str]:
    folder.mkdir()
    return [model_dir, "--config", str(write(settings, folder))]


def _with_images(settings: dict) -> dict:
    out = json.loads(json.dumps(settings))
    out["limit-mm-per-prompt"] = {"image": 1, "video": 0}
    out["additional-config"]["vision_neuron_config"] = dict(TINY_VISION)
    return out


def _old_spelling(settings: dict) -> dict:
    """The config as it was shipped before: flags switched off with ``false`` (which ``vllm serve`` drops)."""
    out = {key: value for key, value in settings.items() if not key.startswith("no-enable-")}
    out.update({"enable-prefix-caching": False, "enable-chunked-prefill": False})
    return out


@pytest.fixture(scope="module")
def reports(tiny_model, tmp_path_factory):
    """``{case: report}`` of one front-end process over every case."""
    folder = tmp_path_factory.mktemp("front-end")
    cases = {}
    for path in CONFIGS:
        settings = scaled(yaml.safe_load(path.read_text()))
        cases[path.name] = _invocation(settings, tiny_checkpoint(settings, tiny_model), folder / path.name)
    serve = scaled(yaml.safe_load(CONFIGS[-1].read_text()))
    model_dir = tiny_checkpoint(serve, tiny_model)
    cases["images"] = _invocation(_with_images(serve), model_dir, folder / "images")
    cases["old spelling"] = _invocation(_old_spelling(serve), model_dir, folder / "old")
    found, done = front_end.run(list(cases.values()))
    assert len(found) == len(cases), done.stderr[-3000:]
    return dict(zip(cases, found))


@pytest.mark.slow
@pytest.mark.vllm024
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_config_reaches_the_neuron_shell_through_vllms_front_end(reports, path):
    report = reports[path.name]
    assert "error" not in report, report.get("error")
    assert report["platform"] == "vllm_neuron.vllm.platform.NeuronPlatform" and report["platform_kind"] == "neuron"
    multimodal = report["architecture"].endswith("ForConditionalGeneration")
    assert report["front_end_class"] == (MULTIMODAL_ENTRY if multimodal else ENTRY)
    assert report["runner_type"] == "generate" and report["is_hybrid"]
    assert report["worker_model_class"] == SHELL  # limit-mm-per-prompt 0: the text decoder
    assert report["worker_cls"] == "vllm_neuron.vllm.worker.neuron_worker.NeuronWorker"
    assert report["scheduler_cls"] == "vllm_neuron.vllm.core.scheduler.NeuronAsyncScheduler"
    assert report["async_scheduling"] and report["executor"] in ("uni", "mp")
    assert not report["enable_prefix_caching"] and not report["enable_chunked_prefill"]
    assert [report["block_size"], report["mamba_page_size_padded"]] == report["runner_cache_alignment"]
    assert report["block_size"] % 32 == 0


@pytest.mark.slow
@pytest.mark.vllm024
def test_with_images_enabled_the_worker_builds_the_shell_with_its_tower(reports):
    report = reports["images"]
    assert "error" not in report, report.get("error")
    assert report["front_end_class"] == MULTIMODAL_ENTRY
    assert report["worker_model_class"] == VISION_SHELL
    assert report["additional_config"]["vision_neuron_config"]["num_vision_tokens_buckets"] == [32, 64]


@pytest.mark.slow
@pytest.mark.vllm024
def test_a_flag_switched_off_with_false_is_dropped_and_vllms_default_decides(reports):
    """``enable-prefix-caching: false`` in the file is lost on both lines; what follows is vLLM's
    default: off for hybrid models on 0.24, on (and refused by the shell) on 0.32."""
    import vllm

    report = reports["old spelling"]
    assert report.get("enable_chunked_prefill", True)  # dropped as well: vLLM's default, on
    if vllm.__version__.startswith("0.24."):
        assert "error" not in report and not report["enable_prefix_caching"]
    else:
        assert report["error"].startswith("ValueError: enable-prefix-caching is true")
        assert "no-enable-prefix-caching: true" in report["error"]
