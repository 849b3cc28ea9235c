"""Each hardware refusal raises before any write, naming the op, the operand and the limit."""

import numpy as np
import pytest

from vllm_gdn_neuron.kernels.interp import NkiCapacityError, NkiHardwareError, nisa, nl
from vllm_gdn_neuron.kernels.interp.tensor import Tensor

from .interp_helpers import BF16, run


def _refused(build, match):
    """Run ``build`` inside a kernel: it returns (dst, instruction thunk); check the refusal."""

    def body(x):
        dst, instruction = build()
        before = dst.array.copy()
        with pytest.raises(NkiHardwareError, match=match):
            instruction()
        assert dst.array.tobytes() == before.tobytes()  # nothing written

    run(body, np.zeros(1, np.float32))


def _unallocated(shape, buffer):
    """A tile that bypasses nl.ndarray's own checks, to reach an instruction's checks."""
    return Tensor(np.ones(shape, np.float32), buffer)


def _tile(shape, dtype=nl.float32, buffer=nl.sbuf):
    t = nl.ndarray(shape, dtype, buffer=buffer)
    if buffer in (nl.sbuf, nl.psum):
        nisa.memset(dst=t, value=1.0)
    return t


@pytest.mark.parametrize("k,m,n,match", [
    (129, 64, 64, r"nc_matmul: stationary contraction \(partition\) size 129 > 128"),
    (128, 129, 64, r"nc_matmul: stationary free size 129 > 128"),
    (128, 64, 513, r"nc_matmul: moving free size 513 > 512"),
])
def test_matmul_shape_limits(k, m, n, match):
    def build():
        dst = _unallocated((m, n), nl.psum)
        return dst, lambda: nisa.nc_matmul(dst=dst, stationary=_unallocated((k, m), nl.sbuf),
                                           moving=_unallocated((k, n), nl.sbuf))

    _refused(build, match)


def test_matmul_operands_must_be_in_sbuf_and_dst_in_fp32_psum():
    def build_dst_sbuf():
        dst = _tile((8, 8))
        return dst, lambda: nisa.nc_matmul(dst=dst, stationary=_tile((8, 8)), moving=_tile((8, 8)))

    def build_moving_psum():
        dst = _tile((8, 8), buffer=nl.psum)
        return dst, lambda: nisa.nc_matmul(dst=dst, stationary=_tile((8, 8)), moving=_tile((8, 8), buffer=nl.psum))

    def build_bf16_dst():
        dst = _tile((8, 8), nl.bfloat16, buffer=nl.psum)
        return dst, lambda: nisa.nc_matmul(dst=dst, stationary=_tile((8, 8)), moving=_tile((8, 8)))

    _refused(build_dst_sbuf, r"nc_matmul: dst .* is in SBUF; it must be in PSUM")
    _refused(build_moving_psum, r"nc_matmul: moving .* is in PSUM; it must be in SBUF")
    def build_int_operand():
        dst = _tile((8, 8), buffer=nl.psum)
        return dst, lambda: nisa.nc_matmul(dst=dst, stationary=_tile((8, 8), nl.int32), moving=_tile((8, 8)))

    _refused(build_bf16_dst, r"nc_matmul: dst has dtype bfloat16; matmul results are float32 in PSUM")
    _refused(build_int_operand, r"nc_matmul: stationary has dtype int32; TensorE takes float32, bfloat16 or float16")


def test_psum_tile_wider_than_one_bank_is_refused():
    def body(x):
        nl.ndarray((128, 512), nl.float32, buffer=nl.psum)  # exactly one bank: fine
        with pytest.raises(NkiHardwareError, match=r"PSUM tile .* needs 2052 bytes per partition; .* 2048-byte bank"):
            nl.ndarray((128, 513), nl.float32, buffer=nl.psum)
        with pytest.raises(NkiHardwareError, match="2048-byte bank"):
            nl.ndarray((128, 2, 513), nl.bfloat16, buffer=nl.psum)

    run(body, np.zeros(1, np.float32))


