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



class Fp8Projection(torch.nn.Module):
    """One FP8-on-device projection (``shells/neuron/fp8.py``) whose bf16 widening exceeds the SBUF."""

    def __init__(self, out_features, in_features):
        super().__init__()
        from vllm_gdn_neuron.shells.neuron.fp8 import Fp8Linear

        self.proj = Fp8Linear(torch.zeros(out_features, in_features, dtype=torch.float8_e4m3fn),
                              torch.ones(out_features))

    def forward(self, x):
        return self.proj(x)


def test_fp8_weight_is_read_at_one_byte_and_widened_on_chip():
    """By hand: the FP8 weight [N, K] is read once at 1 B an element by its conversion (VectorE time
    over every element at the 16-bit rate), whose bf16 result (over the SBUF) is not written back;
    the matmul then reads only x from HBM."""
    n, k = 8192, 4096
    assert n * k * 2 > step_model.SBUF_BYTES
    recorder = bench.ShapeRecorder()
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(Fp8Projection(n, k), fullgraph=True, dynamic=False, backend=recorder)(
            torch.zeros(4, k, dtype=torch.bfloat16))
    (graph,) = recorder.aten_graphs
    priced = step_model.price_graph(graph, lambda node, name, inputs: "other")
    (widen,) = [c for node, c in priced if c.op in step_model.CONVERT_OPS and node.args[0].meta["val"].numel() == n * k]
    assert widen.hbm_bytes == n * k
    spec = step_model.SPEC
    assert widen.engine_s == pytest.approx(n * k / spec.vector_elements_per_cycle_16bit / step_model.LNC
                                           / spec.vector_clock_hz)
    (mm,) = [c for _, c in priced if c.op == "mm"]
    assert mm.hbm_bytes == 4 * k * 2
    assert mm.flops == 2 * 4 * n * k
