"""The Neuron shell's side of the pinned vllm-neuron contract: spec classes, cache spec, page arithmetic.

vllm-neuron cannot be installed here, so the spec classes are the shell's stand-ins;
these tests pin their fields to the version named in ``vllm_gdn_neuron.shells.neuron.contract``.
"""

import dataclasses
import math
import types

import pytest
import torch

from vllm_gdn_neuron.shells.neuron import cache, contract, kv_spec
from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM

from .runner import NeuronConfigStandIn, stand_ins_in_use


def _fields(cls):
    return [(f.name, f.default if f.default is not dataclasses.MISSING else "required") for f in dataclasses.fields(cls)]


def test_the_spec_classes_are_stand_ins_with_the_pinned_fields():
    assert stand_ins_in_use(), "vllm-neuron is importable here: test against the real classes instead"
    assert _fields(kv_spec.LayerSpec) == [
        ("name", "required"), ("num_kv_heads", "required"), ("head_size", "required"), ("dtype", "required"),
        ("sliding_window_size", None), ("chunk_size", None),
    ]
    assert _fields(kv_spec.RecurrentLayerSpec) == [("name", "required"), ("shapes", "required"), ("dtypes", "required")]
    assert [f.name for f in dataclasses.fields(kv_spec.KVSpec)] == ["layers", "recurrent_layers"]
    assert kv_spec.KVSpec(layers=[]).recurrent_layers == []
    assert contract.VLLM_NEURON_COMMIT.startswith("7ea99278") and "whn09/vllm-neuron" in contract.VLLM_NEURON_PIN


def test_the_harness_neuron_config_uses_pinned_field_names_only():
    pinned = {"on_device_sampling_config", "quantization", "num_batched_tokens_buckets", "num_seqs_buckets",
              "enable_structured_outputs", "hlo2tensorizer_options", "kv_segment_size_buckets",
              "decode_context_length_buckets", "lm_head_dp_size", "max_logprobs", "debug_logits_dir"}
    assert set(NeuronConfigStandIn.DEFAULTS) <= pinned
    assert NeuronConfigStandIn({"num_seqs_buckets": [4], "extra": 1}).extra == 1  # from_dict keeps every key


@pytest.fixture(scope="module")
def dense(tiny_model):
    import transformers

    folder = tiny_model("qwen3_5-dense")
    hf_config = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = Qwen3_5NeuronForCausalLM.from_configs(hf_config, NeuronConfigStandIn({}))
    return hf_config, model


def test_from_configs_on_meta_holds_no_storage(dense):
    _, model = dense
    assert all(p.is_meta for p in model.parameters())


def test_kv_spec_lists_attention_and_recurrent_layers_by_runner_name(dense):
    hf_config, model = dense
    spec = model.get_kv_spec()
    types_ = hf_config.layer_types
    assert [s.name for s in spec.layers] == [f"model.layers.{i}.self_attn" for i, t in enumerate(types_) if t == "full_attention"]
    assert [s.name for s in spec.recurrent_layers] == [
        f"model.layers.{i}.linear_attn" for i, t in enumerate(types_) if t == "linear_attention"]
    attention = spec.layers[0]
    assert (attention.num_kv_heads, attention.head_size, attention.dtype) == (
        hf_config.num_key_value_heads, hf_config.head_dim, torch.bfloat16)
    c = 2 * hf_config.linear_num_key_heads * hf_config.linear_key_head_dim + \
        hf_config.linear_num_value_heads * hf_config.linear_value_head_dim
    recurrent = spec.recurrent_layers[0]
    assert recurrent.shapes == ((hf_config.linear_conv_kernel_dim, c),
                                (hf_config.linear_num_value_heads, hf_config.linear_key_head_dim,
                                 hf_config.linear_value_head_dim))
    assert recurrent.dtypes == (torch.float32, torch.float32)