def test_dma_copy_cannot_touch_psum():
    def build_from():
        dst = _tile((8, 8))
        return dst, lambda: nisa.dma_copy(dst=dst, src=_tile((8, 8), buffer=nl.psum))

    def build_to():
        dst = _tile((8, 8), buffer=nl.psum)
        return dst, lambda: nisa.dma_copy(dst=dst, src=_tile((8, 8)))

    _refused(build_from, r"dma_copy: src .* is in PSUM; it must be in SBUF or HBM or SHARED_HBM")
    _refused(build_to, r"dma_copy: dst .* is in PSUM")


def test_tensor_tensor_with_both_inputs_in_psum_is_refused():
    def build():
        dst = _tile((8, 8))
        a, b = _tile((8, 8), buffer=nl.psum), _tile((8, 8), buffer=nl.psum)
        return dst, lambda: nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=nl.add)

    _refused(build, r"tensor_tensor: data1 and data2 are both in PSUM")


@pytest.mark.parametrize("dtype", [nl.float32, nl.int32])
def test_dma_transpose_of_a_four_byte_dtype_is_refused(dtype):
    def build():
        dst = _tile((8, 4), dtype)
        return dst, lambda: nisa.dma_transpose(dst=dst, src=_tile((4, 8), dtype))

    _refused(build, rf"dma_transpose: src has dtype {np.dtype(dtype).name} \(4 bytes\); .* 2-byte dtypes only")


def test_dma_transpose_limits_and_dst_buffer():
    def build_wide():
        dst = _unallocated((129, 4), nl.sbuf)
        dst.array = dst.array.astype(BF16)
        return dst, lambda: nisa.dma_transpose(dst=dst, src=nl.ndarray((4, 129), nl.bfloat16, buffer=nl.hbm))

    def build_hbm_dst():
        dst = nl.ndarray((8, 4), nl.bfloat16, buffer=nl.hbm)
        return dst, lambda: nisa.dma_transpose(dst=dst, src=_tile((4, 8), nl.bfloat16))

    _refused(build_wide, r"dma_transpose: src last axis 129 > 128")
    _refused(build_hbm_dst, r"dma_transpose: dst .* is in HBM; it must be in SBUF")


def test_transpose_and_reduce_limits():
    def build_transpose():
        dst = _unallocated((129, 8), nl.psum)
        return dst, lambda: nisa.nc_transpose(dst=dst, data=_tile((8, 129)))

    def build_reduce():
        dst = _tile((1, 8))
        return dst, lambda: nisa.tensor_reduce(dst=dst, op=nl.add, data=_tile((8, 8)), axis=0)

    _refused(build_transpose, r"nc_transpose: data free size 129 > 128")
    _refused(build_reduce, r"tensor_reduce: axis 0 includes the partition axis")


def test_sbuf_over_capacity_reports_the_peak():
    def body(x):
        keep = [nl.ndarray((128, 16 * 1024), nl.float32) for _ in range(2)]  # 2 x 64 KiB per partition
        scratch = nl.ndarray((128, 8 * 1024), nl.float32)                  # +32 KiB: peak 160 KiB
        del scratch                                                          # freed at once
        with pytest.raises(NkiCapacityError, match=r"SBUF over capacity .* live SBUF would be 208 KiB per partition, "
                                                   r"limit 192 KiB per partition .* peak so far 160 KiB"):
            nl.ndarray((128, 40 * 1024), nl.bfloat16)                       # 128 + 80 = 208 KiB
        del keep

    run(body, np.zeros(1, np.float32))


def test_sbuf_capacity_is_per_partition_whatever_the_partition_count():
    def body(x):
        tiles = [nl.ndarray((1, 48 * 1024), nl.float32) for _ in range(4)]  # 4 x 192 KiB would not fit
        del tiles

    with pytest.raises(NkiCapacityError, match="SBUF over capacity"):
        run(body, np.zeros(1, np.float32))


def test_psum_holds_eight_full_banks_and_frees_tiles_when_dropped():
    def body(x):
        banks = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        with pytest.raises(NkiCapacityError, match=r"PSUM over capacity .* all 8 banks .* peak so far 16 KiB"):
            nl.ndarray((128, 1), nl.float32, buffer=nl.psum)
        banks.pop()
        small = [nl.ndarray((128, 128), nl.float32, buffer=nl.psum) for _ in range(4)]  # 4 x 512 B share the freed bank
        with pytest.raises(NkiCapacityError):
            nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
        del small, banks

    run(body, np.zeros(1, np.float32))


