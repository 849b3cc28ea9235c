"""Small tile-level building blocks shared by the NKI kernels (plain functions, traced inline).

Each helper allocates its destination tile, issues one NKI instruction (two for ``transpose``)
and returns the tile, so a kernel reads as a sequence of named tile values. On-chip tiles are
released when their last reference goes (see the interpreter's memory notes), so kernels
rebind names rather than keep PSUM tiles alive.

Conventions: ``[P, F]`` tiles, partition axis first; PSUM results are fp32; ``dtype`` is the
destination dtype of an SBUF result (fp32 unless given).
"""

from .nki_compat import nisa, nl


def sbuf(shape, dtype=nl.float32):
    """A fresh SBUF tile of ``shape``."""
    return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)


def load(src, dtype=None):
    """DMA an HBM view ``src`` into a fresh SBUF tile (casting to ``dtype`` if given)."""
    dst = sbuf(src.shape, src.dtype if dtype is None else dtype)
    nisa.dma_copy(dst=dst, src=src)
    return dst


def store(dst, src):
    """DMA the SBUF tile ``src`` to the HBM view ``dst``."""
    nisa.dma_copy(dst=dst, src=src)


def free_size(tile):
    """Elements per partition of ``tile`` (the product of its free axes)."""
    size = 1
    for n in tile.shape[1:]:
        size *= n
    return size


def matmul(stationary, moving):
    """``stationary[K, M]^T @ moving[K, N]`` into a fresh ``[M, N]`` fp32 PSUM tile (TensorE).

    ``moving`` may have several free axes (a strided view); ``N`` is their product.
    """
    dst = nl.ndarray((stationary.shape[1], free_size(moving)), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst, stationary, moving)
    return dst


def mask_matmul(mask, moving):
    """``mask[K, M]^T @ moving[K, N]`` for a 0/1 ``mask`` (fp32), declared ``is_stationary_onezero``
    (up to twice the fp32 TensorE rate)."""
    dst = nl.ndarray((mask.shape[1], free_size(moving)), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst, mask, moving, is_stationary_onezero=True)
    return dst


def matmul_accumulate(dst, stationary, moving):
    """Accumulate ``stationary^T @ moving`` into the PSUM tile ``dst`` that a matmul just wrote."""
    nisa.nc_matmul(dst, stationary, moving)
    return dst


def copy(src, dtype=nl.float32, engine=None):
    """``src`` (SBUF or PSUM) copied into a fresh SBUF tile of ``dtype`` (VectorE unless ``engine``)."""
    dst = sbuf(src.shape, dtype)
    if engine is None:
        nisa.tensor_copy(dst=dst, src=src)
    else:
        nisa.tensor_copy(dst=dst, src=src, engine=engine)
    return dst


def scaled_copy(src, scale=1.0, dtype=nl.float32):
    """``src * scale`` into a fresh SBUF tile on ScalarE (``scale`` a scalar or ``[P, 1]`` column).

    The ScalarE twin of ``copy`` / a column ``scalar`` multiply, to balance VectorE and ScalarE.
    """
    return activation(src, nl.copy, scale=scale, dtype=dtype)


def gpsimd_scaled(src, column, dtype=nl.float32):
    """``src * column`` (``column`` a ``[P, 1]`` tile or a scalar) into a fresh SBUF tile on GpSimd.

    For SBUF sources only (GpSimd cannot access PSUM): it takes such copies off the busier
    ScalarE / VectorE queues.
    """
    dst = sbuf(src.shape, dtype)
    nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=column, engine=nisa.engine.gpsimd)
    return dst


def transpose(src, dtype=nl.float32):
    """``src[P, F]^T`` as a fresh ``[F, P]`` SBUF tile of ``dtype`` (TensorE transpose, ScalarE evacuation).

    The PSUM result of a TensorE transpose has ``src``'s dtype; the evacuation casts.
    """
    staged = nl.ndarray((src.shape[1], src.shape[0]), dtype=src.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=staged, data=src)
    return scaled_copy(staged, dtype=dtype)


def binary(a, b, op, dtype=nl.float32):
    """Elementwise ``a <op> b`` (VectorE); at most one operand in PSUM."""
    dst = sbuf(a.shape, dtype)
    nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=op)
    return dst


def scalar(data, op0, operand0, dtype=nl.float32, reverse0=False, op1=None, operand1=None):
    """``(data <op0> operand0) <op1> operand1`` with scalar or ``[P, 1]`` column operands."""
    dst = sbuf(data.shape, dtype)
    nisa.tensor_scalar(dst=dst, data=data, op0=op0, operand0=operand0, reverse0=reverse0,
                       op1=op1, operand1=operand1)
    return dst


def activation(data, op, bias=None, scale=1.0, dtype=nl.float32):
    """``op(data * scale + bias)`` (ScalarE); ``bias`` a ``[P, 1]`` column or None."""
    dst = sbuf(data.shape, dtype)
    nisa.activation(dst=dst, op=op, data=data, bias=bias, scale=scale)
    return dst


def filled(shape, value, dtype=nl.float32):
    """A fresh SBUF tile of ``shape`` set to ``value``."""
    dst = sbuf(shape, dtype)
    nisa.memset(dst=dst, value=value)
    return dst


def scalar_tensor(data, op0, operand0, op1, operand1, dtype=nl.float32):
    """``(data <op0> operand0) <op1> operand1`` (VectorE): operand0 scalar or ``[P, 1]``, operand1 a tile."""
    dst = sbuf(data.shape, dtype)
    nisa.scalar_tensor_tensor(dst=dst, data=data, op0=op0, operand0=operand0, op1=op1, operand1=operand1)
    return dst


def reduce(data, op, axis, dtype=nl.float32):
    """``data`` reduced with ``op`` over free ``axis``, the axis kept as size 1 (VectorE)."""
    dst = sbuf(data.shape[0:axis] + (1,) + data.shape[axis + 1:], dtype)
    nisa.tensor_reduce(dst=dst, op=op, data=data, axis=axis, keepdims=True)
    return dst
