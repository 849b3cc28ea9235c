"""``nki.language`` (``nl``) for the interpreter: buffers, dtypes, allocation, indexing, ops.

Allocation: ``nl.ndarray(shape, dtype, buffer=nl.sbuf)`` returns an *uninitialised* tensor,
filled with NaN (float) or the most negative integer so that reading before writing shows
up in results, as garbage would on hardware. SBUF and PSUM tensors count against the
core's capacity while alive (see :mod:`.memory`). Kernel outputs are allocated with
``buffer=nl.shared_hbm`` and returned by the kernel.
"""

import builtins
import weakref

import numpy as np

from . import dtypes as _dtypes
from . import runtime as _runtime
from .memory import PARTITIONS, PSUM_BANK_BYTES
from .ops import (  # noqa: F401 - re-exported operator tokens
    abs, add, copy, divide, equal, exp, gelu_apprx_tanh, greater, greater_equal, less, less_equal,
    log, max, maximum, min, minimum, multiply, negative, not_equal, power, reciprocal, relu,
    rsqrt, sigmoid, silu, softplus, sqrt, square, subtract, tanh,
)
from .tensor import BUFFERS, HBM, ON_CHIP, PSUM, SBUF, SHARED_HBM, DynSlice, Tensor, check_partitions

float32 = _dtypes.float32
bfloat16 = _dtypes.bfloat16
float16 = _dtypes.float16
int32 = _dtypes.int32
int16 = _dtypes.int16
int8 = _dtypes.int8
uint8 = _dtypes.uint8

sbuf = SBUF
psum = PSUM
hbm = HBM
private_hbm = HBM
shared_hbm = SHARED_HBM


class tile_size:  # noqa: N801 - NKI's name
    """Hardware tile limits, as ``nl.tile_size`` documents them."""

    pmax = PARTITIONS
    psum_fmax = PSUM_BANK_BYTES // 4
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512


def ds(start, size) -> DynSlice:
    """Index range ``start .. start + size - 1`` (``t[nl.ds(i * 128, 128)]``)."""
    return DynSlice(start, size)


class NKIObject:
    """Base of every class a kernel uses (the front end accepts no other base)."""


class LoopIndex(int):
    """The iterator of a device loop (``nl.affine_range`` / ``nl.sequential_range``).

    On the device the loop is not unrolled: its index is a loop register, usable in index
    arithmetic (``+``, ``-``, ``*`` with ints, giving another index) and as a tensor index,
    but not as a Python value: comparisons, ``bool()``, ``//`` and ``%`` are refused, as the
    compiler cannot resolve them at trace time. (Indexing a Python list with it cannot be
    caught here - CPython reads an int subclass's value directly - and is equally invalid.)
    """

    def _affine(self, other, result):
        if isinstance(other, bool) or not isinstance(other, int):
            raise TypeError(f"device loop index: arithmetic with {type(other).__name__} is not affine")
        return LoopIndex(result)

    def __add__(self, other):
        return self._affine(other, int(self) + int(other))

    __radd__ = __add__

    def __sub__(self, other):
        return self._affine(other, int(self) - int(other))

    def __rsub__(self, other):
        return self._affine(other, int(other) - int(self))

    def __mul__(self, other):
        if isinstance(other, LoopIndex):
            raise TypeError("device loop index: the product of two loop indices is not affine")
        return self._affine(other, int(self) * int(other))

    __rmul__ = __mul__

    def _refuse(self, *_):
        raise TypeError("device loop index (nl.affine_range / nl.sequential_range) used as a trace-time "
                        "value (comparison, bool, //, %, list index): use range(...) for trace-time loops")

    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __truediv__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __index__ = _refuse

    def __eq__(self, other):
        self._refuse()

    __ne__ = __eq__
    __hash__ = int.__hash__


def _device_loop(kind: str, args):
    execution = _runtime.current(f"nl.{kind}")
    execution.loops.append(0)
    try:
        for i, value in enumerate(builtins.range(*args)):
            execution.loops[-1] = i
            yield LoopIndex(value)
    finally:
        execution.loops.pop()


def affine_range(*args):
    """A device loop whose iterations are independent (the compiler may reorder and pipeline them).

    Interpreted in order; its index is a :class:`LoopIndex`. Only the first iteration counts
    towards the program size (``CostReport.static_instructions``).
    """
    return _device_loop("affine_range", args)


