"""What the Neuron shell cannot serve fails at start-up (``from_configs`` / ``load_weights``), naming the field."""

import copy
import json
import logging
import pathlib
import shutil
import types

import pytest
import torch

from vllm_gdn_neuron.shells.neuron.checks import check_neuron_config
from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM

from .runner import NeuronConfigStandIn


@pytest.fixture(scope="module")
def dense_config(tiny_model):
    import transformers

    return transformers.AutoConfig.from_pretrained(tiny_model("qwen3_5-dense"))


def _build(config, neuron_config=None, **kwargs):
    with torch.device("meta"):
        return Qwen3_5NeuronForCausalLM.from_configs(config, neuron_config, **kwargs)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("linear_key_head_dim", 160, r"linear_key_head_dim must be in \[1, 128\] \(one NKI partition tile\); got 160"),
    ("linear_value_head_dim", 256, r"linear_value_head_dim must be in \[1, 128\].*got 256"),
    ("linear_num_value_heads", 3, "linear_num_value_heads must be a positive multiple of linear_num_key_heads; "
                                  "got linear_num_value_heads=3, linear_num_key_heads=2"),
    ("linear_conv_kernel_dim", 0, "linear_conv_kernel_dim must be >= 1; got 0"),
    ("hidden_act", "gelu", "hidden_act must be 'silu'; got 'gelu'"),
    ("attention_bias", True, "attention_bias must be False"),
    ("layer_types", ["linear_attention", "sliding_attention", "linear_attention", "full_attention"],
     "layer_types\\[1\\] must be 'linear_attention' or 'full_attention'; got 'sliding_attention'"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0},
     "rope_parameters.rope_type must be 'default'.*got 'yarn'"),
])
def test_unservable_checkpoints_are_refused_by_from_configs(dense_config, field, value, message):
    config = copy.deepcopy(dense_config)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=message):
        _build(config)


@pytest.mark.parametrize(("neuron_config", "message"), [
    (NeuronConfigStandIn(num_batched_tokens_buckets=[128, 8192]),
     r"neuron_config.num_batched_tokens_buckets must not exceed max_position_embeddings=4096; got \[128, 8192\]"),
    (NeuronConfigStandIn(num_batched_tokens_buckets=[0, 64]),
     r"neuron_config.num_batched_tokens_buckets must hold integers >= 1; got \[0, 64\]"),
    (NeuronConfigStandIn(num_seqs_buckets=[4, 2.5]), r"neuron_config.num_seqs_buckets must hold integers >= 1"),
    (NeuronConfigStandIn(on_device_sampling_config={"max_top_k": 0}),
     r"neuron_config.on_device_sampling_config.max_top_k must be an integer >= 1 .*got 0"),
    (NeuronConfigStandIn(on_device_sampling_config={"sampling_dp_degree": 2}),
     r"neuron_config.on_device_sampling_config.sampling_dp_degree must be 1 .*got 2: remove sampling_dp_degree"),
    (NeuronConfigStandIn(on_device_sampling_config={"capture_topk": True}),
     "neuron_config.on_device_sampling_config.capture_topk must be false"),
    (NeuronConfigStandIn(quantization="mxfp8"),
     r"neuron_config.quantization must be null or \"bf16\" .* or \"fp8\" .*got 'mxfp8': remove it .* or set one"),
    (types.SimpleNamespace(ep_degree=2),
     "neuron_config.ep_degree must be 1 .*got 2: remove ep_degree from additional_config.neuron_config"),
    (types.SimpleNamespace(lm_head_dp_size=4), "neuron_config.lm_head_dp_size must be 1 .*got 4: remove lm_head_dp_size"),
    (types.SimpleNamespace(attention_dp_size=2), "neuron_config.attention_dp_size must be 1 .*got 2"),
    (types.SimpleNamespace(fp8_packed_kv=True), "neuron_config.fp8_packed_kv must be false .*remove fp8_packed_kv"),
])
def test_unservable_neuron_configs_are_refused_by_from_configs(dense_config, neuron_config, message):
    with pytest.raises(ValueError, match=message):
        _build(dense_config, neuron_config)


def test_buckets_beyond_the_engine_limits_are_refused(dense_config):
    buckets = NeuronConfigStandIn(num_batched_tokens_buckets=[64, 1024], num_seqs_buckets=[8, 16])
    with pytest.raises(ValueError, match=r"num_batched_tokens_buckets must not exceed max_model_len=512"):
        check_neuron_config(buckets, dense_config, max_model_len=512, max_num_seqs=16)
    with pytest.raises(ValueError, match=r"num_seqs_buckets must not exceed max_num_seqs=8; got \[8, 16\]"):
        check_neuron_config(buckets, dense_config, max_model_len=2048, max_num_seqs=8)


