"""Tensors, views, dtypes and nki.jit calling conventions of the interpreter."""

import numpy as np
import pytest
import torch

from vllm_gdn_neuron.kernels.interp import NkiHardwareError, nisa, nki, nl

from .interp_helpers import BF16, as_bf16, load, randn, run, store


def test_slices_and_ds_views_write_through_to_the_parent_tile():
    x = np.arange(4 * 12, dtype=np.float32).reshape(4, 12)

    def body(x):
        tile = load(x)
        part = tile[1:3, nl.ds(4, 6)]
        nisa.memset(dst=part, value=-1.0)
        nisa.memset(dst=tile[0, 2:3], value=7.0)
        return store(tile)

    out = run(body, x)
    expected = x.copy()
    expected[1:3, 4:10] = -1.0
    expected[0, 2] = 7.0
    np.testing.assert_array_equal(out, expected)


def test_ap_is_a_strided_view_of_the_root_that_writes_through():
    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)

    def body(x):
        tile = load(x)
        # every second column of rows 0..7, starting at column 1: stride 16 per partition, 2 per element
        odd = tile.ap([[16, 8], [2, 8]], offset=1)
        scaled = nl.ndarray((8, 8), nl.float32)
        nisa.tensor_scalar(dst=scaled, data=odd, op0=nl.multiply, operand0=10.0)
        nisa.tensor_copy(dst=odd, src=scaled)
        return store(tile)

    out = run(body, x)
    expected = x.copy()
    expected[:, 1::2] *= 10
    np.testing.assert_array_equal(out, expected)


def test_ap_offset_is_relative_to_the_view_and_bounds_are_checked():
    x = np.arange(4 * 8, dtype=np.float32).reshape(4, 8)

    def body(x):
        tile = load(x)
        row2 = tile[2:4, :]
        first_two = row2.ap([[8, 2], [1, 2]], offset=3)  # rows 2, 3; columns 3, 4
        out = nl.ndarray((2, 2), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=first_two)
        with pytest.raises(ValueError, match="ap: pattern"):
            row2.ap([[8, 3], [1, 2]])
        return out

    np.testing.assert_array_equal(run(body, x), x[2:4, 3:5])


def test_reshape_views_write_through_and_non_contiguous_reshape_is_refused():
    x = np.arange(4 * 8, dtype=np.float32).reshape(4, 8)

    def body(x):
        tile = load(x)
        flat = tile.reshape((4, 2, 4))
        nisa.memset(dst=flat[:, 1, :], value=0.0)
        with pytest.raises(ValueError, match="reshape"):
            tile[:, 0:4].reshape((16,))
        return store(tile)

    expected = x.copy()
    expected[:, 4:] = 0
    np.testing.assert_array_equal(run(body, x), expected)


def test_bf16_tiles_round_to_nearest_even_on_store_and_math_is_fp32():
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7 in bf16: rounds to even (1.0)
    x = np.array([[1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.14159265, 1e-3]], dtype=np.float32)

    def body(x):
        tile = load(x, dtype=nl.bfloat16)
        doubled = nl.ndarray(x.shape, nl.float32)
        nisa.tensor_tensor(dst=doubled, data1=tile, data2=tile, op=nl.add)
        return store(tile, nl.float32), store(doubled)

    rounded, doubled = run(body, x)
    np.testing.assert_array_equal(rounded, as_bf16(x))
    assert rounded[0, 0] == 1.0 and rounded[0, 1] == 1.0 + 2.0**-6
    np.testing.assert_array_equal(doubled, 2 * as_bf16(x))


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32])
def test_narrow_dtypes_round_through_fp32_math(dtype):
    rng = np.random.default_rng(1)
    x = randn(rng, (16, 32))

    def body(x):
        tile = load(x)
        narrow = nl.ndarray(x.shape, np.dtype(dtype))
        nisa.activation(dst=narrow, op=nl.exp, data=tile)
        return store(narrow)

    out = run(body, x)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, np.exp(x).astype(dtype))


def test_fresh_tiles_are_uninitialised_nan():
    def body(x):
        tile = nl.ndarray((4, 4), nl.float32)
        return store(tile)

    assert np.isnan(run(body, np.zeros(1, np.float32))).all()


def test_assignment_and_dynamic_indices_are_refused():
    def body(x):
        tile = load(x)
        with pytest.raises(TypeError, match="not an NKI instruction"):
            tile[0, 0] = 1.0
        with pytest.raises(ValueError, match="only ints, slices and nl.ds"):
            tile[np.array([0, 1])]
        with pytest.raises(ValueError, match="outside size 4"):
            tile[:, 2:9]
        with pytest.raises(ValueError, match="reaches 6 > size 4"):
            tile[nl.ds(2, 4)]
        return store(tile)

    run(body, np.zeros((4, 4), np.float32))


def test_calls_outside_a_kernel_are_refused():
    with pytest.raises(RuntimeError, match="inside a running @nki.jit kernel"):
        nl.ndarray((4, 4), nl.float32)