def test_the_planner_sizes_state_pages_from_the_same_shapes(dense):
    hf_config, model = dense
    vllm_config = types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=hf_config),
                                        parallel_config=types.SimpleNamespace(tensor_parallel_size=1))
    spec = model.get_kv_spec().recurrent_layers[0]
    assert tuple(Qwen3_5NeuronForCausalLM.get_mamba_state_shape_from_config(vllm_config)) == spec.shapes
    assert tuple(Qwen3_5NeuronForCausalLM.get_mamba_state_dtype_from_config(vllm_config)) == spec.dtypes
    assert Qwen3_5NeuronForCausalLM.kv_cache_page_major and Qwen3_5NeuronForCausalLM.is_hybrid


@pytest.mark.parametrize(("kv_heads", "head_dim", "dtype", "hk", "hv", "dk", "dv", "k"), [
    (2, 32, torch.bfloat16, 2, 4, 32, 16, 4),      # the tiny dense model
    (2, 256, torch.bfloat16, 16, 32, 128, 128, 4),  # Qwen3.5-9B-like, TP=1
    (1, 256, torch.bfloat16, 4, 8, 128, 128, 4),    # the same at TP=4
    (4, 128, torch.float32, 1, 3, 48, 80, 3),
])
def test_hybrid_page_arithmetic_gives_one_page_size(kv_heads, head_dim, dtype, hk, hv, dk, dv, k):
    layout = cache.GDNPageLayout(conv_shape=(k, 2 * hk * dk + hv * dv), ssm_shape=(hv, dk, dv))
    token_bytes = cache.attention_bytes_per_token(kv_heads, head_dim, dtype)
    alignment = 16
    block = cache.hybrid_block_size(token_bytes, layout.state_bytes, alignment)
    assert block % alignment == 0
    assert block * token_bytes >= layout.state_bytes > (block - alignment) * token_bytes
    elems = cache.padded_state_page_elems(block, token_bytes)
    assert elems * 4 == block * token_bytes >= layout.state_elems * 4


def test_state_page_rows_split_and_join_losslessly():
    layout = cache.GDNPageLayout(conv_shape=(4, 20), ssm_shape=(2, 3, 5))
    conv = torch.randn(3, 20, 4).to(torch.bfloat16)
    ssm = torch.randn(3, 2, 3, 5)
    rows = layout.join(conv, ssm, page_elems=layout.state_elems + 7)
    assert rows.shape == (3, layout.state_elems + 7) and rows.dtype == torch.float32
    assert torch.count_nonzero(rows[:, layout.state_elems:]) == 0
    conv_back, ssm_back = layout.split(rows)
    assert conv_back.shape == (3, 20, 4) and conv_back.is_contiguous()
    torch.testing.assert_close(conv_back, conv.float(), rtol=0, atol=0)  # bf16 is exact in float32
    torch.testing.assert_close(ssm_back, ssm, rtol=0, atol=0)


def test_state_page_conv_state_is_stored_channel_fast():
    """Tap j of channel c sits at ``j * C + c`` of the page: the ``[K, C]`` layout the vLLM shell's pages have."""
    layout = cache.GDNPageLayout(conv_shape=(4, 20), ssm_shape=(2, 3, 5))
    conv = torch.arange(3 * 20 * 4, dtype=torch.float32).view(3, 20, 4)
    rows = layout.join(conv, torch.zeros(3, 2, 3, 5), page_elems=layout.state_elems)
    for c, j in ((0, 0), (7, 1), (19, 3)):
        assert torch.equal(rows[:, j * 20 + c], conv[:, c, j])


def test_reserved_pages_are_the_last_two():
    assert contract.reserved_pages(10) == (8, 9)
    assert contract.NUM_RESERVED_PAGES == 2