def test_tensor_parallel_splits_that_do_not_fit_are_refused(dense_config):
    group = types.SimpleNamespace(world_size=4, rank_in_group=0)
    with pytest.raises(ValueError, match="tensor_parallel_size must divide linear_num_key_heads=2; got tensor_parallel_size=4"):
        with torch.device("meta"):
            Qwen3_5NeuronForCausalLM(dense_config, None, tp_group=group)


def test_quantization_bf16_means_unquantized(dense_config):
    """The upstream Qwen3.5 recipe sets ``quantization: "bf16"``: the same model as none."""
    plain = _build(dense_config, NeuronConfigStandIn())
    bf16 = _build(dense_config, NeuronConfigStandIn(quantization="bf16"))
    assert [(n, p.shape, p.dtype) for n, p in bf16.named_parameters()] == \
        [(n, p.shape, p.dtype) for n, p in plain.named_parameters()]


@pytest.mark.parametrize(("quantization_config", "message"), [
    ({"quant_method": "gptq", "bits": 4}, r"quant_method is 'gptq': the Neuron shell loads unquantized checkpoints "
                                          r"and block-FP8 ones \(quant_method \['fp8'\]"),
    ({"quant_method": "awq"}, "quant_method is 'awq'"),
    ({"quant_method": "compressed-tensors", "config_groups": {}}, "quant_method is 'compressed-tensors'"),
    ({"quant_method": "mxfp4"}, "quant_method is 'mxfp4'"),
    ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, "quantization_config.fmt must be 'e4m3'"),
    ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]},
     "activation_scheme must be 'dynamic'"),
    ({"quant_method": "fp8"}, "weight_block_size must be two positive ints .*per-tensor FP8 is not supported"),
])
def test_unservable_checkpoint_quantizations_are_refused_naming_the_method(dense_config, quantization_config, message):
    config = copy.deepcopy(dense_config)
    config.quantization_config = quantization_config
    with pytest.raises(ValueError, match=message):
        _build(config)


def test_fp8_on_the_device_needs_an_fp8_checkpoint(dense_config):
    with pytest.raises(ValueError, match=r"neuron_config.quantization is \"fp8\" .*the checkpoint is not block-FP8 "
                                         r"\(quant_method None\)"):
        _build(dense_config, NeuronConfigStandIn(quantization="fp8"))


def test_block_fp8_checkpoint_is_served_dequantized_by_default_and_fp8_on_opt_in(tiny_model):
    import transformers

    config = transformers.AutoConfig.from_pretrained(tiny_model("qwen3_5-moe-vl-fp8"))
    for neuron_config, on_device in [(None, False), (NeuronConfigStandIn(quantization="bf16"), False),
                                     (NeuronConfigStandIn(quantization="fp8"), True)]:
        model = _build(config, neuron_config)
        assert (model.checkpoint_block_size, model.fp8_on_device) == ((128, 128), on_device)


@pytest.mark.parametrize(("change", "message"), [
    ("drop", r"_scale_inv: missing; the FP8 weight .* needs block scales of shape \(\d, 1\)"),
    ("reshape", r"_scale_inv: shape must be \((\d), 1\) for the FP8 weight .*got \(\d, 1\)"),
])
def test_fp8_checkpoint_with_bad_scales_is_refused_before_any_weight_is_read(tiny_model, tmp_path, change, message):
    import transformers
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "broken"
    shutil.copytree(tiny_model("qwen3_5-dense-fp8"), folder)
    shard = sorted(folder.glob("model-0*.safetensors"))[0]
    tensors = load_file(str(shard))
    scale = next(name for name in tensors if name.endswith("_scale_inv"))
    if change == "drop":
        del tensors[scale]
    else:
        tensors[scale] = tensors[scale].repeat(2, 1)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    model = _build(transformers.AutoConfig.from_pretrained(folder))
    with pytest.raises(ValueError, match=message):
        model.load_weights(str(folder), "cpu")
    assert all(p.is_meta for p in model.parameters()), "no parameter may be materialised before the refusal"


def _engine(image=0, video=0, multimodal=True, prefix_caching=False, cache_dtype="auto", speculative=None,
            pipeline=1, async_scheduling=False, max_num_batched_tokens=2048):
    """A stand-in for vLLM's ``VllmConfig`` with the fields the shell's start-up checks read."""
    limits = {"image": image, "video": video}
    multimodal_config = types.SimpleNamespace(get_limit_per_prompt=limits.__getitem__) if multimodal else None
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(max_model_len=2048, dtype=torch.float32, multimodal_config=multimodal_config),
        scheduler_config=types.SimpleNamespace(max_num_seqs=8, async_scheduling=async_scheduling,
                                               max_num_batched_tokens=max_num_batched_tokens),
        cache_config=types.SimpleNamespace(enable_prefix_caching=prefix_caching, cache_dtype=cache_dtype),
        speculative_config=speculative,
        parallel_config=types.SimpleNamespace(pipeline_parallel_size=pipeline),
    )


