"""The Neuron shell started and served by the runner stand-in (``runner.py``), against transformers.

Each case: the runner's start-up (meta ``from_configs`` -> ``load_weights`` -> ``.to`` ->
``torch.compile`` with the runner's own arguments -> ``get_kv_cache_spec`` with the platform's
hybrid page alignment -> one shared int8 buffer per cache tensor and dtype views ->
``bind_kv_cache`` -> warm-up of every bucket on the runner's synthetic inputs), then, under
``torch.compiler.set_stance("fail_on_recompile")``, requests of different lengths arrive
while others decode, finish at different steps and hand their blocks (and their stale
block-table rows) to the next. Measured: graphs (one per bucket, all static, none after
warm-up), graph breaks (none), host reads in any ATen graph (none), greedy ids (equal to
transformers' in fp32; under the bf16 tie rule in bf16).
"""

import pytest
import torch

from tests.support import oracle
from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM

from .runner import EngineSettings, NeuronRunnerStandIn, host_reads, serve, symbolic_graphs

# (prompt length, new tokens, arrival step): one-token prompts, prompts longer than the
# largest prefill bucket (chunked), decode batches above and below the decode bucket.
FAST_WORKLOAD = [(1, 6, 0), (5, 3, 0), (45, 4, 1), (20, 5, 3), (3, 7, 6), (33, 2, 8)]
SLOW_WORKLOAD = FAST_WORKLOAD + [(70, 3, 9), (2, 9, 9), (17, 1, 12), (64, 4, 14), (9, 6, 15)]


def _prompts(workload, vocab_size=512, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n, _, _ in workload]


def settings_for(model_dir, dtype, prefill_buckets, decode_buckets, sampling_config=None, quantization=None, **engine):
    """``sampling_config``: ``additional_config.neuron_config.on_device_sampling_config`` (None: host sampling);
    ``quantization``: ``neuron_config.quantization`` (None: not set)."""
    neuron_config = dict(on_device_sampling_config=sampling_config, num_batched_tokens_buckets=list(prefill_buckets),
                         num_seqs_buckets=list(decode_buckets))
    if quantization is not None:
        neuron_config["quantization"] = quantization
    return EngineSettings(model=model_dir, dtype=dtype, max_num_seqs=max(decode_buckets),
                          additional_config={"neuron_config": neuron_config}, **engine)


def run_harness(model_dir, workload, dtype="float32", prefill_buckets=(32,), decode_buckets=(4,), vocab_size=512,
                model_cls=Qwen3_5NeuronForCausalLM, backend=None, prefill_rows=1, samplings=None, **engine):
    """Start the runner stand-in (compile ``backend``: the runner's default when None; ``prefill_rows``
    requests per prefill step), serve ``workload`` (``samplings``: one ``runner.Sampling`` per request,
    default greedy); return the ids and what was measured."""
    runner = NeuronRunnerStandIn(model_cls, settings_for(model_dir, dtype, prefill_buckets, decode_buckets, **engine),
                                 backend=backend, prefill_rows=prefill_rows)
    runner.start()
    buckets = len(runner.prefill_buckets) + len(runner.decode_buckets)
    warm_graphs = len(runner.recorder.dynamo_graphs)
    torch._dynamo.utils.counters.clear()
    prompts = _prompts(workload, vocab_size)
    with torch.compiler.set_stance("fail_on_recompile"):
        ids, steps = serve(runner, prompts, [n for _, n, _ in workload], [a for _, _, a in workload], samplings)
    return dict(
        ids=ids, prompts=prompts, steps=steps, buckets=buckets, warm_graphs=warm_graphs, runner=runner,
        graphs=len(runner.recorder.dynamo_graphs), symbolic=symbolic_graphs(runner.recorder),
        graph_breaks=sum(torch._dynamo.utils.counters["graph_break"].values()),
        host_reads=[r for g in runner.recorder.dynamo_graphs + runner.recorder.aten_graphs for r in host_reads(g)],
    )


def check(result, model_dir, workload, dtype=torch.float32, tie_ulps=oracle.BF16_TIE_ULPS):
    kinds = {step[0] for step in result["steps"]}
    assert kinds == {"prefill", "decode"} and len(result["steps"]) >= 2 * len(workload)
    check_graphs_and_ids(result, model_dir, workload, dtype, tie_ulps)


def check_graphs_and_ids(result, model_dir, workload, dtype=torch.float32, tie_ulps=oracle.BF16_TIE_ULPS):
    """One static graph per bucket, none after warm-up, no graph break or host read; transformers' ids."""
    assert result["warm_graphs"] == result["buckets"], "warm-up did not trace one graph per bucket"
    assert result["graphs"] == result["buckets"], "a step recompiled after warm-up"
    assert result["symbolic"] == 0, "a bucket was traced with symbolic sizes"
    assert result["graph_breaks"] == 0
    assert result["host_reads"] == []
    for prompt, got, (_, new_tokens, _) in zip(result["prompts"], result["ids"], workload):
        want, want_logits = oracle.hf_greedy(model_dir, dtype, prompt, new_tokens)
        if dtype == torch.float32:
            assert got == want, (len(prompt), got, want)
        else:
            oracle.assert_greedy_matches(got, want, want_logits, dtype, tie_ulps=tie_ulps)


