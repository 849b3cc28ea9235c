"""The shipped trn2 ``vllm serve --config`` files, scaled to a tiny checkpoint and read by vLLM's own parser.

- :func:`scaled`, :func:`tiny_checkpoint`: a shipped config's settings with every token count
  divided by one power of two (largest :data:`LARGEST_TOKENS`) at tensor-parallel size 1, and the
  tiny checkpoint of its kind (the ``ConditionalGeneration`` layout its ``hf-overrides``
  names). The bucket structure is the config's, the sizes are not; whether the config's
  tensor-parallel size divides the published checkpoint's heads is the sizing tool's test
  (``tests/test_sizing.py``).
- :func:`serve_args`: the settings written to a YAML file and parsed as ``vllm serve MODEL
  --config FILE`` parses them (vLLM's ``serve`` subcommand parser under its top-level CLI
  parser, so a flag the file gets wrong is lost here as it is in ``vllm serve``).
- :func:`engine_settings`, :func:`engine_config`: from those arguments, what the runner
  stand-in (``runner.py``) reads and the part of vLLM's current ``VllmConfig`` the shell's
  start-up checks read (``check_engine_config``, ``check_vision_neuron_config``);
  :func:`start` runs the runner's start-up under them.

The whole route through vLLM's engine config, with the Neuron platform stand-in, is
``front_end.py``'s.
"""

import argparse
import pathlib
import tempfile
import types

import torch
import yaml

from vllm_gdn_neuron import plugin
from vllm_gdn_neuron.shells.neuron.fp8 import FP8_ON_DEVICE

from .runner import EngineSettings, NeuronRunnerStandIn

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs" / "trn2").glob("*.yaml")) + [REPO / "configs" / "serve-trn2.yaml"]
LARGEST_TOKENS = 256
# The README's trn2 route for a checkpoint of one's own: serve-trn2.yaml plus this override.
README_OVERRIDE = {"architectures": ["VllmGdnNeuronQwen3_5ForConditionalGeneration"]}


def scaled(settings: dict) -> dict:
    """The config at tensor-parallel size 1, its token counts divided by one power of two (largest: LARGEST_TOKENS)."""
    out = yaml.safe_load(yaml.safe_dump(settings))
    factor = 1
    while settings["max-model-len"] // factor > LARGEST_TOKENS:
        factor *= 2
    out["max-model-len"] = settings["max-model-len"] // factor
    out["max-num-batched-tokens"] = settings["max-num-batched-tokens"] // factor
    out["tensor-parallel-size"] = 1
    out.setdefault("hf-overrides", README_OVERRIDE)
    out.pop("model", None)  # the tiny checkpoint, given on the command line, stands in
    neuron = out["additional-config"]["neuron_config"]
    neuron["num_batched_tokens_buckets"] = [b // factor for b in neuron["num_batched_tokens_buckets"]]
    return out


def tiny_checkpoint(settings: dict, tiny_model) -> str:
    """The tiny vision-language checkpoint of the config's architecture (its block-FP8 twin where the
    config keeps FP8 weights on the device)."""
    (name,) = settings["hf-overrides"]["architectures"]
    assert name in plugin.NEURON_ARCHITECTURES, f"{name} is not a Neuron architecture this plugin registers"
    fp8 = settings["additional-config"]["neuron_config"].get("quantization") == FP8_ON_DEVICE
    return tiny_model(("qwen3_5-moe-vl" if "Moe" in name else "qwen3_5-vl") + ("-fp8" if fp8 else ""))


def write(settings: dict, folder) -> pathlib.Path:
    """``settings`` as a ``--config`` YAML file in ``folder``."""
    path = pathlib.Path(folder) / "serve.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def serve_parser():
    """vLLM's ``vllm serve`` parser, as its CLI builds it: the ``serve`` subcommand under the top-level parser."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    return parser


def serve_args(settings: dict, model_dir: str) -> argparse.Namespace:
    """``vllm serve MODEL_DIR --config <settings as YAML>``, parsed by vLLM."""
    with tempfile.TemporaryDirectory() as folder:
        args = serve_parser().parse_args(["serve", model_dir, "--config", str(write(settings, folder))])
    args.model = args.model_tag
    return args


def engine_settings(args: argparse.Namespace) -> EngineSettings:
    """The engine arguments the runner reads."""
    return EngineSettings(
        model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        block_size=args.block_size, num_gpu_blocks_override=args.num_gpu_blocks_override,
        async_scheduling=bool(args.async_scheduling), additional_config=args.additional_config,
        architectures=(args.hf_overrides or {}).get("architectures"))


class MultimodalLimits:
    """The part of vLLM's ``MultiModalConfig`` the shell reads."""

    def __init__(self, limits: dict) -> None:
        self.limits = limits

    def get_limit_per_prompt(self, modality: str) -> int:
        return int(self.limits.get(modality, 1))


def engine_config(args: argparse.Namespace):
    """A current-engine-config stand-in with the arguments' values where the shell reads them."""
    limits = args.limit_mm_per_prompt
    return types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(max_num_seqs=args.max_num_seqs,
                                               async_scheduling=bool(args.async_scheduling)),
        model_config=types.SimpleNamespace(max_model_len=args.max_model_len, dtype=getattr(torch, args.dtype),
                                           multimodal_config=None if not limits else MultimodalLimits(limits)),
        cache_config=types.SimpleNamespace(enable_prefix_caching=args.enable_prefix_caching,
                                           cache_dtype=args.kv_cache_dtype),
        speculative_config=(None if args.speculative_config is None
                            else types.SimpleNamespace(**args.speculative_config)),
        parallel_config=types.SimpleNamespace(pipeline_parallel_size=args.pipeline_parallel_size),
    )


def start(model_cls, settings: dict, model_dir: str, backend=None) -> NeuronRunnerStandIn:
    """The runner's start-up (``NeuronRunnerStandIn.start()``) under the config as ``vllm serve`` reads it."""
    from vllm.config import set_current_vllm_config

    args = serve_args(settings, model_dir)
    runner = NeuronRunnerStandIn(model_cls, engine_settings(args), backend=backend)
    with set_current_vllm_config(engine_config(args)):
        runner.start()
    return runner
