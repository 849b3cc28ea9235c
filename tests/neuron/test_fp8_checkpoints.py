"""Block-FP8 checkpoints through the Neuron shell, in the runner stand-in (``runner.py``).

Dequantized on the host (the default): the FP8 twins of every tiny layout (dense, MoE with
per-expert tensors, Qwen3-Next's packed projections, the vision-language wrappers) serve
transformers' fp32 ids on the dequantized weights (``fp8 * scale_inv``), the graphs as the
bf16 checkpoint's (one static graph per bucket, no break, no host read); at TP=2 too, where
every rank's shard is smaller than one 128-block.

FP8 on the device (``neuron_config.quantization: "fp8"``): the projections and experts the
checkpoint stored in FP8 are held as float8_e4m3fn within trn2's +-240 with per-row float32
scales (the bytes counted); the ids equal transformers' fp32 on the weights the device
computes with (each dequantized weight requantized per row, ``fp8_oracle.device_weights_copy``),
and the logits stay within what that requantization alone moves them from the dequantized path.

Both paths at the published 35B-A3B per-layer dims too (``qwen3_5-35b-a3b-real-fp8``: 2048-wide
hidden states, 128-block-aligned shards, the 248,320-token vocabulary; slow): the same fp32 ids,
exactly, and the same logits rule. TP=2 is left to the tiny models: the whole weight is
dequantized before it is split and each rank requantizes whole rows or columns of its share, so
a shard's size against a 128-block enters neither path, and every real-dims shard is block-aligned.
"""

import pytest
import torch

from tests.support import oracle
from vllm_gdn_neuron.model.fp8 import FP8_DTYPE
from vllm_gdn_neuron.shells.neuron.fp8 import DEVICE_FP8_MAX, Fp8Experts, Fp8Linear

from .fp8_oracle import dequantized_copy, device_weights_copy
from .test_harness import FAST_WORKLOAD, REAL_DIMS_WORKLOAD, _prompts, check, run_harness

TINY_FP8 = ["qwen3_5-dense-fp8", "qwen3_5-moe-fp8", "qwen3-next-fp8", "qwen3_5-vl-fp8", "qwen3_5-moe-vl-fp8"]


@pytest.fixture(scope="module")
def oracle_dirs(tmp_path_factory):
    made = {}

    def get(model_dir: str, kind: str) -> str:
        if (model_dir, kind) not in made:
            out = tmp_path_factory.mktemp(f"fp8-{kind}")
            made[model_dir, kind] = (dequantized_copy if kind == "dequantized" else device_weights_copy)(model_dir, out)
        return made[model_dir, kind]

    return get


def _fp8_on_device(model_dir, workload, **kwargs):
    return run_harness(model_dir, workload, quantization="fp8", **kwargs)


@pytest.mark.parametrize("model", ["qwen3_5-dense-fp8", "qwen3_5-moe-fp8"])
def test_fp8_checkpoint_dequantized_on_the_host_serves_transformers_ids(tiny_model, oracle_dirs, model):
    model_dir = tiny_model(model)
    result = run_harness(model_dir, FAST_WORKLOAD)
    model_params = result["runner"].model.parameters()
    assert all(p.dtype == torch.float32 for p in model_params), "the dequantized path keeps the model dtype"
    check(result, oracle_dirs(model_dir, "dequantized"), FAST_WORKLOAD)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3-next-fp8", "qwen3_5-vl-fp8", "qwen3_5-moe-vl-fp8"])
def test_every_fp8_layout_dequantized_serves_transformers_ids(tiny_model, oracle_dirs, model):
    model_dir = tiny_model(model)
    check(run_harness(model_dir, FAST_WORKLOAD), oracle_dirs(model_dir, "dequantized"), FAST_WORKLOAD)


def _fp8_modules(model):
    return [m for m in model.modules() if isinstance(m, (Fp8Linear, Fp8Experts))]


@pytest.mark.parametrize("model", ["qwen3_5-dense-fp8", "qwen3_5-moe-fp8", "qwen3-next-fp8"])
def test_fp8_on_device_serves_the_ids_of_its_own_weights(tiny_model, oracle_dirs, model):
    model_dir = tiny_model(model)
    result = _fp8_on_device(model_dir, FAST_WORKLOAD)
    shell = result["runner"].model
    fp8_params = [p for p in shell.parameters() if p.dtype == FP8_DTYPE]
    assert fp8_params and all(p.float().abs().max() <= DEVICE_FP8_MAX for p in fp8_params)
    # Per layer: the mixer's two FP8 projections and the feed-forward's (dense: gate_up, down;
    # MoE: the expert stacks and the shared expert's two).
    want = sum(2 + (3 if hasattr(layer.mlp, "experts") else 2) for layer in shell.model.layers)
    assert len(_fp8_modules(shell)) == want
    # in_proj_ba, the router, the shared-expert gate, the embeddings and the head stay in the model dtype.
    kept = {name for name, p in shell.named_parameters() if p.dtype == torch.float32 and p.dim() == 2}
    assert any(".in_proj_ba." in n for n in kept) and "lm_head.weight" in kept
    check(result, oracle_dirs(model_dir, "device"), FAST_WORKLOAD)


