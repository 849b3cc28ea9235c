"""Each nisa instruction against NumPy on hand-made cases."""

import numpy as np
import pytest

from vllm_gdn_neuron.kernels.interp import NkiHardwareError, nisa, nl

from .interp_helpers import BF16, as_bf16, load, randn, run, store

DTYPES = [np.float32, BF16]


def _tol(dtype):
    return dict(rtol=1e-6, atol=1e-5) if np.dtype(dtype) == np.float32 else dict(rtol=0, atol=0)


# ---- nc_matmul ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,m,n", [(128, 128, 512), (96, 40, 72), (1, 1, 1), (7, 128, 3)])
def test_nc_matmul_is_stationary_transposed_times_moving(dtype, k, m, n):
    rng = np.random.default_rng(k * m + n)
    st, mv = randn(rng, (k, m), dtype), randn(rng, (k, n), dtype)

    def body(st, mv):
        acc = nl.ndarray((m, n), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=load(st), moving=load(mv))
        return store(acc)

    out = run(body, st, mv)
    exact = st.astype(np.float64).T @ mv.astype(np.float64)
    np.testing.assert_allclose(out, exact, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_nc_matmul_accumulation_rules():
    rng = np.random.default_rng(0)
    a, b, c, d = (randn(rng, (32, 16)) for _ in range(4))
    ab = a.T @ b
    cd = c.T @ d

    def body(a, b, c, d):
        a, b, c, d = load(a), load(b), load(c), load(d)
        fresh = nl.ndarray((16, 16), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=fresh, stationary=a, moving=b)           # None on fresh: overwrite
        nisa.nc_matmul(dst=fresh, stationary=c, moving=d)           # None after matmul: accumulate
        summed = store(fresh)
        nisa.nc_matmul(dst=fresh, stationary=c, moving=d, accumulate=False)  # explicit restart
        restarted = store(fresh)
        nisa.nc_matmul(dst=fresh, stationary=a, moving=b, accumulate=True)
        explicit = store(fresh)
        nisa.memset(dst=fresh[0:8, :], value=5.0)                   # non-matmul write on half
        nisa.nc_matmul(dst=fresh, stationary=a, moving=b, accumulate=False)  # explicit restart: defined
        overwritten = store(fresh)
        return summed, restarted, explicit, overwritten

    summed, restarted, explicit, overwritten = run(body, a, b, c, d)
    np.testing.assert_allclose(summed, ab + cd, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(restarted, cd, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(explicit, cd + ab, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(overwritten, ab, rtol=1e-5, atol=1e-5)


def test_nc_matmul_implicit_accumulation_onto_a_memset_is_refused_before_writing():
    a = np.ones((4, 4), np.float32)

    def body(a):
        a = load(a)
        acc = nl.ndarray((4, 4), nl.float32, buffer=nl.psum)
        nisa.memset(dst=acc[0:2, :], value=0.0)
        before = acc.array.copy()
        with pytest.raises(NkiHardwareError, match=r"nc_matmul: dst would accumulate \(accumulate=None\) onto PSUM "
                                                   r"elements last written by another instruction"):
            nisa.nc_matmul(dst=acc, stationary=a, moving=a)
        np.testing.assert_array_equal(acc.array, before)

    run(body, a)


@pytest.mark.parametrize("setup", ["fresh", "memset"])
def test_nc_matmul_accumulate_true_onto_non_matmul_data_is_refused_before_writing(setup):
    a = np.ones((4, 4), np.float32)

    def body(a):
        a = load(a)
        acc = nl.ndarray((4, 4), nl.float32, buffer=nl.psum)
        if setup == "memset":
            nisa.memset(dst=acc, value=0.0)
        before = acc.array.copy()
        with pytest.raises(NkiHardwareError, match="nc_matmul: dst accumulate=True"):
            nisa.nc_matmul(dst=acc, stationary=a, moving=a, accumulate=True)
        np.testing.assert_array_equal(acc.array, before)

    run(body, a)


def test_k_tiled_matmul_accumulates_over_partition_chunks_into_split_free_axes():
    rng = np.random.default_rng(3)
    st, mv = randn(rng, (256, 64)), randn(rng, (256, 2, 48))

    def body(st, mv):
        acc = nl.ndarray((64, 2, 48), nl.float32, buffer=nl.psum)
        for k in range(2):
            nisa.nc_matmul(dst=acc, stationary=load(st[k * 128:(k + 1) * 128, :]),
                           moving=load(mv[k * 128:(k + 1) * 128]), accumulate=k > 0)
        return store(acc)

    out = run(body, st, mv)
    np.testing.assert_allclose(out.reshape(64, 96), st.T @ mv.reshape(256, 96), rtol=1e-5, atol=1e-4)


# ---- transposes and copies -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_nc_transpose(dtype):
    x = randn(np.random.default_rng(4), (96, 128), dtype)

    def body(x):
        t = nl.ndarray((128, 96), x.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=t, data=load(x))
        return store(t, nl.float32)

    np.testing.assert_array_equal(run(body, x), x.astype(np.float32).T)


@pytest.mark.parametrize("dtype", [BF16, np.float16])
def test_nc_transpose_into_a_wider_psum_tile_is_refused(dtype):
    def body(x):
        data = load(x)
        t = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
        with pytest.raises(NkiHardwareError, match=r"nc_transpose: dst has dtype float32; a TensorE transpose "
                                                   r"writes the dtype of data"):
            nisa.nc_transpose(dst=t, data=data)

    run(body, np.ones((8, 8), dtype))


@pytest.mark.parametrize("stationary, moving", [(np.float32, BF16), (BF16, np.float32), (np.float16, np.float32)])
def test_nc_matmul_fp32_operand_needs_an_fp32_partner(stationary, moving):
    def body(a, b):
        a, b = load(a), load(b)
        dst = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
        with pytest.raises(NkiHardwareError, match="nc_matmul: stationary and moving are .* an fp32 operand needs "
                                                   "an fp32 partner"):
            nisa.nc_matmul(dst=dst, stationary=a, moving=b)

    run(body, np.ones((8, 8), stationary), np.ones((8, 8), moving))


def test_dma_transpose_of_two_byte_data():
    x = randn(np.random.default_rng(5), (40, 128), BF16)

    def body(x):
        t = nl.ndarray((128, 40), nl.bfloat16)
        nisa.dma_transpose(dst=t, src=x)
        return store(t)

    np.testing.assert_array_equal(run(body, x), x.T)


def test_dma_copy_casts_and_ignores_unit_axes():
    x = randn(np.random.default_rng(6), (1, 8, 16))

    def body(x):
        t = nl.ndarray((8, 16), nl.bfloat16)
        nisa.dma_copy(dst=t, src=x)
        back = nl.ndarray((8, 1, 16), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=back, src=t)
        return back

    np.testing.assert_array_equal(run(body, x).reshape(8, 16), as_bf16(x[0]))


def test_tensor_copy_from_psum_casts():
    x = randn(np.random.default_rng(7), (8, 8))

    def body(x):
        p = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=p, data=load(x))
        t = nl.ndarray((8, 8), nl.bfloat16)
        nisa.tensor_copy(dst=t, src=p)
        return store(t)

    np.testing.assert_array_equal(run(body, x), x.T.astype(BF16))


@pytest.mark.parametrize("buffer", ["sbuf", "psum"])
def test_memset(buffer):
    def body(x):
        t = nl.ndarray((5, 7), nl.float32, buffer=buffer)
        nisa.memset(dst=t, value=-2.5)
        return store(t)

    np.testing.assert_array_equal(run(body, np.zeros(1, np.float32)), np.full((5, 7), -2.5, np.float32))


def test_zeros_is_an_allocation_plus_memset():
    def body(x):
        return store(nl.zeros((3, 4), nl.bfloat16))

    out = run(body, np.zeros(1, np.float32))
    assert out.dtype == BF16 and not out.astype(np.float32).any()


# ---- elementwise ---------------------------------------------------------------------------
BINARY = [
    (nl.add, np.add), (nl.subtract, np.subtract), (nl.multiply, np.multiply), (nl.divide, np.divide),
    (nl.maximum, np.maximum), (nl.minimum, np.minimum),
    (nl.equal, np.equal), (nl.greater_equal, np.greater_equal), (nl.less, np.less),
]


@pytest.mark.parametrize("op,ref", BINARY, ids=lambda o: getattr(o, "name", ""))
@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_tensor(op, ref, dtype):
    rng = np.random.default_rng(8)
    a, b = randn(rng, (16, 24), dtype), randn(rng, (16, 24), dtype)
    b.reshape(-1)[::5] = a.reshape(-1)[::5]  # some equal elements for the comparisons

    def body(a, b):
        out = nl.ndarray(a.shape, nl.float32)
        nisa.tensor_tensor(dst=out, data1=load(a), data2=load(b), op=op)
        return store(out)

    expected = ref(a.astype(np.float32), b.astype(np.float32)).astype(np.float32)
    np.testing.assert_allclose(run(body, a, b), expected, rtol=1e-6)


def test_tensor_tensor_accepts_numpy_ufuncs_and_one_psum_input():
    rng = np.random.default_rng(9)
    a, b = randn(rng, (8, 8)), randn(rng, (8, 8))

    def body(a, b):
        p = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=p, data=load(a))
        out = nl.ndarray((8, 8), nl.float32)
        nisa.tensor_tensor(dst=out, data1=p, data2=load(b), op=np.multiply)
        return store(out)

    np.testing.assert_allclose(run(body, a, b), a.T * b, rtol=1e-6)


@pytest.mark.parametrize("column", [False, True])
def test_tensor_scalar_broadcasts_scalars_and_partition_columns(column):
    rng = np.random.default_rng(10)
    x = randn(rng, (16, 3, 8))
    c0 = randn(rng, (16, 1)) if column else np.float32(0.75)
    c1 = randn(rng, (16, 1)) if column else np.float32(-2.0)

    def body(x, c0, c1):
        operand0 = load(c0) if column else float(c0)
        operand1 = load(c1) if column else float(c1)
        out = nl.ndarray(x.shape, nl.float32)
        nisa.tensor_scalar(dst=out, data=load(x), op0=nl.subtract, operand0=operand0,
                           op1=nl.multiply, operand1=operand1)
        rev = nl.ndarray(x.shape, nl.float32)
        nisa.tensor_scalar(dst=rev, data=load(x), op0=nl.subtract, operand0=operand0, reverse0=True,
                           op1=nl.divide, operand1=operand1, reverse1=True)
        return store(out), store(rev)

    out, rev = run(body, x, c0 if column else float(c0), c1 if column else float(c1))
    b0 = np.asarray(c0, np.float32).reshape(-1, 1, 1) if column else c0
    b1 = np.asarray(c1, np.float32).reshape(-1, 1, 1) if column else c1
    np.testing.assert_allclose(out, (x - b0) * b1, rtol=1e-6)
    np.testing.assert_allclose(rev, b1 / (b0 - x), rtol=1e-5)


def test_scalar_tensor_tensor_and_reciprocal():
    rng = np.random.default_rng(11)
    x, y, c = randn(rng, (8, 12)), randn(rng, (8, 12)), randn(rng, (8, 1))

    def body(x, y, c):
        out = nl.ndarray(x.shape, nl.float32)
        nisa.scalar_tensor_tensor(dst=out, data=load(x), op0=nl.multiply, operand0=load(c),
                                  op1=nl.subtract, operand1=load(y), reverse1=True)
        inv = nl.ndarray(x.shape, nl.float32)
        nisa.reciprocal(dst=inv, data=load(y))
        return store(out), store(inv)

    out, inv = run(body, x, y, c)
    np.testing.assert_allclose(out, y - x * c, rtol=1e-6)
    np.testing.assert_allclose(inv, 1 / y, rtol=1e-6)


ACTIVATIONS = [
    (nl.exp, np.exp), (nl.log, np.log), (nl.tanh, np.tanh),
    (nl.sigmoid, lambda v: 1 / (1 + np.exp(-v))), (nl.silu, lambda v: v / (1 + np.exp(-v))),
    (nl.softplus, lambda v: np.log1p(np.exp(v))), (nl.rsqrt, lambda v: 1 / np.sqrt(v)),
    (nl.copy, lambda v: v), (nl.square, np.square), (nl.relu, lambda v: np.maximum(v, 0)),
]


@pytest.mark.parametrize("op,ref", ACTIVATIONS, ids=lambda o: getattr(o, "name", ""))
def test_activation_applies_scale_and_bias_before_the_function(op, ref):
    rng = np.random.default_rng(12)
    x, bias, scale = randn(rng, (16, 20), scale=3.0), randn(rng, (16, 1)), randn(rng, (16, 1))
    if op in (nl.log, nl.rsqrt):  # keep data * scale + bias in the function's domain
        x, bias, scale = np.abs(x) + 0.5, np.abs(bias), np.abs(scale) + 0.1

    def body(x, bias, scale):
        out = nl.ndarray(x.shape, nl.float32)
        nisa.activation(dst=out, op=op, data=load(x), bias=load(bias), scale=load(scale))
        scalar = nl.ndarray(x.shape, nl.float32)
        nisa.activation(dst=scalar, op=op, data=load(x), scale=0.5)
        return store(out), store(scalar)

    out, scalar = run(body, x, bias, scale)
    np.testing.assert_allclose(out, ref(x.astype(np.float64) * scale + bias), rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(scalar, ref(x.astype(np.float64) * 0.5), rtol=2e-6, atol=1e-6)


def test_sigmoid_and_softplus_are_stable_for_large_arguments():
    x = np.array([[-100.0, -30.0, 0.0, 30.0, 100.0]], np.float32)

    def body(x):
        s, p = nl.ndarray(x.shape, nl.float32), nl.ndarray(x.shape, nl.float32)
        nisa.activation(dst=s, op=nl.sigmoid, data=load(x))
        nisa.activation(dst=p, op=nl.softplus, data=load(x))
        return store(s), store(p)

    s, p = run(body, x)
    assert np.isfinite(s).all() and np.isfinite(p).all()
    np.testing.assert_allclose(s, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(p, np.logaddexp(0, x.astype(np.float64)), rtol=1e-6, atol=1e-37)


# ---- affine_select and iota -----------------------------------------------------------------
def _affine(p, shape, cm, pattern, offset):
    value = np.full((p,) + shape, offset, np.int64) + np.arange(p).reshape((p,) + (1,) * len(shape)) * cm
    for axis, (step, _) in enumerate(pattern):
        idx = np.arange(shape[axis]).reshape([1] + [-1 if i == axis else 1 for i in range(len(shape))])
        value = value + idx * step
    return value


@pytest.mark.parametrize("pattern,cm,offset,cmp,ref", [
    ([[-1, 16]], 1, 0, nl.greater_equal, np.greater_equal),   # causal: keep j <= p (incl. diagonal)
    ([[-1, 16]], 1, -1, nl.greater_equal, np.greater_equal),  # strictly lower: keep j < p
    ([[1, 16]], -1, 0, nl.greater, np.greater),               # strictly upper: keep j > p
    ([[1, 16]], -1, 3, nl.equal, np.equal),                   # one diagonal, shifted by the offset
    ([[-4, 4], [-1, 4]], 1, 2, nl.less, np.less),             # 2-D pattern over split free axes
])
def test_affine_select_patterns_and_offsets(pattern, cm, offset, cmp, ref):
    x = randn(np.random.default_rng(13), (16, 16))
    shape = tuple(num for _, num in pattern)

    def body(x):
        out = nl.ndarray((16,) + shape, nl.float32)
        nisa.affine_select(dst=out, pattern=pattern, channel_multiplier=cm, on_true_tile=load(x).reshape((16,) + shape),
                           on_false_value=-9.0, cmp_op=cmp, offset=offset)
        return store(out)

    keep = ref(_affine(16, shape, cm, pattern, offset), 0)
    expected = np.where(keep, x.reshape((16,) + shape), -9.0)
    np.testing.assert_array_equal(run(body, x), expected)
    if pattern == [[-1, 16]] and offset == 0:
        np.testing.assert_array_equal(keep, np.tril(np.ones((16, 16), bool)))
    if pattern == [[-1, 16]] and offset == -1:
        np.testing.assert_array_equal(keep, np.tril(np.ones((16, 16), bool), -1))


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_iota(dtype):
    def body(x):
        out = nl.ndarray((8, 3, 5), np.dtype(dtype))
        nisa.iota(dst=out, pattern=[[10, 3], [1, 5]], offset=-7, channel_multiplier=100)
        return store(out)

    out = run(body, np.zeros(1, np.float32))
    expected = _affine(8, (3, 5), 100, [[10, 3], [1, 5]], -7)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, expected.astype(dtype))


# ---- tensor_reduce ----------------------------------------------------------------------------
@pytest.mark.parametrize("op,ref", [(nl.add, np.sum), (nl.max, np.max), (nl.minimum, np.min), (nl.multiply, np.prod)],
                         ids=["add", "max", "minimum", "multiply"])
@pytest.mark.parametrize("axis", [1, 2, (1, 2)])
def test_tensor_reduce_over_free_axes(op, ref, axis):
    x = randn(np.random.default_rng(14), (8, 4, 6), scale=0.5) + 1

    def body(x):
        kept = tuple(1 if i in np.atleast_1d(axis) else s for i, s in enumerate(x.shape))
        out = nl.ndarray(kept, nl.float32)
        nisa.tensor_reduce(dst=out, op=op, data=load(x), axis=axis, keepdims=True)
        neg = nl.ndarray(kept, nl.float32)
        nisa.tensor_reduce(dst=neg, op=op, data=load(x), axis=axis, negate=True)
        return store(out), store(neg)

    out, neg = run(body, x)
    expected = ref(x, axis=axis, keepdims=True)
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    np.testing.assert_allclose(neg, -expected, rtol=1e-5)


def test_tensor_reduce_without_keepdims_into_a_column():
    x = randn(np.random.default_rng(15), (8, 32))

    def body(x):
        out = nl.ndarray((8, 1), nl.float32)
        nisa.tensor_reduce(dst=out, op=nl.add, data=load(x), axis=1)
        return store(out)

    np.testing.assert_allclose(run(body, x), x.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


# ---- activation_reduce and tensor_tensor_scan ----------------------------------------------------
def test_activation_reduce_returns_the_activation_and_its_row_reduction():
    rng = np.random.default_rng(16)
    x, bias = randn(rng, (8, 3, 10)), randn(rng, (8, 1))

    def body(x, bias):
        out = nl.ndarray(x.shape, nl.bfloat16)
        total = nl.ndarray((8, 1), nl.float32)
        nisa.activation_reduce(dst=out, op=nl.square, data=load(x), reduce_op=nl.add, reduce_res=total,
                               bias=load(bias), scale=2.0)
        return store(out), store(total)

    out, total = run(body, x, bias)
    squares = (x.astype(np.float64) * 2 + bias.reshape(8, 1, 1)) ** 2
    np.testing.assert_array_equal(out, squares.astype(np.float32).astype(BF16))
    np.testing.assert_allclose(total, squares.reshape(8, -1).sum(1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("initial_column", [False, True])
def test_tensor_tensor_scan_is_a_per_partition_linear_recurrence(initial_column):
    rng = np.random.default_rng(17)
    decay, inputs, init = np.exp(-np.abs(randn(rng, (16, 40)))), randn(rng, (16, 40)), randn(rng, (16, 1))

    def body(decay, inputs, init):
        out = nl.ndarray(decay.shape, nl.float32)
        nisa.tensor_tensor_scan(dst=out, data0=load(decay), data1=load(inputs),
                                initial=load(init) if initial_column else 0.5, op0=nl.multiply, op1=nl.add)
        return store(out)

    out = run(body, decay, inputs, init)
    state = init[:, 0].astype(np.float64) if initial_column else np.full(16, 0.5)
    expected = np.empty((16, 40))
    for i in range(40):  # r_i = decay_i * r_{i-1} + x_i
        state = decay[:, i] * state + inputs[:, i]
        expected[:, i] = state
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_tensor_tensor_scan_reverse_flags_swap_operands():
    a, b = np.full((2, 3), 2.0, np.float32), np.full((2, 3), 10.0, np.float32)

    def body(a, b):
        out = nl.ndarray(a.shape, nl.float32)
        # r_i = b_i - (r_{i-1} - a_i)
        nisa.tensor_tensor_scan(dst=out, data0=load(a), data1=load(b), initial=1.0, op0=nl.subtract,
                                op1=nl.subtract, reverse0=True, reverse1=True)
        return store(out)

    r, expected = 1.0, []
    for _ in range(3):
        r = 10.0 - (r - 2.0)
        expected.append(r)
    np.testing.assert_array_equal(run(body, a, b), np.tile(expected, (2, 1)).astype(np.float32))


def test_matmul_accumulation_state_is_tracked_per_element_through_psum_views():
    rng = np.random.default_rng(18)
    a, b = randn(rng, (16, 8)), randn(rng, (16, 4))

    def body(a, b):
        acc = nl.ndarray((8, 12), nl.float32, buffer=nl.psum)
        st, mv = load(a), load(b)
        for j in range(3):  # three column blocks, each opened fresh
            nisa.nc_matmul(dst=acc[:, j * 4:(j + 1) * 4], stationary=st, moving=mv)
        nisa.nc_matmul(dst=acc[:, 4:8], stationary=st, moving=mv)  # accumulates into the middle block only
        return store(acc)

    out, once = run(body, a, b), a.T @ b
    np.testing.assert_allclose(out, np.concatenate([once, 2 * once, once], axis=1), rtol=1e-5, atol=1e-6)


def test_nc_matmul_onezero_hint_is_checked_and_halves_the_fp32_cost():
    from vllm_gdn_neuron.kernels.interp import cost

    mask = np.triu(np.ones((8, 8), np.float32))
    data = randn(np.random.default_rng(9), (8, 64))

    def body(mask, data):
        mask, data = load(mask), load(data)
        plain = nl.ndarray((8, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=plain, stationary=mask, moving=data)
        hinted = nl.ndarray((8, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=hinted, stationary=mask, moving=data, is_stationary_onezero=True)
        with pytest.raises(NkiHardwareError, match="is_stationary_onezero=True but stationary holds values other"):
            nisa.nc_matmul(dst=hinted, stationary=data[:, 0:8], moving=data, is_stationary_onezero=True)
        return store(plain), store(hinted)

    with cost.record() as recording:
        plain, hinted = run(body, mask, data)
    np.testing.assert_array_equal(plain, hinted)
    matmuls = [i for i in recording.instructions if i.op == "nc_matmul"]
    assert matmuls[1].end_s - matmuls[1].start_s == pytest.approx((matmuls[0].end_s - matmuls[0].start_s) / 2)
