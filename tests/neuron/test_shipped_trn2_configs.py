"""Every shipped trn2 config holds the settings the Neuron shell and vllm-neuron's runner need.

- the shipped configs: async scheduling on with on-device sampling (the runner refuses async
  scheduling without it); the device-test configs under ``tests/integration/trn2``: host
  sampling, synchronous; read through vLLM's own ``vllm serve --config`` parser;
- no setting is switched off with a ``false`` value, which ``vllm serve --config`` drops;
- the shell's start-up checks pass on the config's ``neuron_config``, its
  ``vision_neuron_config`` with the config's ``limit-mm-per-prompt``;
- the upstream dense recipe's ``hlo2tensorizer_options: ""`` in the dense configs only.
"""

import pathlib
import types

import pytest
import yaml

from vllm_gdn_neuron.shells.neuron.checks import UNQUANTIZED, check_sampling_config, check_vision_neuron_config
from vllm_gdn_neuron.shells.neuron.fp8 import FP8_ON_DEVICE

from .serve_config import serve_parser

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL_CONFIGS = sorted((REPO / "configs" / "trn2").glob("*.yaml"))
SHIPPED = MODEL_CONFIGS + [REPO / "configs" / "serve-trn2.yaml"]
CONFIGS = SHIPPED + sorted((REPO / "tests" / "integration" / "trn2").glob("*.yaml"))


def _settings(path):
    return yaml.safe_load(path.read_text())


def _is_moe(settings) -> bool:
    return "A3B" in settings.get("model", "")


def _serve_args(path):
    """``vllm serve MODEL --config path`` as vLLM's CLI parses it."""
    return serve_parser().parse_args(["serve", "model", "--config", str(path)])


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_async_scheduling_is_on_exactly_where_sampling_is_on_the_device(path):
    sampling = _settings(path)["additional-config"]["neuron_config"]["on_device_sampling_config"]
    assert _serve_args(path).async_scheduling is (path in SHIPPED)
    assert (sampling is not None) is (path in SHIPPED)
    if sampling is not None:
        check_sampling_config(types.SimpleNamespace(**sampling))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_no_setting_is_switched_off_with_a_false_that_vllm_serve_drops(path):
    assert [key for key, value in _settings(path).items() if value is False] == []


def test_vllm_serve_drops_a_false_in_a_config_file(tmp_path):
    """Why the configs say ``no-enable-prefix-caching: true``: the file is expanded into flags by
    the top-level parser, which does not know the ``serve`` command's ``--no-...`` flags."""
    dropped, kept = tmp_path / "false.yaml", tmp_path / "no.yaml"
    dropped.write_text("enable-prefix-caching: false\n")
    kept.write_text("no-enable-prefix-caching: true\n")
    assert _serve_args(dropped).enable_prefix_caching is None  # vLLM's default then applies
    assert _serve_args(kept).enable_prefix_caching is False


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_vision_neuron_config_comes_with_no_images_and_no_videos(path):
    settings = _settings(path)
    vision = settings["additional-config"].get("vision_neuron_config")
    limits = settings.get("limit-mm-per-prompt", {})
    assert not check_vision_neuron_config(types.SimpleNamespace(**vision) if vision else None, None,
                                          limits.get("image", 999), limits.get("video", 999))
    # FP8 on the device exactly where the checkpoint is a block-FP8 release; else unquantized weights.
    quantization = settings["additional-config"]["neuron_config"].get("quantization")
    fp8_release = settings.get("model", "").endswith("-FP8")
    assert quantization == FP8_ON_DEVICE if fp8_release else quantization in UNQUANTIZED


@pytest.mark.parametrize("path", MODEL_CONFIGS + [REPO / "configs" / "serve-trn2.yaml"], ids=lambda p: p.name)
def test_dense_configs_take_the_upstream_whole_graph_compile_and_moe_keeps_the_default(path):
    settings = _settings(path)
    neuron_config = settings["additional-config"]["neuron_config"]
    if _is_moe(settings):
        assert "hlo2tensorizer_options" not in neuron_config
    else:
        assert neuron_config["hlo2tensorizer_options"] == ""


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_vllms_config_parser_reads_the_configs_cache_and_neuron_settings(path):
    args = _serve_args(path)
    assert args.enable_prefix_caching is False and args.enable_chunked_prefill is False
    # The empty option string reaches the runner as given (not dropped as an empty value).
    want = _settings(path)["additional-config"]["neuron_config"].get("hlo2tensorizer_options")
    assert args.additional_config["neuron_config"].get("hlo2tensorizer_options") == want
