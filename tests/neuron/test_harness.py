"""The Neuron shell driven as vllm-neuron's runner drives it, compiled per bucket, against transformers.

Each case: ``from_configs`` on meta -> ``to_empty`` -> ``load_weights`` -> ``get_kv_spec`` ->
allocate -> ``bind_kv_cache``; every bucket compiled with ``torch.compile(fullgraph=True,
dynamic=False)`` on ``aot_eager`` and warmed up on padding; then, under
``torch.compiler.set_stance("fail_on_recompile")``, requests of different lengths arrive
while others decode, finish at different steps and hand their (poisoned) blocks to the
next. Measured: graphs compiled (one per bucket, none after warm-up), graph breaks (none),
host reads in any ATen graph (none), and greedy ids (equal to transformers', fp32).
"""

import pytest
import torch

from neuron_testing import oracle
from runner import HarnessRunner, host_reads, serve
from vllm_gdn_neuron.neuron.model import Qwen3_5NeuronForCausalLM

# (prompt length, new tokens, arrival step): one-token prompts, prompts longer than the
# largest prefill bucket (chunked), decode batches above and below the decode bucket.
FAST_WORKLOAD = [(1, 6, 0), (5, 3, 0), (45, 4, 1), (20, 5, 3), (3, 7, 6), (33, 2, 8)]
SLOW_WORKLOAD = FAST_WORKLOAD + [(70, 3, 9), (2, 9, 9), (17, 1, 12), (64, 4, 14), (9, 6, 15)]


def _prompts(workload, vocab_size=512, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n, _, _ in workload]


def run_harness(model_dir, workload, dtype="float32", **runner_kwargs):
    """Serve ``workload`` through the compiled shell; return the ids and what was measured."""
    runner = HarnessRunner(Qwen3_5NeuronForCausalLM, model_dir, dtype=dtype, **runner_kwargs)
    runner.warm_up()
    buckets = len(runner.prefill_buckets) + len(runner.decode_buckets)
    assert len(runner.recorder.dynamo_graphs) == buckets  # one graph per bucket, fullgraph
    torch._dynamo.utils.counters.clear()
    prompts = _prompts(workload)
    with torch.compiler.set_stance("fail_on_recompile"):
        ids, steps = serve(runner, prompts, [n for _, n, _ in workload], [a for _, _, a in workload])
    return dict(
        ids=ids,
        prompts=prompts,
        steps=steps,
        graphs=len(runner.recorder.dynamo_graphs),
        buckets=buckets,
        graph_breaks=sum(torch._dynamo.utils.counters["graph_break"].values()),
        host_reads=[r for g in runner.recorder.dynamo_graphs + runner.recorder.aten_graphs for r in host_reads(g)],
    )


def check(result, model_dir, workload, dtype=torch.float32):
    assert result["graphs"] == result["buckets"], "a batch composition recompiled"
    assert result["graph_breaks"] == 0
    assert result["host_reads"] == []
    kinds = {step[0] for step in result["steps"]}
    assert kinds == {"prefill", "decode"} and len(result["steps"]) >= 2 * len(workload)
    for prompt, got, (_, new_tokens, _) in zip(result["prompts"], result["ids"], workload):
        want, _ = oracle.hf_greedy(model_dir, dtype, prompt, new_tokens)
        assert got == want, (len(prompt), got, want)


def test_dense_model_compiled_per_bucket_serves_transformers_ids(tiny_model):
    model_dir = tiny_model("qwen3_5-dense")
    result = run_harness(model_dir, FAST_WORKLOAD, prefill_buckets=(32,), decode_buckets=(4,), num_blocks=24)
    check(result, model_dir, FAST_WORKLOAD)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "pad_slot"), [
    ("qwen3_5-dense", 0), ("qwen3_5-dense", -1), ("qwen3_5-moe", 0), ("qwen3-next", 0), ("qwen3_5-vl", 0),
    ("qwen3_5-moe-vl", -1),
])
def test_every_tiny_model_over_more_buckets_and_compositions(tiny_model, model, pad_slot):
    """Two prefill and two decode buckets; ``pad_slot`` 0 (the pinned runner's NULL_BLOCK_ID) or -1."""
    model_dir = tiny_model(model)
    result = run_harness(model_dir, SLOW_WORKLOAD, prefill_buckets=(8, 64), decode_buckets=(2, 4),
                         num_blocks=40, pad_slot=pad_slot)
    check(result, model_dir, SLOW_WORKLOAD)
