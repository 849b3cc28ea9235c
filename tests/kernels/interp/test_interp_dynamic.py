"""Run-time addressing: registers as DMA addresses (and nowhere else), oob modes, device loops."""

import numpy as np
import pytest

from vllm_gdn_neuron.kernels.interp import NkiHardwareError, cost, nisa, nki, nl

from .interp_helpers import load, run, store


def _register(index_tile, column=0):
    reg = nisa.register_alloc(0)
    nisa.register_load(reg, index_tile[0:1, column:column + 1])
    return reg


def test_a_register_addresses_an_hbm_row_for_dma():
    cache = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    slots = np.array([[3, 1]], np.int32)

    def body(cache, slots):
        index = load(slots)
        rows = []
        for i in range(2):
            rows.append(store(load(cache[_register(index, i)].reshape((1, 3)))))
        return rows[0], rows[1]

    first, second = run(body, cache, slots)
    np.testing.assert_array_equal(first[0], cache[3])
    np.testing.assert_array_equal(second[0], cache[1])


def test_dynamic_views_are_refused_outside_dma():
    def body(x, slots):
        reg = _register(load(slots))
        tile = load(x)
        with pytest.raises(NkiHardwareError, match=r"tensor_copy: src .* is indexed with a register .* only "
                                                   r"nisa.dma_copy"):
            nisa.tensor_copy(dst=nl.ndarray((4, 2), nl.float32), src=tile[:, nl.ds(reg, 2)])

    run(body, np.zeros((4, 8), np.float32), np.array([[1]], np.int32))


def test_out_of_bounds_register_addresses_raise_or_are_skipped():
    def body(x, slots):
        reg = _register(load(slots))
        dst = nl.ndarray((1, 4), nl.float32)
        nisa.memset(dst=dst, value=7.0)
        with pytest.raises(NkiHardwareError, match="dma_copy: src has a register address outside its tensor"):
            nisa.dma_copy(dst=dst, src=x[reg].reshape((1, 4)))
        nisa.dma_copy(dst=dst, src=x[reg].reshape((1, 4)), oob_mode=nisa.oob_mode.skip)
        return store(dst)

    out = run(body, np.zeros((3, 4), np.float32), np.array([[5]], np.int32))
    np.testing.assert_array_equal(out, np.full((1, 4), 7.0))  # skipped: nothing written


def test_register_load_takes_one_integer_element():
    def body(x):
        tile = load(x)
        with pytest.raises(NkiHardwareError, match="register_load: src has dtype float32"):
            nisa.register_load(nisa.register_alloc(0), tile[0:1, 0:1])

    run(body, np.zeros((2, 2), np.float32))


def test_device_loop_indices_are_affine_and_not_trace_time_values():
    def body(x):
        total = []
        for i in nl.affine_range(3):
            row = load(x[i * 2 + 1].reshape((1, 4)))  # affine arithmetic is an index
            total.append(store(row))
            with pytest.raises(TypeError, match="device loop index"):
                bool(i < 2)
            with pytest.raises(TypeError, match="not affine"):
                i * i
        return total[0], total[2]

    first, last = run(body, np.arange(32, dtype=np.float32).reshape(8, 4))
    np.testing.assert_array_equal(first[0], np.arange(4, 8))
    np.testing.assert_array_equal(last[0], np.arange(20, 24))


def test_device_loops_count_once_in_the_program_size():
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        for i in nl.sequential_range(4):
            tile = nl.ndarray((1, 4), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile, src=x[i].reshape((1, 4)))
            nisa.dma_copy(dst=out[i].reshape((1, 4)), src=tile)
        return out

    with cost.record() as recording:
        kernel(np.ones((4, 4), np.float32))
    report = recording.report()
    assert report.instructions == 8 and report.static_instructions == 2
