"""``vllm serve`` up to the engine config, in this process, under the Neuron platform stand-in.

    VLLM_NEURON_STANDIN=1 PYTHONPATH=tests/neuron python -m tests.neuron.front_end '[["MODEL", "--config", "FILE"], ...]'

runs vLLM's own CLI (``vllm.entrypoints.cli.main``: its argument parser, ``--config`` YAML
reading and argument validation) with the ``serve`` command's action replaced by what the API
server does before it starts the engine: ``AsyncEngineArgs.from_cli_args`` and
``create_engine_config`` (model config validation with its registry inspection, the platform's
hooks, the model's config hooks). Then, as a Neuron worker would, it resolves the
architecture through vLLM's registry and builds the model with ``from_configs`` on the meta
device (the multimodal form where ``additional_config`` has a ``vision_neuron_config``, as
the runner does), and lets the platform align the block size as vLLM's executors do after
``load_model``. It prints one JSON line (prefixed ``FRONT_END ``) of what it saw per
invocation, or of the error that stopped it.

vLLM chooses its platform once per process: the tests run this module in a fresh process
(:func:`run`), with ``tests/neuron`` on ``PYTHONPATH`` so that vLLM finds the stand-in
platform plugin, and the repository root so that the stand-in finds the runner harness. Works on vLLM 0.24 and 0.32.
"""

import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
PREFIX = "FRONT_END "


def worker_model(vllm_config):
    """The model a Neuron worker builds: the registry's class for the architecture, the runner's meta construction."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.registry import ModelRegistry

    from .runner import NeuronConfigStandIn, meta_model
    from .runner_vision import VisionNeuronConfigStandIn

    model_config = vllm_config.model_config
    cls, _ = ModelRegistry.resolve_model_cls(model_config.architectures, model_config=model_config)
    additional = vllm_config.additional_config
    neuron_config = NeuronConfigStandIn(dict(additional.get("neuron_config", {})))
    vision = additional.get("vision_neuron_config")
    vision_config = None if vision is None else VisionNeuronConfigStandIn.from_dict(dict(vision))
    with set_current_vllm_config(vllm_config):
        return meta_model(cls, model_config.hf_config, neuron_config, vision_config)


def engine_config_report(args) -> dict:
    from vllm import AsyncEngineArgs
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext

    from vllm_gdn_neuron import plugin

    from . import runner_cache

    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    model_config = vllm_config.model_config
    front_end_cls, architecture = ModelRegistry.resolve_model_cls(model_config.architectures, model_config=model_config)
    model = worker_model(vllm_config)
    current_platform.update_block_size_for_backend(vllm_config)  # as vLLM's executors do after load_model
    cache = vllm_config.cache_config
    runner_alignment = runner_cache.align_hybrid_pages(model.get_kv_spec(), None, model_config.dtype)
    return {
        "platform": f"{type(current_platform).__module__}.{type(current_platform).__name__}",
        "platform_kind": plugin.platform_kind(),
        "architecture": architecture,
        "front_end_class": f"{front_end_cls.__module__}.{front_end_cls.__qualname__}",
        "runner_type": model_config.runner_type,
        "is_hybrid": bool(model_config.is_hybrid),
        "block_size": cache.block_size,
        "mamba_page_size_padded": cache.mamba_page_size_padded,
        "runner_cache_alignment": list(runner_alignment),
        "enable_prefix_caching": bool(cache.enable_prefix_caching),
        "enable_chunked_prefill": bool(vllm_config.scheduler_config.enable_chunked_prefill),
        "worker_cls": vllm_config.parallel_config.worker_cls,
        "executor": vllm_config.parallel_config.distributed_executor_backend,
        "scheduler_cls": vllm_config.scheduler_config.scheduler_cls,
        "async_scheduling": bool(vllm_config.scheduler_config.async_scheduling),
        "max_model_len": model_config.max_model_len,
        "dtype": str(model_config.dtype),
        "worker_model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "additional_config": vllm_config.additional_config,
    }


def main(invocations: list[list[str]]) -> None:
    """Each invocation's ``vllm serve`` arguments through vLLM's CLI; one ``FRONT_END`` line each."""
    import vllm.entrypoints.cli.serve as serve

    from vllm_gdn_neuron import cli

    cli.patch_vllm_version_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    for argv in invocations:
        def report(args):
            print(PREFIX + json.dumps({"argv": argv, **engine_config_report(args)}), flush=True)

        serve.ServeSubcommand.cmd = staticmethod(report)
        sys.argv = ["vllm", "serve", *argv]
        try:
            vllm_main()
        except Exception as error:  # reported, then the next invocation
            print(PREFIX + json.dumps({"argv": argv, "error": f"{type(error).__name__}: {error}"}), flush=True)


def run(invocations: list[list[str]], **env) -> tuple[list[dict], subprocess.CompletedProcess]:
    """The invocations in one fresh process under the stand-in platform: ``(one report each, the process)``."""
    environ = {**os.environ, "VLLM_NEURON_STANDIN": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), str(REPO), os.environ.get("PYTHONPATH")])), **env}
    done = subprocess.run([sys.executable, "-m", "tests.neuron.front_end", json.dumps(invocations)], env=environ,
                          capture_output=True, text=True, timeout=600)
    reports = [json.loads(line[len(PREFIX):]) for line in done.stdout.splitlines() if line.startswith(PREFIX)]
    return reports, done


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