@pytest.fixture
def current_engine(monkeypatch):
    """``current_engine(config)``: the config ``from_configs`` reads as vLLM's current one."""
    import vllm_gdn_neuron.shells.neuron.model as shell_model

    def set_engine(vllm_config):
        monkeypatch.setattr(shell_model, "current_vllm_config", lambda: vllm_config)

    return set_engine


def test_a_vision_neuron_config_serving_no_images_is_accepted_with_one_log_line(dense_config, current_engine,
                                                                                 caplog):
    vision = types.SimpleNamespace(vision_attention_block_size=2048, num_vision_tokens_buckets=[2048])
    checks_logger = logging.getLogger("vllm.plugins.vllm_gdn_neuron.shells.neuron.checks")
    checks_logger.addHandler(caplog.handler)  # vLLM's "vllm" logger does not propagate to the root
    try:
        for engine in (_engine(image=0, video=0), _engine(multimodal=False), None):
            current_engine(engine)
            caplog.clear()
            with caplog.at_level(logging.INFO, logger=checks_logger.name):
                model = _build(dense_config, text_neuron_config=NeuronConfigStandIn(), vision_neuron_config=vision)
            records = dict.fromkeys(caplog.records)  # once, whichever way it reached the handler
            lines = [r.getMessage() for r in records if "vision_neuron_config" in r.getMessage()]
            assert len(lines) == 1 and "not used" in lines[0], lines
            assert not hasattr(model, "visual")
    finally:
        checks_logger.removeHandler(caplog.handler)


@pytest.mark.parametrize(("image", "video"), [(0, 2), (999, 999), (1, 1)])
def test_a_vision_neuron_config_with_videos_allowed_is_refused(dense_config, current_engine, image, video):
    current_engine(_engine(image=image, video=video))
    message = (f"limit-mm-per-prompt allows video={video}: the Neuron shell serves images, not videos .*"
               rf"set limit-mm-per-prompt \{{\"image\": {image}, \"video\": 0\}}")
    with pytest.raises(ValueError, match=message):
        _build(dense_config, text_neuron_config=NeuronConfigStandIn(), vision_neuron_config=object())


def test_images_allowed_on_a_checkpoint_without_a_tower_are_refused(dense_config, current_engine):
    current_engine(_engine(image=1, video=0))
    with pytest.raises(ValueError, match=r"allows image=1, but the checkpoint has no vision tower \(no vision_config\)"):
        _build(dense_config, text_neuron_config=NeuronConfigStandIn(), vision_neuron_config=object())


@pytest.mark.parametrize(("engine", "message"), [
    (_engine(prefix_caching=True), "enable-prefix-caching is true: .*--no-enable-prefix-caching .in a --config file: no-enable-prefix-caching: true."),
    (_engine(cache_dtype="fp8"), "kv-cache-dtype must be 'auto' .*got 'fp8': set kv-cache-dtype: auto"),
    (_engine(pipeline=2), "pipeline-parallel-size must be 1 .*got 2: set pipeline-parallel-size: 1"),
])
def test_unservable_engine_options_are_refused_by_from_configs(dense_config, current_engine, engine, message):
    current_engine(engine)
    with pytest.raises(ValueError, match=message):
        _build(dense_config, NeuronConfigStandIn())


TRAINED_MTP = pathlib.Path(__file__).resolve().parents[2] / "configs" / "trained" / "qwen3_5-tiny-mtp"


def _speculative(method="mtp", num_speculative_tokens=1):
    return types.SimpleNamespace(method=method, num_speculative_tokens=num_speculative_tokens)


@pytest.fixture(scope="module")
def mtp_config():
    import transformers

    return transformers.AutoConfig.from_pretrained(TRAINED_MTP)


def test_mtp_speculative_decoding_is_served(mtp_config, current_engine):
    current_engine(_engine(speculative=_speculative(num_speculative_tokens=3)))
    _build(mtp_config, NeuronConfigStandIn(num_seqs_buckets=[2, 8]))


