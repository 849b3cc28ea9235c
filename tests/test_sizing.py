"""The sizing arithmetic against independent oracles.

- weights: transformers' own models (parameters counted on the meta device) for the real
  dimensions, and the bytes of the tiny checkpoints' safetensors for the tiny ones;
- published measurements on trn2 (HBM used per core after weight load);
- the per-slot state shapes of ``model/gdn_cache.py`` and figures worked out by hand.
"""

import dataclasses
import json
import math
import pathlib

import pytest
import torch
import yaml
from safetensors import safe_open

from scripts import build_tiny_models as builder
from vllm_gdn_neuron import plugin, sizing
from vllm_gdn_neuron.model import dims as model_dims
from vllm_gdn_neuron.model.gdn_cache import gdn_state_shapes
from vllm_gdn_neuron.units import GiB, MiB

REPO = pathlib.Path(__file__).resolve().parents[1]
TRN2_CONFIGS = sorted((REPO / "configs" / "trn2").glob("*.yaml"))
# The published block-FP8 checkpoints' quantization_config.
FP8_RELEASE_QUANTIZATION = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]}


def _served_checkpoint_bytes(folder: pathlib.Path) -> int:
    """Bytes of the text decoder's tensors (no vision tower, no MTP head) as stored."""
    total = 0
    for shard in folder.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as handle:
            for key in handle.keys():
                if key.startswith("mtp.") or ".visual." in key or key.startswith("visual."):
                    continue
                tensor = handle.get_slice(key)
                total += math.prod(tensor.get_shape()) * 2  # bf16 checkpoints
    return total


@pytest.mark.parametrize("name", ["qwen3_5-dense", "qwen3_5-moe", "qwen3-next", "qwen3_5-vl", "qwen3_5-moe-vl"])
def test_tiny_weights_equal_the_checkpoint_bytes(tiny_model, name):
    folder = pathlib.Path(tiny_model(name))
    result = sizing.size(sizing.checkpoint_dims(folder), sizing.ServingConfig(max_model_len=256, max_num_seqs=2))
    assert result.weights_total == _served_checkpoint_bytes(folder)


def _meta_parameter_count(class_name: str, overrides: dict) -> int:
    import transformers

    config = getattr(transformers, class_name)(**overrides)
    model_class = transformers.Qwen3_5MoeForCausalLM if "Moe" in class_name else transformers.Qwen3_5ForCausalLM
    with torch.device("meta"):
        model = model_class(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(sizing.PUBLISHED))
def test_real_weights_equal_transformers_parameter_count(name):
    class_name, overrides, _ = sizing.PUBLISHED[name]
    counted = model_dims.count_weights(sizing.published_dims(name)).total
    assert counted == _meta_parameter_count(class_name, overrides)


_SMALL = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=32)


@pytest.mark.parametrize("class_name, extra", [
    ("Qwen3_5TextConfig", dict(intermediate_size=96)),
    ("Qwen3_5MoeTextConfig", dict(num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=64)),
    ("Qwen3_5MoeTextConfig", dict(num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=0)),
])
@pytest.mark.parametrize("attention_bias", [False, True])
def test_weights_of_small_configs_equal_transformers_parameter_count(class_name, extra, attention_bias):
    """Settings no published checkpoint uses: attention biases, a MoE without a shared expert."""
    import transformers

    overrides = dict(_SMALL, **extra, attention_bias=attention_bias)
    dims = model_dims.ModelDims.from_hf(getattr(transformers, class_name)(**overrides), "small", "test")
    assert model_dims.count_weights(dims).total == _meta_parameter_count(class_name, overrides)


# HBM used per core after loading weights, measured on trn2.3xlarge (TP 4, bf16, LNC=2):
# 35B-A3B 16.19 GiB (vllm-neuron's Qwen3.5 example README), 9B 4.24 GiB and 27B 12.72 GiB
# (aws-samples' Qwen3.5 dense Trainium sample). The measurements include runtime buffers,
# so the weights alone may be a little lower, never higher.
@pytest.mark.parametrize(
    "name, measured_gib, tolerance",
    [("Qwen/Qwen3.5-35B-A3B", 16.19, 0.005), ("Qwen/Qwen3.5-9B", 4.24, 0.03), ("Qwen/Qwen3.5-27B", 12.72, 0.03)],
)
def test_weights_per_core_match_trn2_measurements(name, measured_gib, tolerance):
    result = sizing.size(sizing.published_dims(name), sizing.ServingConfig(tensor_parallel_size=4))
    per_core_gib = result.weights_per_core / GiB
    assert per_core_gib <= measured_gib * (1 + 0.001)
    assert per_core_gib == pytest.approx(measured_gib, rel=tolerance)


