"""A ``vllm serve --config`` YAML read into what the runner stand-in and the shell's start-up checks see.

The YAML's keys are ``vllm serve`` options: :func:`engine_settings` maps the ones the runner
reads to :class:`runner.EngineSettings`; :func:`engine_config` builds the part of vLLM's
current ``VllmConfig`` the shell's checks read (``check_engine_config``,
``check_vision_neuron_config``), and :func:`start` runs the runner's start-up under it.
"""

import types

import torch

from runner import EngineSettings, NeuronRunnerStandIn

# vLLM resolves an unset --async-scheduling to on for the multiprocess executors vllm-neuron uses.
ASYNC_SCHEDULING_DEFAULT = True


class MultimodalLimits:
    """The part of vLLM's ``MultiModalConfig`` the shell reads."""

    def __init__(self, limits: dict) -> None:
        self.limits = limits

    def get_limit_per_prompt(self, modality: str) -> int:
        return int(self.limits.get(modality, 1))


def engine_config(settings: dict, dtype: torch.dtype):
    """A current-engine-config stand-in with the config's values where the shell reads them."""
    limits = settings.get("limit-mm-per-prompt")
    return types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(max_num_seqs=settings["max-num-seqs"],
                                               async_scheduling=settings.get("async-scheduling", ASYNC_SCHEDULING_DEFAULT)),
        model_config=types.SimpleNamespace(max_model_len=settings["max-model-len"], dtype=dtype,
                                           multimodal_config=None if limits is None else MultimodalLimits(limits)),
        cache_config=types.SimpleNamespace(enable_prefix_caching=settings.get("enable-prefix-caching", True),
                                           cache_dtype=settings.get("kv-cache-dtype", "auto")),
        speculative_config=(None if settings.get("speculative-config") is None
                            else types.SimpleNamespace(**settings["speculative-config"])),
        parallel_config=types.SimpleNamespace(pipeline_parallel_size=settings.get("pipeline-parallel-size", 1)),
    )


def engine_settings(settings: dict, model_dir: str) -> EngineSettings:
    """The engine arguments of a config (``model_dir`` in place of its ``model``)."""
    return EngineSettings(
        model=model_dir, dtype=settings["dtype"], max_model_len=settings["max-model-len"],
        max_num_seqs=settings["max-num-seqs"], block_size=settings.get("block-size"),
        num_gpu_blocks_override=settings["num-gpu-blocks-override"],
        async_scheduling=settings.get("async-scheduling", ASYNC_SCHEDULING_DEFAULT),
        additional_config=settings["additional-config"])


def start(model_cls, settings: dict, model_dir: str, backend=None) -> NeuronRunnerStandIn:
    """``NeuronRunnerStandIn(model_cls, <the config's settings>).start()`` under the config's engine config."""
    from vllm.config import set_current_vllm_config

    runner = NeuronRunnerStandIn(model_cls, engine_settings(settings, model_dir), backend=backend)
    with set_current_vllm_config(engine_config(settings, getattr(torch, settings["dtype"]))):
        runner.start()
    return runner