@pytest.mark.parametrize(("engine", "neuron_config", "message"), [
    (_engine(speculative=_speculative("eagle3")), {},
     r"speculative-config method must be one of \['mtp'\]; got 'eagle3' \(the runner's EAGLE3 path needs the "
     r"target's auxiliary hidden states"),
    (_engine(speculative=_speculative("ngram")), {}, r"method must be one of \['mtp'\]; got 'ngram'"),
    (_engine(speculative=_speculative(num_speculative_tokens=0)), {},
     "num_speculative_tokens must be an integer >= 1; got 0"),
    (_engine(speculative=_speculative()), {"on_device_sampling_config": None},
     "speculative-config needs on-device sampling: .*got neuron_config.on_device_sampling_config null"),
    (_engine(speculative=_speculative(), async_scheduling=True), {},
     "speculative-config with async-scheduling: .*--no-async-scheduling .in a --config file: no-async-scheduling: true."),
    (_engine(speculative=_speculative(num_speculative_tokens=4), max_num_batched_tokens=32), {"num_seqs_buckets": [8]},
     r"num_speculative_tokens=4: the largest decode bucket's verify step takes \(1 \+ 4\) \* 8 = 40 tokens, more "
     r"than max_num_batched_tokens=32 holds; expected num_speculative_tokens <= 3"),
])
def test_unservable_speculative_configs_are_refused_by_from_configs(mtp_config, current_engine, engine, neuron_config,
                                                                    message):
    current_engine(engine)
    with pytest.raises(ValueError, match=message):
        _build(mtp_config, NeuronConfigStandIn(**neuron_config))


def test_mtp_without_an_mtp_head_is_refused(mtp_config, current_engine):
    config = copy.deepcopy(mtp_config)
    config.mtp_num_hidden_layers = 0
    current_engine(_engine(speculative=_speculative()))
    with pytest.raises(ValueError, match=r"speculative method 'mtp' needs the checkpoint's MTP head: "
                                         r"mtp_num_hidden_layers must be one of \(1,\).*got mtp_num_hidden_layers=0"):
        _build(config, NeuronConfigStandIn())


def _checkpoint_without(tmp_path, source, drop=None, reshape=None):
    """A copy of ``source`` with one tensor dropped or replaced by a wrongly shaped one."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "ckpt"
    shutil.copytree(source, folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    name = drop or reshape
    shard = folder / index["weight_map"][name]
    tensors = load_file(str(shard))
    if drop:
        del tensors[name]
        del index["weight_map"][name]
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        tensors[name] = torch.zeros(3, 3, dtype=torch.bfloat16)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize(("drop", "reshape", "message"), [
    ("model.layers.3.self_attn.k_norm.weight", None,
     r"the checkpoint does not provide 1 parameters: \['model.layers.3.self_attn.k_norm.weight'\]"),
    (None, "model.layers.0.linear_attn.out_proj.weight",
     r"checkpoint tensor 'model.layers.0.linear_attn.out_proj.weight': this rank's slice of "
     r"'model.layers.0.linear_attn.out_proj.weight' must have shape \(64, 64\); got \(3, 3\)"),
])
def test_load_weights_refuses_an_incomplete_or_misshaped_checkpoint(tmp_path, tiny_model, dense_config, drop, reshape,
                                                                    message):
    folder = _checkpoint_without(tmp_path, pathlib.Path(tiny_model("qwen3_5-dense")), drop, reshape)
    model = _build(dense_config)
    with pytest.raises(ValueError, match=message):
        model.load_weights(str(folder), "cpu", None)


@pytest.mark.slow
def test_from_configs_reads_the_engine_limits_of_the_current_vllm_config(dense_config):
    from vllm.config import CacheConfig, SchedulerConfig, VllmConfig, set_current_vllm_config

    scheduler = SchedulerConfig(max_num_seqs=4, max_model_len=512, max_num_batched_tokens=256,
                                is_encoder_decoder=False)
    with set_current_vllm_config(VllmConfig(scheduler_config=scheduler, cache_config=CacheConfig(block_size=32, enable_prefix_caching=False))):
        with pytest.raises(ValueError, match=r"neuron_config.num_seqs_buckets must not exceed max_num_seqs=4; got \[2, 8\]"):
            _build(dense_config, NeuronConfigStandIn(num_seqs_buckets=[2, 8]))
        _build(dense_config, NeuronConfigStandIn(num_seqs_buckets=[2, 4]))


def test_fp8_format_held_out_of_vllms_sight_is_still_the_checkpoints(tiny_model):
    """Under an engine the plugin's config hook moves a block-FP8 ``quantization_config`` aside
    (``model/fp8.py`` ``hold_dequantized``: vLLM, and vllm-neuron's platform, then see an unquantized
    model); the shell reads it there: dequantized by default, FP8 on the device on opt-in."""
    import transformers

    from vllm_gdn_neuron.model import fp8

    config = transformers.AutoConfig.from_pretrained(tiny_model("qwen3_5-moe-vl-fp8"))
    fp8.hold_dequantized(types.SimpleNamespace(hf_config=config, hf_text_config=config.text_config,
                                               model_arch_config=None, quantization=None))
    assert getattr(config, "quantization_config", None) is None
    for neuron_config, on_device in [(None, False), (NeuronConfigStandIn(quantization="fp8"), True)]:
        model = _build(config, neuron_config)
        assert (model.checkpoint_block_size, model.fp8_on_device) == ((128, 128), on_device)
