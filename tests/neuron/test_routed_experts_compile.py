"""The routed experts compile as the harness compiles a bucket: one graph, no breaks, no host reads.

Each path under ``torch.compile(fullgraph=True, dynamic=False)`` on the harness's recording
``aot_eager``; a second call with other routing (other tokens, other experts) must not
recompile (``fail_on_recompile``), and both calls equal the eager result.
"""

import pytest
import torch

from vllm_gdn_neuron.model.mlp import softmax_top_k
from vllm_gdn_neuron.model.routed_experts import gathered_expert_mixture, grouped_expert_mixture

from .runner import GraphRecorder, host_reads


@pytest.mark.parametrize(("path", "num_tokens", "num_experts", "top_k"), [
    ("gathered", 4, 256, 8), ("grouped", 64, 16, 4), ("grouped", 48, 8, 8),
])
def test_each_path_is_one_graph_without_breaks_host_reads_or_recompiles(path, num_tokens, num_experts, top_k):
    fn = gathered_expert_mixture if path == "gathered" else lambda *a: grouped_expert_mixture(*a, block_size=8)
    generator = torch.Generator().manual_seed(0)
    gate_up = torch.randn(num_experts, 16, 8, generator=generator)
    down = torch.randn(num_experts, 8, 8, generator=generator)

    def inputs():
        x = torch.randn(num_tokens, 8, generator=generator)
        weights, experts = softmax_top_k(torch.randn(num_tokens, num_experts, generator=generator), top_k, True)
        return x, weights, experts, gate_up, down

    recorder = GraphRecorder()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=recorder)
    first = inputs()
    assert torch.equal(compiled(*first), fn(*first))
    with torch.compiler.set_stance("fail_on_recompile"):
        second = inputs()
        assert torch.equal(compiled(*second), fn(*second))
    assert len(recorder.dynamo_graphs) == 1 and len(recorder.aten_graphs) == 1
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
    assert [r for g in recorder.dynamo_graphs + recorder.aten_graphs for r in host_reads(g)] == []