@pytest.mark.parametrize("name", sorted(sizing.PUBLISHED))
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_state_pages_match_the_layer_cache_shapes(name, tp):
    dims = sizing.published_dims(name)
    result = sizing.size(dims, sizing.ServingConfig(tensor_parallel_size=tp, max_model_len=2048))
    import transformers

    class_name, overrides, _ = sizing.PUBLISHED[name]
    config = getattr(transformers, class_name)(**overrides)
    (width, channels), (heads, dk, dv) = gdn_state_shapes(config, tp)
    assert result.conv_state == channels * width * 4        # float32 pages
    assert result.recurrent_state == heads * dk * dv * 4
    kv_heads = max(1, config.num_key_value_heads // tp)
    assert result.kv_per_token == 2 * kv_heads * config.head_dim * 2
    # The attention block is the smallest multiple of 32 tokens whose KV page holds a state page.
    block = result.attention_block_size
    assert block % 32 == 0
    assert block * result.kv_per_token >= result.state_page > (block - 32) * result.kv_per_token


@pytest.mark.parametrize("name", sorted(sizing.PUBLISHED))
def test_page_geometry_equals_the_neuron_shells(name):
    """The shell's own page layout (shells/neuron/cache.py): sizing's state page and KV bytes per token agree with it."""
    import transformers

    from vllm_gdn_neuron.shells.neuron.cache import GDNPageLayout, attention_bytes_per_token, hybrid_block_size

    class_name, overrides, _ = sizing.PUBLISHED[name]
    config = getattr(transformers, class_name)(**overrides)
    result = sizing.size(sizing.published_dims(name), sizing.ServingConfig(tensor_parallel_size=4))
    layout = GDNPageLayout.from_config(config, 4)
    token_bytes = attention_bytes_per_token(max(1, config.num_key_value_heads // 4), config.head_dim, torch.bfloat16)
    assert result.state_page == layout.state_bytes
    assert result.kv_per_token == token_bytes
    assert result.attention_block_size == hybrid_block_size(token_bytes, layout.state_bytes, 32)


def test_35b_a3b_page_geometry_is_the_measured_one():
    """vllm-neuron measured 35B-A3B at TP 4 as "page geometry resolved to block_size 32 -> 544"."""
    result = sizing.size(sizing.published_dims("Qwen/Qwen3.5-35B-A3B"), sizing.ServingConfig(tensor_parallel_size=4))
    assert result.attention_block_size == 544


def test_27b_config_worked_by_hand():
    """configs/trn2/qwen3_5-27b.yaml: TP 4, 4096 tokens, 4 sequences."""
    result = sizing.resolve(str(REPO / "configs" / "trn2" / "qwen3_5-27b.yaml"), None, {})
    assert result.kv_per_token == 2 * 1 * 256 * 2                       # 4 KV heads over 4 cores, bf16
    assert result.conv_state == (2 * 16 * 128 + 48 * 128) // 4 * 4 * 4  # 2560 channels x K=4, fp32
    assert result.recurrent_state == 12 * 128 * 128 * 4                  # 48 V heads / 4, fp32
    state_page = 2560 * 4 * 4 + 12 * 128 * 128 * 4                       # 827,392 B
    assert result.attention_block_size == 32 * math.ceil(state_page / (32 * 1024)) == 832
    assert result.page == 832 * 1024
    assert (result.group_size, result.attention_groups, result.state_groups) == (16, 1, 3)
    assert result.block == 16 * 832 * 1024
    assert result.blocks_per_sequence == math.ceil(4096 / 832) + 3 == 8
    assert result.blocks == 4 * 8 + 1 and result.sequences == 4
    assert result.cache == (33 + 2) * 16 * 832 * 1024                   # + the zero page and the sink
    assert result.cache_upper == 4 * result.cache
    assert result.cap == pytest.approx(0.65 * 24 * GiB)
    assert result.headroom == pytest.approx(24 * GiB - result.weights_per_core - 4 * 35 * 16 * 832 * 1024)
    assert result.fits


def test_planner_fills_the_cap_without_an_override():
    dims = sizing.published_dims("Qwen/Qwen3.5-9B")
    result = sizing.size(dims, sizing.ServingConfig(tensor_parallel_size=4, max_model_len=8192, gpu_memory_utilization=0.9))
    budget = 0.9 * 24 * GiB - result.weights_per_core
    assert result.block == 8 * result.attention_block_size * 1024
    assert result.blocks == int(budget // result.block)
    assert result.blocks * result.block <= budget < (result.blocks + 1) * result.block
    assert result.sequences > result.serving.max_num_seqs  # blocks no sequence reaches


@pytest.mark.parametrize("path", TRN2_CONFIGS, ids=lambda p: p.name)
def test_every_trn2_config_fits_one_chip(path):
    settings = yaml.safe_load(path.read_text())
    result = sizing.resolve(str(path), None, {})
    assert result.fits, sizing.report(result)
    assert settings["num-gpu-blocks-override"] == result.blocks_for_max_num_seqs
    assert result.sequences == settings["max-num-seqs"]
    buckets = settings["additional-config"]["neuron_config"]["num_batched_tokens_buckets"]
    assert buckets[-1] == settings["max-model-len"] == settings["max-num-batched-tokens"]
    assert settings["additional-config"]["neuron_config"]["num_seqs_buckets"] == [settings["max-num-seqs"]]
    assert settings["no-enable-prefix-caching"] is True  # `enable-prefix-caching: false` is dropped by vllm serve
    # The plugin's Neuron shell, for the published checkpoint's (vision-language) architecture.
    checkpoint_arch = "Qwen3_5MoeForConditionalGeneration" if "A3B" in settings["model"] else "Qwen3_5ForConditionalGeneration"
    assert plugin.NEURON_ARCHITECTURES[settings["hf-overrides"]["architectures"][0]] == checkpoint_arch
    assert settings["additional-config"]["neuron_config"]["on_device_sampling_config"] == {"max_top_k": 256}
    # One trn2 chip shows 4 NeuronCores at LNC=2.
    assert 4 % settings["tensor-parallel-size"] == 0


def test_cli_prints_each_figure(capsys):
    assert sizing.main([str(REPO / "configs" / "trn2" / "qwen3_5-9b.yaml")]) == 0
    out = capsys.readouterr().out
    for label in ("weights per core", "KV per token", "GDN conv state", "GDN recurrent", "attention block", "blocks",
                  "headroom per core"):
        assert label in out
    assert "4.17 GiB" in out and out.rstrip().endswith("fits")


def test_cli_reports_a_config_that_does_not_fit(capsys):
    code = sizing.main(["Qwen/Qwen3.5-27B", "--tensor-parallel-size", "1", "--max-model-len", "4096"])
    assert code == 1
    assert "DOES NOT FIT" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["Qwen/Qwen3.5-27B", "--tensor-parallel-size", "3"], "tensor-parallel-size must divide num_attention_heads=24"),
        (["Qwen/Qwen3.5-9B", "--max-num-seqs", "0"], "max-num-seqs must be >= 1; got 0"),
        (["Qwen/Qwen3.5-9B", "--gpu-memory-utilization", "1.5"], "gpu-memory-utilization must be in (0, 1]; got 1.5"),
        (["Qwen/Qwen9"], "model must be a checkpoint folder or one of"),
        (["missing.yaml"], "config must be an existing YAML file; got 'missing.yaml'"),
    ],
)
def test_cli_refuses_bad_input_naming_it(capsys, argv, message):
    assert sizing.main(argv) == 2
    assert message in capsys.readouterr().err


def test_yaml_without_model_names_the_fix(tmp_path, capsys):
    config = tmp_path / "serve.yaml"
    config.write_text("tensor-parallel-size: 2\n")
    assert sizing.main([str(config)]) == 2
    assert f"sizing CHECKPOINT --config {config}" in capsys.readouterr().err


def test_checkpoint_with_generic_config(tiny_model):
    result = sizing.resolve(str(tiny_model("qwen3_5-dense")), REPO / "configs" / "serve-trn2.yaml", {"tensor_parallel_size": 2})
    settings = yaml.safe_load((REPO / "configs" / "serve-trn2.yaml").read_text())
    assert result.serving.tensor_parallel_size == 2
    assert result.serving.max_model_len == settings["max-model-len"]
    config = json.loads((pathlib.Path(tiny_model("qwen3_5-dense")) / "config.json").read_text())
    assert result.dims.hidden_size == config["hidden_size"]


@pytest.mark.parametrize("name", ["qwen3_5-dense", "qwen3_5-moe"])
def test_tiny_device_config_holds_its_sequences(tiny_model, name):
    config = REPO / "tests" / "integration" / "trn2" / "tiny-trn2.yaml"
    result = sizing.resolve(str(tiny_model(name)), config, {})
    assert result.serving.num_gpu_blocks_override == result.blocks_for_max_num_seqs
    assert result.fits
    import types

    import transformers

    from vllm_gdn_neuron.shells.neuron.checks import check_neuron_config

    settings = yaml.safe_load(config.read_text())
    text_config = transformers.AutoConfig.from_pretrained(tiny_model(name))
    check_neuron_config(types.SimpleNamespace(**settings["additional-config"]["neuron_config"]), text_config,
                        settings["max-model-len"], settings["max-num-seqs"])


def test_small_real_device_config_holds_its_sequences():
    """tests/integration/trn2/small-real-trn2.yaml serves a 4-layer model of the 2B's dimensions."""
    settings = yaml.safe_load((REPO / "tests" / "integration" / "trn2" / "small-real-trn2.yaml").read_text())
    dims = sizing.published_dims("Qwen/Qwen3.5-2B")
    four_layers = dataclasses.replace(dims, layer_types=dims.layer_types[:4])
    result = sizing.size(four_layers, sizing.ServingConfig.from_yaml(settings))
    assert result.serving.num_gpu_blocks_override == result.blocks_for_max_num_seqs
    assert result.fits


@pytest.mark.parametrize("path", TRN2_CONFIGS, ids=lambda p: p.name)
def test_every_trn2_config_passes_the_neuron_shells_start_up_checks(path):
    """What the Neuron shell refuses at start-up (shells/neuron/checks.py) is not in a shipped config."""
    import types

    import transformers

    from vllm_gdn_neuron.shells.neuron.checks import check_neuron_config, check_quantization, check_text_config

    settings = yaml.safe_load(path.read_text())
    class_name, overrides, _ = sizing.PUBLISHED[settings["model"]]
    text_config = getattr(transformers, class_name)(**overrides)
    check_text_config(text_config, settings["tensor-parallel-size"])
    neuron_config = types.SimpleNamespace(**settings["additional-config"]["neuron_config"])
    # NeuronConfig.from_dict makes the sampling dict an OnDeviceSamplingConfig (attributes).
    neuron_config.on_device_sampling_config = types.SimpleNamespace(**neuron_config.on_device_sampling_config)
    check_neuron_config(neuron_config, text_config, settings["max-model-len"], settings["max-num-seqs"])
    # A block-FP8 release carries the published quantization_config (read by the shell as the checkpoint's).
    fp8_release = settings["model"].endswith("-FP8")
    quantization_config = dict(FP8_RELEASE_QUANTIZATION) if fp8_release else None
    on_device = check_quantization(quantization_config, getattr(neuron_config, "quantization", None))
    assert on_device is (getattr(neuron_config, "quantization", None) == "fp8")


def _shell_bytes_per_core(name: str, tp: int, fp8: bool) -> int:
    """Bytes of the Neuron shell's parameters on one rank of ``tp`` (meta tensors), its FP8 projections
    converted as ``neuron_config.quantization: "fp8"`` converts them."""
    import types

    import transformers

    from vllm_gdn_neuron.shells.neuron.fp8 import keep_fp8_on_device
    from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM

    class_name, overrides, _ = sizing.PUBLISHED[name]
    config = getattr(transformers, class_name)(**overrides)
    config.dtype = torch.bfloat16
    group = types.SimpleNamespace(world_size=tp, rank_in_group=0, all_reduce=None, all_gather=None)
    with torch.device("meta"):
        shell = Qwen3_5NeuronForCausalLM(config, None, tp_group=group)
        if fp8:
            keep_fp8_on_device(shell, {n for n, _ in shell.named_parameters()})
    return sum(p.numel() * p.element_size() for p in shell.parameters())


@pytest.mark.parametrize(("name", "tp"), [("Qwen/Qwen3.5-2B", 1), ("Qwen/Qwen3.5-2B", 2), ("Qwen/Qwen3.5-9B", 4),
                                          ("Qwen/Qwen3.5-27B", 4), ("Qwen/Qwen3.5-27B", 8),
                                          ("Qwen/Qwen3.5-35B-A3B", 4)])
def test_fp8_weights_per_core_save_what_the_neuron_shell_saves(name, tp):
    """The bytes FP8 on the device saves per core (weights at 1 B, float32 per-row scales added) equal
    the Neuron shell's own: its parameters on one rank, bf16 against FP8-converted."""
    dims = sizing.published_dims(name)
    bf16 = sizing.size(dims, sizing.ServingConfig(tensor_parallel_size=tp))
    fp8 = sizing.size(dims, sizing.ServingConfig(tensor_parallel_size=tp, quantization="fp8"))
    saved = _shell_bytes_per_core(name, tp, fp8=False) - _shell_bytes_per_core(name, tp, fp8=True)
    assert bf16.weights_per_core - fp8.weights_per_core == pytest.approx(saved, rel=0, abs=0.5)
    assert 0.45 < fp8.weights_per_core / bf16.weights_per_core < 0.75