def _first_logits(result) -> torch.Tensor:
    """The first served step's logits row (host sampling: the model returns logits)."""
    return result["runner"].outputs[0][0][0]


@pytest.mark.parametrize("model", ["qwen3_5-dense-fp8", "qwen3_5-moe-fp8"])
def test_fp8_on_device_logits_within_the_requantization_error_of_the_dequantized_path(tiny_model, oracle_dirs, model):
    """The on-device logits differ from the dequantized path's by no more than transformers' fp32 on
    the requantized weights differs from it (twice that, for the fp32 reassociation left over)."""
    model_dir = tiny_model(model)
    workload = [(23, 1, 0)]
    dequantized = run_harness(model_dir, workload)
    on_device = _fp8_on_device(model_dir, workload)
    prompt = dequantized["prompts"][0]
    _, hf_dequantized = oracle.hf_greedy(oracle_dirs(model_dir, "dequantized"), torch.float32, prompt, 1)
    _, hf_requantized = oracle.hf_greedy(oracle_dirs(model_dir, "device"), torch.float32, prompt, 1)
    allowed = float((hf_requantized[0] - hf_dequantized[0]).abs().max())
    got = float((_first_logits(on_device) - _first_logits(dequantized)).abs().max())
    assert 0 < got <= 2 * allowed, (got, allowed)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "importer"), [("qwen3_5-dense-fp8", "torch_mlir"), ("qwen3_5-dense-fp8", "torchax"),
                                                 ("qwen3_5-moe-fp8", "torch_mlir"), ("qwen3-next-fp8", "torch_mlir")])
def test_fp8_on_device_buckets_lower_and_equal_eager_and_their_oracle(tiny_model, oracle_dirs, model, importer):
    """Both lowering checks (``xla_lowering.py``): the FP8 weights are inputs of every bucket graph
    (converted inside it); XLA:CPU equals eager within the lowering tolerance and the ids equal
    transformers' fp32 on the device's weights."""
    from .test_xla_lowering import serve_on_xla

    model_dir = tiny_model(model)
    backend = serve_on_xla(model, model_dir, FAST_WORKLOAD, (32,), (4,), oracle=False, importer=importer,
                           num_gpu_blocks_override=24, quantization="fp8")
    for index, graph in enumerate(backend.aten_graphs):
        fp8_inputs = [n for n in graph.graph.nodes if n.op == "placeholder" and n.meta["val"].dtype == FP8_DTYPE]
        assert fp8_inputs, f"bucket {index} takes no FP8 weight"
        assert backend.buckets[index].contents.op_counts["stablehlo.convert"] > 0
    check(run_harness(model_dir, FAST_WORKLOAD, quantization="fp8"), oracle_dirs(model_dir, "device"), FAST_WORKLOAD)


@pytest.mark.parametrize("model", ["qwen3_5-moe-fp8", "qwen3-next-fp8"])
def test_fp8_on_device_each_rank_requantizes_its_own_share(tiny_model, model):
    """At TP=2 (every shard smaller than one 128-block) each rank's FP8 weights and scales are
    :func:`quantize_rows` of its :func:`rank_share` of the dequantized whole; the modules the
    checkpoint kept in bf16 are the dequantized path's shares."""
    import types

    import transformers

    from vllm_gdn_neuron.model.parameters import rank_share
    from vllm_gdn_neuron.shells.neuron.fp8 import quantize_rows
    from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM

    from .runner import NeuronConfigStandIn

    folder = tiny_model(model)
    config = transformers.AutoConfig.from_pretrained(folder)

    def loaded(tp, rank, quantization):
        group = types.SimpleNamespace(world_size=tp, rank_in_group=rank, all_reduce=None, all_gather=None)
        with torch.device("meta"):
            shell = Qwen3_5NeuronForCausalLM(config, NeuronConfigStandIn(quantization=quantization), tp_group=group)
        shell.load_weights(folder, "cpu", None)
        return shell

    whole = dict(loaded(1, 0, None).named_parameters())
    for rank in range(2):
        params = dict(loaded(2, rank, "fp8").named_parameters())
        checked = 0
        for name, param in params.items():
            if name.endswith("_scale") or name == "weight_scale" or name.endswith(".weight_scale"):
                continue
            share = rank_share(name, whole[name].data, config, 2, rank, vocab_split=True)
            if param.dtype == FP8_DTYPE:
                fp8, scale = quantize_rows(share)
                scale_name = name.replace(".weight", ".weight_scale") if name.endswith(".weight") else f"{name}_scale"
                assert torch.equal(param.data.view(torch.uint8), fp8.view(torch.uint8)), name
                torch.testing.assert_close(params[scale_name].data, scale, rtol=0, atol=0, msg=name)
                checked += 1
            else:
                torch.testing.assert_close(param.data, share, rtol=0, atol=0, msg=name)
        assert checked >= 4 * config.num_hidden_layers  # two mixer projections, two feed-forward weights a layer


