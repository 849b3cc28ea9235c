"""The whole-step trn2 model's arithmetic on a hand-worked graph (FLOPs, bytes, seconds; no timings).

The graph: ``sigmoid(all_reduce(x @ W^T))`` with x ``[4, 256]`` and W ``[384, 256]`` in bf16
on a 4-rank group, compiled by the harness's recording backend. By hand, from the documented
rates (one logical core = 2 NeuronCore-v3; TensorE 79 TFLOPS per physical core on a 128 x 128
array, HBM 2.9 TB/s per chip over 8 physical cores, ScalarE 1.2 GHz, a 64-cycle minimum):

- mm: ``2 * 4 * 384 * 256`` FLOPs; TensorE ``2 x 3`` tiles x ``max(4, 64)`` columns = 384
  cycles at 2.41 GHz over 2 cores; HBM: W (196,608 B) + x (2,048 B) at 725 GB/s, which bounds it.
- all_reduce of 4 x 384 bf16 = 3,072 B over 4 ranks: latency + ``2 * 3/4 * 3072`` B at 725 GB/s.
- sigmoid: 1,536 elements on ScalarE: the 64-cycle minimum at 1.2 GHz.
"""

import pytest
import torch

from benchmarks import bench_step_trn2_model as bench
from benchmarks import step_model


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(256, 384, bias=False, dtype=torch.bfloat16)
        self.group = bench.PricedGroup(4)

    def forward(self, x):
        return torch.sigmoid(self.group.all_reduce(self.proj(x)))


def test_hand_worked_matmul_collective_and_activation():
    recorder = bench.ShapeRecorder()
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(Tiny(), fullgraph=True, dynamic=False, backend=recorder)(torch.zeros(4, 256, dtype=torch.bfloat16))
    (graph,) = recorder.aten_graphs
    costs = {cost.op: cost for _, cost in step_model.price_graph(graph, lambda node, name, inputs: "other")}
    assert sorted(costs) == ["all_reduce", "mm", "sigmoid"]

    clock = 79e12 / (2 * 128 * 128)
    hbm = 2 * 2.9e12 / 8
    mm = costs["mm"]
    assert mm.flops == 2 * 4 * 384 * 256
    assert mm.tensor_s == pytest.approx(2 * 3 * 64 / clock / 2)
    assert mm.hbm_bytes == 384 * 256 * 2 + 4 * 256 * 2
    assert mm.time_s == pytest.approx((384 * 256 * 2 + 4 * 256 * 2) / hbm)

    reduce = costs["all_reduce"]
    assert reduce.time_s == pytest.approx(step_model.COLLECTIVE_LATENCY_S + 2 * 3 / 4 * 3072 / hbm)

    assert costs["sigmoid"].time_s == pytest.approx(64 / 1.2e9)
    total = sum(c.time_s for c in costs.values())
    assert total == pytest.approx((384 * 256 * 2 + 4 * 256 * 2) / hbm + step_model.COLLECTIVE_LATENCY_S
                                  + 2 * 3 / 4 * 3072 / hbm + 64 / 1.2e9)