def test_views_keep_their_tile_allocated():
    def body(x):
        view = nl.ndarray((128, 40 * 1024), nl.float32)[:, 0:8]  # root dropped, view alive: 160 KiB live
        with pytest.raises(NkiCapacityError, match="SBUF over capacity"):
            nl.ndarray((128, 16 * 1024), nl.float32)
        del view
        nl.ndarray((128, 16 * 1024), nl.float32)

    run(body, np.zeros(1, np.float32))


def test_operands_of_the_wrong_kind_are_refused_with_a_clear_error():
    def body(x):
        t = _tile((8, 8))
        with pytest.raises(ValueError, match="tensor_scalar: operand0 must be a scalar or a \\[8, 1\\] tile"):
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=_tile((8, 2)))
        with pytest.raises(ValueError, match="tensor_tensor: op=nl.exp is not a binary operator"):
            nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.exp)
        with pytest.raises(ValueError, match="activation: op=nl.add is not a unary operator"):
            nisa.activation(dst=t, op=nl.add, data=t)
        with pytest.raises(ValueError, match="tensor_copy: src shape \\(8, 4\\) does not match dst shape"):
            nisa.tensor_copy(dst=t, src=t[:, 0:4])
        with pytest.raises(ValueError, match="nc_matmul: dst must be an NKI tensor"):
            nisa.nc_matmul(dst=np.zeros((8, 8)), stationary=t, moving=t)
        with pytest.raises(ValueError, match="affine_select: pattern .* covers 4 elements per partition, dst has 8"):
            nisa.affine_select(dst=t, pattern=[[1, 4]], channel_multiplier=0, on_true_tile=t, on_false_value=0.0)
        with pytest.raises(ValueError, match="nl.ndarray: dtype: expected one of"):
            nl.ndarray((8, 8), np.float64)
        with pytest.raises(ValueError, match="nl.ndarray: buffer must be one of"):
            nl.ndarray((8, 8), nl.float32, buffer="dram")

    run(body, np.zeros(1, np.float32))


def test_gpsimd_instructions_cannot_access_psum():
    def build_select():
        dst = _tile((8, 8))
        src = _tile((8, 8), buffer=nl.psum)
        return dst, lambda: nisa.affine_select(dst=dst, pattern=[[1, 8]], channel_multiplier=0, on_true_tile=src,
                                               on_false_value=0.0)

    def build_copy():
        dst = _tile((8, 8))
        return dst, lambda: nisa.tensor_copy(dst=dst, src=_tile((8, 8), buffer=nl.psum), engine=nisa.engine.gpsimd)

    def build_memset():
        dst = _tile((8, 8), buffer=nl.psum)
        return dst, lambda: nisa.memset(dst=dst, value=0.0, engine=nisa.engine.gpsimd)

    _refused(build_select, r"affine_select: on_true_tile .* is in PSUM; it must be in SBUF")
    _refused(build_copy, r"tensor_copy: operand .* is in PSUM; the GpSimd engine cannot access PSUM")
    _refused(build_memset, r"memset: operand .* is in PSUM; the GpSimd engine cannot access PSUM")


def test_scan_and_scalar_tensor_tensor_with_both_inputs_in_psum_are_refused():
    def build_scan():
        dst = _tile((8, 8))
        a, b = _tile((8, 8), buffer=nl.psum), _tile((8, 8), buffer=nl.psum)
        return dst, lambda: nisa.tensor_tensor_scan(dst=dst, data0=a, data1=b, initial=0.0, op0=nl.multiply,
                                                    op1=nl.add)

    def build_stt():
        dst = _tile((8, 8))
        a, b = _tile((8, 8), buffer=nl.psum), _tile((8, 8), buffer=nl.psum)
        return dst, lambda: nisa.scalar_tensor_tensor(dst=dst, data=a, op0=nl.add, operand0=1.0, op1=nl.add,
                                                      operand1=b)

    _refused(build_scan, r"tensor_tensor_scan: data0 and data1 are both in PSUM")
    _refused(build_stt, r"scalar_tensor_tensor: data and operand1 are both in PSUM")