# The 35B-A3B per-layer dims in block-FP8 (``scripts/build_tiny_models.py``: 4 layers, 8 experts of
# 512, random weights, ~2.1 GB): the harness's real-dims workload (``test_harness.py``), fp32.
REAL_DIMS_FP8 = "qwen3_5-35b-a3b-real-fp8"
REAL_DIMS_VOCAB = 248_320


@pytest.fixture(scope="module")
def real_dims_fp8(tiny_model, oracle_dirs):
    """``(folder, prompts, oracle)`` of the real-dims FP8 checkpoint: ``oracle[kind]`` is transformers'
    fp32 ``(ids, logits)`` per prompt on its ``"dequantized"`` and ``"device"`` weights, each run in a
    child process before any harness loads the model here (one fp32 copy, ~4 GB, alive at a time)."""
    model_dir = tiny_model(REAL_DIMS_FP8)
    prompts = _prompts(REAL_DIMS_WORKLOAD, REAL_DIMS_VOCAB)
    new_tokens = max(n for _, n, _ in REAL_DIMS_WORKLOAD)
    oracle_runs = {kind: oracle.hf_greedy_in_subprocess(oracle_dirs(model_dir, kind), torch.float32, prompts, new_tokens)
                   for kind in ("dequantized", "device")}
    return model_dir, prompts, oracle_runs


def _real_dims_run(model_dir, **engine):
    """The harness at the real dims: its ids and its first step's logits (the rest is freed)."""
    result = run_harness(model_dir, REAL_DIMS_WORKLOAD, vocab_size=REAL_DIMS_VOCAB, num_gpu_blocks_override=16, **engine)
    assert (result["warm_graphs"], result["graphs"], result["symbolic"], result["graph_breaks"]) == (2, 2, 0, 0)
    assert result["host_reads"] == []
    shell = result["runner"].model
    fp8_modules = len(_fp8_modules(shell))
    fp8_params = [p for p in shell.parameters() if p.dtype == FP8_DTYPE]
    assert all(p.float().abs().max() <= DEVICE_FP8_MAX for p in fp8_params)
    return dict(ids=result["ids"], prompts=result["prompts"], first_logits=_first_logits(result).clone(),
                fp8_modules=fp8_modules, fp8_params=len(fp8_params), dtypes={p.dtype for p in shell.parameters()},
                moe_layers=[hasattr(layer.mlp, "experts") for layer in shell.model.layers])


def _assert_ids(run, oracle_run):
    for got, (want, _), (_, n, _) in zip(run["ids"], oracle_run, REAL_DIMS_WORKLOAD):
        assert got == want[:n], (got, want[:n])


@pytest.fixture(scope="module")
def real_dims_dequantized_run(real_dims_fp8):
    return _real_dims_run(real_dims_fp8[0])


@pytest.mark.slow
def test_real_dims_fp8_checkpoint_dequantized_on_the_host_serves_transformers_ids(real_dims_fp8,
                                                                                  real_dims_dequantized_run):
    """Dequantized whole on the host (the default): every parameter in the model dtype, transformers'
    fp32 ids on ``fp8 * scale_inv`` exactly (fp32 stays exact at these dims: ``test_harness.py``)."""
    _, prompts, oracle_runs = real_dims_fp8
    run = real_dims_dequantized_run
    assert run["prompts"] == prompts and run["fp8_modules"] == 0 and run["dtypes"] == {torch.float32}
    _assert_ids(run, oracle_runs["dequantized"])


@pytest.mark.slow
def test_real_dims_fp8_on_device_serves_its_own_weights_ids_within_the_requantization_error(
        real_dims_fp8, real_dims_dequantized_run):
    """FP8 on the device at the real dims: every FP8 projection and expert stack kept in FP8 (two a
    mixer, the experts, the shared expert's two); transformers' fp32 ids on the requantized weights;
    the first logits within twice what requantization alone moves transformers' from the dequantized
    path's (the tiny models' rule above)."""
    model_dir, _, oracle_runs = real_dims_fp8
    run = _real_dims_run(model_dir, quantization="fp8")
    assert all(run["moe_layers"]) and run["fp8_modules"] == len(run["moe_layers"]) * (2 + 3)
    assert run["fp8_params"] >= run["fp8_modules"]
    assert run["dtypes"] == {FP8_DTYPE, torch.float32}
    _assert_ids(run, oracle_runs["device"])
    allowed = float((oracle_runs["device"][0][1][0] - oracle_runs["dequantized"][0][1][0]).abs().max())
    got = float((run["first_logits"] - real_dims_dequantized_run["first_logits"]).abs().max())
    assert 0 < got <= 2 * allowed, (got, allowed)