def test_torch_in_torch_out_with_bf16():
    x = torch.randn(8, 16).to(torch.bfloat16)

    def body(x):
        tile = load(x)
        out_tile = nl.ndarray(x.shape, nl.bfloat16)
        nisa.tensor_scalar(dst=out_tile, data=tile, op0=nl.multiply, operand0=2.0)
        return store(out_tile)

    out = run(body, x)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, x * 2, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["numpy", "torch", "torch_bf16", "torch_strided"])
def test_an_input_written_by_the_kernel_is_updated_in_place_and_returned_as_itself(kind):
    base = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    if kind == "numpy":
        state = base.copy()
    elif kind == "torch":
        state = torch.from_numpy(base.copy())
    elif kind == "torch_bf16":
        state = torch.from_numpy(base.copy()).to(torch.bfloat16)
    else:
        state = torch.from_numpy(base.T.copy()).t()  # non-contiguous view of a bigger buffer
    keep = state

    def body(state):
        tile = load(state)
        nisa.tensor_scalar(dst=tile, data=tile, op0=nl.add, operand0=1.0)
        nisa.dma_copy(dst=state, src=tile)
        return state

    out = run(body, state)
    assert out is keep
    np.testing.assert_array_equal(np.asarray(torch.as_tensor(out).float()), base + 1)


def test_grid_launch_gives_program_ids_and_shares_outputs():
    x = np.arange(6 * 4, dtype=np.float32).reshape(2, 3, 4)

    def body(x):
        i, j = nl.program_id(0), nl.program_id(1)
        assert (nl.num_programs(0), nl.num_programs(1), nl.program_ndim()) == (2, 3, 2)
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        tile = load(x[i, j:j + 1, :])
        nisa.tensor_scalar(dst=tile, data=tile, op0=nl.add, operand0=float(100 * i + 10 * j))
        nisa.dma_copy(dst=out[i, j:j + 1, :], src=tile)
        return out

    out = nki.jit(body)[2, 3](x)
    expected = x + (100 * np.arange(2)[:, None, None] + 10 * np.arange(3)[None, :, None])
    np.testing.assert_array_equal(out, expected)


def test_trace_time_constants_pass_through_and_tuples_come_back():
    x = np.ones((2, 3), np.float32)

    def body(x, factor, name):
        assert name == "scale" and factor == 3
        tile = load(x)
        nisa.tensor_scalar(dst=tile, data=tile, op0=nl.multiply, operand0=float(factor))
        return store(tile), store(tile)

    a, b = run(body, x, factor=3, name="scale")
    np.testing.assert_array_equal(a, 3 * x)
    np.testing.assert_array_equal(b, 3 * x)


def test_returning_an_on_chip_tile_is_refused():
    def body(x):
        return load(x)

    with pytest.raises(ValueError, match="outputs must live in HBM"):
        run(body, np.zeros((2, 2), np.float32))


def test_unsupported_argument_dtype_is_refused():
    with pytest.raises(ValueError, match="dtype"):
        run(lambda x: None, np.zeros(3, np.float64))


def test_partition_axis_limit_applies_to_on_chip_tensors_only():
    def body(x):
        nl.ndarray((129, 4), nl.float32, buffer=nl.hbm)  # HBM: no partition limit
        with pytest.raises(NkiHardwareError, match="partition axis 129 > 128"):
            nl.ndarray((129, 4), nl.float32)
        with pytest.raises(NkiHardwareError, match="partition axis 129 > 128"):
            nl.ndarray((129, 4), nl.float32, buffer=nl.psum)
        tile = nl.ndarray((128, 258), nl.float32)
        with pytest.raises(NkiHardwareError, match="partition axis 258 > 128"):
            tile.reshape((258, 128))

    run(body, np.zeros(1, np.float32))


def test_jit_with_options_and_a_kernel_calling_another_kernel_inline():
    @nki.jit(platform_target="trn2")
    def double(tile):
        nisa.tensor_scalar(dst=tile, data=tile, op0=nl.multiply, operand0=2.0)
        return tile

    @nki.jit
    def outer(x):
        tile = load(x)
        double(tile)  # inside a running kernel: the body runs inline on the tile
        return store(tile)

    assert double.options == {"platform_target": "trn2"}
    np.testing.assert_array_equal(outer(np.ones((2, 2), np.float32)), np.full((2, 2), 2.0, np.float32))


def test_grid_programs_must_allocate_the_same_shared_outputs():
    def body(x):
        n = 4 if nl.program_id(0) == 0 else 5
        out = nl.ndarray((n,), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x[0:n])
        return out

    with pytest.raises(ValueError, match=r"shared_hbm allocation #0 of program \(1,\) is \(5,\) float32, "
                                         r"but program 0 allocated \(4,\) float32"):
        nki.jit(body)[2](np.zeros(8, np.float32))


def test_grid_must_be_positive_ints():
    kernel = nki.jit(lambda x: None)
    with pytest.raises(ValueError, match="grid sizes must be >= 1"):
        kernel[0]
    with pytest.raises(ValueError, match="grid must be an int or a tuple of ints"):
        kernel["a"]
