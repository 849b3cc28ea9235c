"""Every shipped per-model trn2 config through the runner's start-up.

Each config, scaled to a tiny checkpoint (``serve_config.scaled``), is read by vLLM's own
``vllm serve --config`` parser and handed to the runner stand-in (``runner.py``) with its own
``additional-config`` (the ``neuron_config`` and, where set, the ``vision_neuron_config`` that
switches ``load_model`` to the multimodal ``from_configs`` form), ``dtype``, ``max-num-seqs``,
``num-gpu-blocks-override``, async scheduling and ``limit-mm-per-prompt``, under a current engine
config built from the same arguments (the shell's start-up checks read it). The runner's
branches then run: ``__init__`` (its async-scheduling refusal included), ``load_model`` (meta
construction, ``load_weights``, ``.to``, the compile call), ``get_kv_cache_spec`` with the
platform's hybrid alignment, ``initialize_kv_cache`` (shared int8 buffers, dtype views,
``bind_kv_cache``) and the warm-up of every bucket; then one request is served. The same
configs through vLLM's engine config and the Neuron platform stand-in: ``test_front_end.py``.

``configs/serve-trn2.yaml`` is left out here: scaled, it is ``qwen3_5-27b.yaml`` but for its
block count (the same checkpoint, dtype, buckets and sampling), so its start-up would repeat
that case op for op; it is served end to end through vLLM's engine by
``test_engine_serving.py``, and read through vLLM's front end by ``test_front_end.py``.
"""

import pytest
import torch
import yaml

from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM

from . import serve_config
from .runner import serve
from .serve_config import CONFIGS, scaled, tiny_checkpoint

pytestmark = pytest.mark.vllm024  # every case runs in the vLLM 0.24 lane too (scripts/test.sh)


# The serve-trn2.yaml case would repeat the 27B config's (see above).
STARTED = [path for path in CONFIGS if path.name != "serve-trn2.yaml"]


def start(settings: dict, model_dir: str):
    """The runner's start-up of the shell under the config's settings."""
    return serve_config.start(Qwen3_5NeuronForCausalLM, settings, model_dir)


@pytest.mark.slow
@pytest.mark.parametrize("path", STARTED, ids=lambda p: p.name)
def test_the_config_starts_under_the_runner_and_serves(path, tiny_model):
    settings = scaled(yaml.safe_load(path.read_text()))
    runner = start(settings, tiny_checkpoint(settings, tiny_model))
    neuron = settings["additional-config"]["neuron_config"]
    buckets = len(neuron["num_batched_tokens_buckets"]) + len(neuron["num_seqs_buckets"])
    assert len(runner.recorder.dynamo_graphs) == buckets
    assert ("vision_neuron_config" in settings["additional-config"]) == (runner.vision_neuron_config is not None)
    prompt = list(range(3, 3 + settings["max-model-len"] // 3))
    with torch.compiler.set_stance("fail_on_recompile"):
        (ids,), _ = serve(runner, [prompt], [3], [0])
    assert len(ids) == 3 and len(runner.recorder.dynamo_graphs) == buckets


def test_async_scheduling_without_on_device_sampling_stops_the_runner_at_init(tiny_model):
    """The branch the shipped configs avoid by sampling on the device."""
    settings = scaled(yaml.safe_load(CONFIGS[0].read_text()))
    assert settings["async-scheduling"] is True
    settings["additional-config"]["neuron_config"]["on_device_sampling_config"] = None
    with pytest.raises(RuntimeError, match="On-device sampling must be enabled for async execution"):
        start(settings, tiny_checkpoint(settings, tiny_model))


def test_the_left_out_config_repeats_the_27b_case():
    """What leaving ``serve-trn2.yaml`` out of the start-up cases rests on."""
    bf16_27b = next(path for path in CONFIGS if path.name == "qwen3_5-27b.yaml")
    generic, per_model = (scaled(yaml.safe_load(path.read_text())) for path in (CONFIGS[-1], bf16_27b))
    assert CONFIGS[-1].name == "serve-trn2.yaml"
    differing = {key for key in generic.keys() | per_model.keys() if generic.get(key) != per_model.get(key)}
    assert differing == {"num-gpu-blocks-override", "gpu-memory-utilization", "served-model-name"}