def sequential_range(*args):
    """A device loop whose iterations run in order (a loop-carried dependency is allowed)."""
    return _device_loop("sequential_range", args)


def static_range(*args):
    """Unrolled at trace time: ``range``."""
    return builtins.range(*args)


def _grid_axis(op: str, axis: int):
    """The running launch and ``axis`` checked against its grid (None outside a grid launch)."""
    execution = _runtime.current(op)
    if not execution.grid:
        return None
    if not 0 <= axis < len(execution.grid):
        raise ValueError(f"{op}: axis must be in [0, {len(execution.grid)}), got {axis}")
    return execution


def program_id(axis: int = 0) -> int:
    """Index of the running program along grid ``axis`` (0 outside a grid launch)."""
    execution = _grid_axis("nl.program_id", axis)
    return 0 if execution is None else execution.program_id[axis]


def num_programs(axis: int = 0) -> int:
    """Size of the launch grid along ``axis`` (1 outside a grid launch)."""
    execution = _grid_axis("nl.num_programs", axis)
    return 1 if execution is None else execution.grid[axis]


def program_ndim() -> int:
    """Number of grid axes of the launch."""
    return len(_runtime.current("nl.program_ndim").grid)


def _garbage(shape, dtype) -> np.ndarray:
    if dtype in _dtypes.FLOATS:
        return np.full(shape, np.nan, dtype=dtype)
    return np.full(shape, np.iinfo(dtype).min, dtype=dtype)


def ndarray(shape, dtype, buffer=sbuf, name: str = None) -> Tensor:
    """Allocate a tensor of ``shape`` and ``dtype`` in ``buffer`` (uninitialised).

    Args:
        shape: tuple of ints >= 1; axis 0 is the partition axis for SBUF/PSUM (<= 128).
        dtype: nl.float32, nl.bfloat16, nl.float16, nl.int32 (or int16/int8/uint8).
        buffer: nl.sbuf (default), nl.psum, nl.hbm (kernel scratch) or nl.shared_hbm
            (kernel outputs; in a grid launch every program gets the same tensor).
    """
    execution = _runtime.current("nl.ndarray")
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ValueError(f"nl.ndarray: shape must be a tuple of ints, got {shape!r}") from None
    if not shape or builtins.min(shape) < 1:
        raise ValueError(f"nl.ndarray: shape must be non-empty with sizes >= 1, got {shape}")
    dtype = _dtypes.canonical(dtype, "nl.ndarray: dtype")
    if buffer not in BUFFERS:
        raise ValueError(f"nl.ndarray: buffer must be one of nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm, got {buffer!r}")
    label = name or f"{buffer}{list(shape)}"
    check_partitions("nl.ndarray", shape, buffer, label)
    if buffer == SHARED_HBM and execution.grid:
        return _shared(execution, shape, dtype, label)
    tensor = Tensor(_garbage(shape, dtype), buffer, name=label)
    if buffer in ON_CHIP:
        per_partition = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        memory = execution.memory
        what = f"{label} {dtype.name}"
        if buffer == SBUF:
            memory.allocate_sbuf(per_partition, what)
            weakref.finalize(tensor, memory.release_sbuf, per_partition)
        else:
            bank = memory.allocate_psum(per_partition, what)
            weakref.finalize(tensor, memory.release_psum, per_partition, bank)
    return tensor


def _shared(execution, shape, dtype, label) -> Tensor:
    """The k-th shared_hbm allocation of every program of a grid is one tensor."""
    index = execution.shared_cursor
    execution.shared_cursor += 1
    if index < len(execution.shared):
        tensor = execution.shared[index]
        if tensor.shape != shape or tensor.dtype != dtype:
            raise ValueError(
                f"nl.ndarray: shared_hbm allocation #{index} of program {execution.program_id} is "
                f"{shape} {dtype.name}, but program 0 allocated {tensor.shape} {tensor.dtype.name}"
            )
        return tensor
    tensor = Tensor(_garbage(shape, dtype), SHARED_HBM, name=label)
    execution.shared.append(tensor)
    return tensor


def zeros(shape, dtype, buffer=sbuf, name: str = None) -> Tensor:
    """``nl.ndarray`` followed by a ``nisa.memset`` to 0 (one recorded instruction)."""
    from . import isa

    tensor = ndarray(shape, dtype, buffer=buffer, name=name)
    if buffer in ON_CHIP:
        isa.memset(tensor, 0)
    else:
        tensor.array[...] = 0
    return tensor