def test_shared_layout_is_one_int8_buffer_per_cache_tensor_with_dtype_views(tiny_model):
    """What the runner allocates for the hybrid model: every buffer shared by one layer of each group."""
    runner = NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM,
                                 settings_for(tiny_model("qwen3_5-dense"), "bfloat16", (32,), (4,)), compile=False)
    runner.load_model()
    runner.initialize_kv_cache(runner.get_kv_cache_spec())
    assert len(runner.groups) >= 2 and {g.is_attention for g in runner.groups} == {True, False}
    bound = {layer.mixer.layer_name: getattr(layer.mixer, "kv_pages", None) or layer.mixer.state_pages
             for layer in runner.model.model.layers}
    for tensor in runner.cache_tensors:
        views = [runner.caches[name][0] for name in tensor.shared_by]
        assert len({v.untyped_storage().data_ptr() for v in views}) == 1
        roots = {id(bound[name].root) for name in tensor.shared_by}  # one graph input per allocation
        assert len(roots) == 1 and bound[tensor.shared_by[0]].root.dtype == torch.int8
        assert len(tensor.shared_by) == len(runner.groups) or tensor is runner.cache_tensors[-1]
    dtypes = {v[0].dtype for v in runner.caches.values()}
    assert dtypes == {torch.bfloat16, torch.float32}
    assert runner.block_size % 32 == 0


def test_dense_model_in_bf16_on_the_shared_layout_serves_transformers_ids(tiny_model):
    """The fast case: bf16 K/V and float32 state views of the same buffers (fp32: the slow cases)."""
    model_dir = tiny_model("qwen3_5-dense")
    result = run_harness(model_dir, FAST_WORKLOAD, "bfloat16", num_gpu_blocks_override=24)
    check(result, model_dir, FAST_WORKLOAD, torch.bfloat16)


# The vision-language checkpoints' text decoders are the dense and MoE ones op for op: fp32 only.
EVERY_MODEL = [(model, dtype) for model in ("qwen3_5-dense", "qwen3_5-moe", "qwen3-next")
               for dtype in ("float32", "bfloat16")] + [("qwen3_5-vl", "float32"), ("qwen3_5-moe-vl", "float32")]
# The dense and MoE fp32 cases run in the vLLM 0.24 lane too (vllm-neuron's vLLM).
VLLM024_CASES = {("qwen3_5-dense", "float32"), ("qwen3_5-moe", "float32")}
EVERY_MODEL_CASES = [pytest.param(*case, marks=pytest.mark.vllm024 if case in VLLM024_CASES else ())
                     for case in EVERY_MODEL]


@pytest.mark.slow
@pytest.mark.parametrize("model, dtype", EVERY_MODEL_CASES)
def test_every_tiny_model_over_more_buckets_and_compositions(tiny_model, model, dtype):
    """Two prefill and two decode buckets (the runner's default auto-dynamic compile would make the
    second of each symbolic)."""
    model_dir = tiny_model(model)
    result = run_harness(model_dir, SLOW_WORKLOAD, dtype, prefill_buckets=(8, 64), decode_buckets=(2, 4),
                         num_gpu_blocks_override=40)
    check(result, model_dir, SLOW_WORKLOAD, getattr(torch, dtype))


# (prompt length, new tokens, arrival step) at the published 2B dims: a one-token prompt, a prompt
# chunked over the prefill bucket, one decoding while another prefills.
REAL_DIMS_WORKLOAD = [(1, 4, 0), (17, 4, 0), (40, 3, 1)]
REAL_DIMS_TIE_ULPS = 8  # tests/e2e/test_real_dims.py: 2048-wide hidden states, a 248,320-row head


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_real_dims_2b_checkpoint_on_the_runner(tiny_model, dtype):
    """Qwen3.5-2B's per-layer dims (4 layers, random weights): the attention block grows to hold a
    GDN state page, ids across the whole vocabulary; transformers runs first in a child process."""
    model_dir = tiny_model("qwen3_5-2b-real")
    vocab_size = 248_320
    prompts = _prompts(REAL_DIMS_WORKLOAD, vocab_size)
    new_tokens = max(n for _, n, _ in REAL_DIMS_WORKLOAD)
    if dtype == "bfloat16":
        expected, _ = oracle.hf_bf16_oracle_in_subprocess(model_dir, prompts, new_tokens)
    else:
        expected = [(ids, logits, None) for ids, logits in
                    oracle.hf_greedy_in_subprocess(model_dir, torch.float32, prompts, new_tokens)]
    result = run_harness(model_dir, REAL_DIMS_WORKLOAD, dtype, vocab_size=vocab_size, num_gpu_blocks_override=16)
    assert result["runner"].block_size > 32  # the hybrid alignment raised it
    assert (result["warm_graphs"], result["graphs"], result["symbolic"], result["graph_breaks"]) == (2, 2, 0, 0)
    assert result["host_reads"] == []
    for got, (want, want_logits, fp32_logits), (_, n, _) in zip(result["ids"], expected, REAL_DIMS_WORKLOAD):
        if dtype == "float32":
            assert got == want[:n]
        else:
            oracle.assert_greedy_matches(got, want[:n], want_logits[:n], torch.bfloat16, tie_ulps=REAL_DIMS_TIE_ULPS,
                                         fp32_logits=fp32_logits[:n])
