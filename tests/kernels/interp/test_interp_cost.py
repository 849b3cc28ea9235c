"""The trace and the trn2 cost model are sane: work scales time, engines overlap, figures say modeled."""

import numpy as np
import pytest

from vllm_gdn_neuron.kernels.interp import cost, nisa, nki, nl

from .interp_helpers import BF16, load


@nki.jit
def matmul_loop(stationary, moving, repeats):
    """``repeats`` independent matmuls of resident SBUF operands."""
    st, mv = load(stationary), load(moving)
    for _ in range(repeats):
        acc = nl.ndarray((stationary.shape[1], moving.shape[1]), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=st, moving=mv, accumulate=False)


@nki.jit
def copy_loop(src, repeats):
    """``repeats`` HBM -> SBUF -> HBM round trips of ``src`` into distinct output slices."""
    out = nl.ndarray((repeats,) + src.shape, src.dtype, buffer=nl.shared_hbm)
    for i in range(repeats):
        tile = nl.ndarray(src.shape, src.dtype)
        nisa.dma_copy(dst=tile, src=src)
        nisa.dma_copy(dst=out[i], src=tile)
    return out


def _modeled(kernel, *args):
    with cost.record() as recording:
        kernel(*args)
    return recording.report()


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_a_matmul_bound_kernel_doing_twice_the_work_takes_twice_the_time(dtype):
    # TensorE time depends on the moving columns (N = 512) streamed; small K, M keep NumPy fast
    st, mv = np.ones((16, 16), dtype), np.ones((16, 512), dtype)
    once, twice = _modeled(matmul_loop, st, mv, 128), _modeled(matmul_loop, st, mv, 256)
    assert twice.macs == 2 * once.macs
    assert 1.9 < twice.modeled_time_s / once.modeled_time_s < 2.05
    assert twice.engine_busy_share["tensor"] > 0.8


def test_tensor_utilisation_against_the_bf16_roofline():
    bf16 = _modeled(matmul_loop, np.ones((128, 128), BF16), np.ones((128, 512), BF16), 40)
    fp32 = _modeled(matmul_loop, np.ones((128, 128), np.float32), np.ones((128, 512), np.float32), 40)
    # full 128 x 128 x 512 tiles: bf16 uses the array fully while busy, fp32 a quarter of it
    assert bf16.tensor_utilisation == pytest.approx(bf16.engine_busy_share["tensor"])
    assert fp32.tensor_utilisation == pytest.approx(fp32.engine_busy_share["tensor"] / 4)
    assert bf16.tensor_utilisation > 0.7 and 0.2 < fp32.tensor_utilisation <= 0.25
    # the same MACs at bf16 peak: 40 x 128 x 128 x 512 MACs at 79 TFLOP/s
    assert bf16.tensor_roofline_s == pytest.approx(40 * 128 * 128 * 512 * 2 / 79e12)


@pytest.mark.parametrize("shape", [(128, 1024), (64, 4096)])
def test_a_dma_bound_kernel_scales_with_bytes(shape):
    small = np.zeros(shape, np.float32)
    big = np.zeros((shape[0], 2 * shape[1]), np.float32)
    one, two = _modeled(copy_loop, small, 8), _modeled(copy_loop, big, 8)
    assert two.hbm_bytes == 2 * one.hbm_bytes == 2 * 8 * 2 * small.nbytes
    assert 1.7 < two.modeled_time_s / one.modeled_time_s < 2.05
    assert one.engine_busy_share["dma"] > 0.75


@nki.jit
def load_columns(src, strided):
    """Four loads of 1024 columns of src [128, 4096]: contiguous, or every fourth column."""
    view = src.ap([[4096, 128], [4, 1024]]) if strided else src[:, 0:1024]
    for _ in range(4):
        tile = nl.ndarray((128, 1024), src.dtype)
        nisa.dma_copy(dst=tile, src=view)


def test_small_dma_descriptors_cost_more_per_byte():
    src = np.zeros((128, 4096), BF16)
    contiguous, strided = _modeled(load_columns, src, False), _modeled(load_columns, src, True)
    assert strided.hbm_bytes == contiguous.hbm_bytes
    # 2-byte runs are charged the 512-byte descriptor floor: 256x the bandwidth time
    assert strided.engine_busy_s["dma"] == pytest.approx(256 * contiguous.engine_busy_s["dma"])
    assert strided.modeled_time_s > 10 * contiguous.modeled_time_s