def test_bind_refuses_a_cache_that_does_not_match_the_spec_and_binds_nothing(dense):
    _, model = dense
    spec = model.get_kv_spec()

    def caches(state_elems_delta=0):
        out = {s.name: [torch.zeros(6, 2, s.num_kv_heads, 32, s.head_size, dtype=s.dtype)] for s in spec.layers}
        for s in spec.recurrent_layers:
            out[s.name] = [torch.zeros(6, sum(math.prod(x) for x in s.shapes) + state_elems_delta)]
        return out

    short = caches(-1)
    short[spec.recurrent_layers[-1].name] = caches()[spec.recurrent_layers[-1].name]
    with pytest.raises(ValueError, match=r"model.layers.0.linear_attn: state pages must be \[P, >= \d+\] float32"):
        model.bind_kv_cache(short)
    missing = caches()
    missing.pop(spec.layers[0].name)
    with pytest.raises(ValueError, match="no cache for layer 'model.layers.3.self_attn'"):
        model.bind_kv_cache(missing)
    wrong_dtype = caches()
    wrong_dtype[spec.layers[0].name] = [wrong_dtype[spec.layers[0].name][0].float()]
    with pytest.raises(ValueError, match="KV pages must be .* torch.bfloat16; got .* torch.float32"):
        model.bind_kv_cache(wrong_dtype)
    assert all(layer.mixer.kv_pages is None if not layer.is_linear else layer.mixer.state_pages is None
               for layer in model.model.layers)


def test_forward_takes_exactly_the_runners_keywords():
    import inspect

    params = list(inspect.signature(Qwen3_5NeuronForCausalLM.forward).parameters)[1:]
    assert tuple(params) == contract.FORWARD_KEYWORDS


def test_the_harness_passes_every_metadata_key_the_shell_reads(tiny_model):
    from .runner import EngineSettings, NeuronRunnerStandIn

    settings = EngineSettings(model=tiny_model("qwen3_5-dense"), additional_config={"neuron_config": dict(
        num_batched_tokens_buckets=[16], num_seqs_buckets=[2])})
    runner = NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, settings, compile=False)
    runner.load_model()
    runner.initialize_kv_cache(runner.get_kv_cache_spec())
    for metadata in (runner._warmup_metadata(16, 1, 16), runner._metadata(2, [None, None], 1)):
        for entry in metadata.values():
            assert set(contract.METADATA_KEYS) <= set(entry)
        assert set(metadata) == {n for g in runner.groups for n in g.layer_names}


def test_the_host_read_scan_finds_host_reads():
    from torch.fx.experimental.proxy_tensor import make_fx

    from .runner import host_reads

    def reads(x):
        return torch.nonzero(x), x.to("meta"), x.sum().item()

    found = host_reads(make_fx(reads, tracing_mode="symbolic")(torch.ones(3)))
    assert "nonzero" in found and "_local_scalar_dense" in found
    assert any(r.startswith("_to_copy(device=") for r in found)
    assert host_reads(make_fx(lambda x: (x * 2).index_select(0, torch.zeros(1, dtype=torch.long)))(torch.ones(3))) == []


def test_the_runner_pin_is_the_same_everywhere_the_project_names_it():
    """The image, the README's install step and both trn2 docs install / name the contract's commit."""
    import pathlib

    repo = pathlib.Path(__file__).resolve().parents[2]
    dockerfile = (repo / "docker" / "Dockerfile.trn2").read_text()
    assert f"ARG VLLM_NEURON_REF={contract.VLLM_NEURON_COMMIT}" in dockerfile
    assert f"ARG VLLM_NEURON_REPO={contract.VLLM_NEURON_REPOSITORY}" in dockerfile
    readme = (repo / "README.md").read_text()
    assert f"git+{contract.VLLM_NEURON_REPOSITORY}@{contract.VLLM_NEURON_COMMIT}" in readme
    for doc in ("trn2.md", "neuron.md"):
        assert contract.VLLM_NEURON_COMMIT in (repo / "docs" / doc).read_text(), doc


def test_a_step_without_a_layers_metadata_is_refused_naming_the_layer():
    from vllm_gdn_neuron.shells.neuron.step import NeuronStep

    step = NeuronStep(torch.arange(2), torch.arange(2), {"model.layers.3.self_attn": {}}, is_decode=True)
    assert step.layer_metadata("model.layers.3.self_attn") == {}
    with pytest.raises(ValueError, match="attn_metadata has no entry for layer 'model.layers.0.linear_attn'"):
        step.layer_metadata("model.layers.0.linear_attn")