@nki.jit
def dependent_or_independent(x, dependent):
    """16 matmuls and 16 vector copies: each copy feeds the next matmul, or works elsewhere."""
    st = load(x)
    scratch_in, scratch_out = load(x), nl.ndarray((128, 128), nl.float32)
    for _ in range(16):
        acc = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=st, moving=st, accumulate=False)
        if dependent:
            nisa.tensor_copy(dst=st, src=acc)
        else:
            nisa.tensor_copy(dst=scratch_out, src=scratch_in)


def test_engines_overlap_unless_data_dependencies_chain_them():
    x = np.full((128, 128), 1 / 128, np.float32)
    chained = _modeled(dependent_or_independent, x, True)
    parallel = _modeled(dependent_or_independent, x, False)
    assert chained.engine_busy_s == pytest.approx(parallel.engine_busy_s)
    busy = chained.engine_busy_s
    assert chained.modeled_time_s >= busy["tensor"] + busy["vector"]
    assert parallel.modeled_time_s <= chained.modeled_time_s - 0.9 * busy["vector"]


def test_a_consumer_starts_after_its_producer_completes():
    x = np.full((128, 128), 1 / 128, np.float32)
    with cost.record() as recording:
        dependent_or_independent(x, True)
    trace = recording.instructions
    for producer, consumer in zip(trace, trace[1:]):
        if producer.op == "nc_matmul" and consumer.op == "tensor_copy":
            assert consumer.start_s >= producer.done_s


def test_the_trace_records_engine_op_shapes_bytes_and_macs():
    st, mv = np.ones((64, 32), BF16), np.ones((64, 100), BF16)
    with cost.record() as recording:
        nki.jit(lambda a, b: nisa.nc_matmul(dst=nl.ndarray((32, 100), nl.float32, buffer=nl.psum),
                                            stationary=load(a), moving=load(b)), frontend_check=False)(st, mv)
    ops = [(i.engine, i.op) for i in recording.instructions]
    assert ops == [("dma", "dma_copy"), ("dma", "dma_copy"), ("tensor", "nc_matmul")]
    load_a, _, matmul = recording.instructions
    assert load_a.bytes_moved == load_a.hbm_bytes == 64 * 32 * 2 and load_a.dst_shape == (64, 32)
    assert matmul.macs == 64 * 32 * 100 and matmul.input_shapes == ((64, 32), (64, 100))
    assert matmul.dst_dtype == "float32" and matmul.start_s >= max(load_a.done_s, recording.instructions[1].done_s)


def test_every_printed_figure_says_modeled():
    report = _modeled(matmul_loop, np.ones((128, 128), BF16), np.ones((128, 512), BF16), 4)
    lines = report.table().splitlines()
    assert len(lines) > 8
    assert all("modeled" in line for line in lines)


def test_recording_is_opt_in_and_nests():
    st, mv = np.ones((128, 128), BF16), np.ones((128, 512), BF16)
    assert cost.active_recorder() is None
    with cost.record() as outer:
        matmul_loop(st, mv, 2)
        with cost.record() as inner:
            matmul_loop(st, mv, 3)
        assert cost.active_recorder() is outer
    assert cost.active_recorder() is None
    assert [i.op for i in inner.instructions].count("nc_matmul") == 3
    assert [i.op for i in outer.instructions].count("nc_matmul") == 2


def test_spec_constants_derive_the_documented_rates():
    spec = cost.Trn2Spec()
    assert spec.tensor_clock_hz == pytest.approx(2.41e9, rel=0.01)
    assert spec.hbm_bytes_per_s == pytest.approx(362.5e9)
    slower = cost.Trn2Spec(hbm_bytes_per_s=spec.hbm_bytes_per_s / 2)
    with cost.record(slower) as recording:
        copy_loop(np.zeros((128, 2048), np.float32), 4)
    baseline = _modeled(copy_loop, np.zeros((128, 2048), np.float32), 4)
    assert recording.report().modeled_time_s > 1.6 * baseline.modeled_time_s


def test_the_report_carries_the_peak_on_chip_memory_of_the_launches():
    # matmul_loop keeps two bf16 operands (128 x 128 and 128 x 512: 1280 B per partition) and
    # at most two 128 x 512 fp32 PSUM tiles (the next one is allocated before the last is dropped)
    report = _modeled(matmul_loop, np.ones((128, 128), BF16), np.ones((128, 512), BF16), 3)
    assert report.sbuf_peak_bytes == (128 + 512) * 2
    assert report.psum_peak_bytes == 2 * 512 * 4
    assert report.launches == 1
