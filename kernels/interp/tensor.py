"""Tensors of the interpreter: a NumPy view on a buffer-resident root allocation.

Dimensions: axis 0 of an SBUF or PSUM tensor is the partition axis (at most 128); the
other axes are free axes. HBM tensors have no partition limit.

A :class:`Tensor` is either a root (what ``nl.ndarray`` or a kernel argument creates) or a
view of one (slicing, ``nl.ds``, ``.ap``, ``.reshape``). Views share the root's memory, so
an instruction writing a view writes the root. Views keep their root alive, and with it
its SBUF/PSUM allocation (see :mod:`.memory`).
"""

import numpy as np

from .errors import refuse
from .memory import PARTITIONS

SBUF = "sbuf"
PSUM = "psum"
HBM = "hbm"
SHARED_HBM = "shared_hbm"
ON_CHIP = (SBUF, PSUM)
BUFFERS = (SBUF, PSUM, HBM, SHARED_HBM)


class Register:
    """A 32-bit engine register (``nisa.register_alloc``): a value known only at run time.

    It can index a tensor (``t[reg]``, ``t[nl.ds(reg, n)]``); such a view has a dynamic start
    address, which only the DMA descriptor generator resolves, so only ``nisa.dma_copy``
    accepts it. Reading the index beyond the tensor is a run-time error (``oob_mode.error``).
    """

    __slots__ = ("value",)

    def __init__(self, value=0):
        self.value = int(value)

    def __repr__(self):
        return f"Register({self.value})"


class DynSlice:
    """``nl.ds(start, size)``: the index range ``start .. start + size - 1`` of one axis.

    ``start`` may be a :class:`Register` (a dynamic start address).
    """

    __slots__ = ("start", "size", "dynamic")

    def __init__(self, start, size):
        self.dynamic = isinstance(start, Register)
        start = start.value if self.dynamic else start
        if int(size) < 1:
            raise ValueError(f"nl.ds: size must be >= 1, got {size}")
        if int(start) < 0 and not self.dynamic:  # a register's value is checked when the DMA runs
            raise ValueError(f"nl.ds: start must be >= 0, got {start}")
        self.start = int(start)
        self.size = int(size)

    def __repr__(self):
        return f"nl.ds({self.start}, {self.size})"


def check_partitions(op: str, shape, buffer: str, name: str) -> None:
    if buffer in ON_CHIP and len(shape) and shape[0] > PARTITIONS:
        raise refuse(op, f"{buffer.upper()} tensor {name} of shape {tuple(shape)}",
                     f"has partition axis {shape[0]} > {PARTITIONS} partitions")


class Tensor:
    """A tile or HBM tensor (root or view).

    Attributes:
        array: the NumPy view of the data (dtype float32 / bfloat16 / float16 / int*).
        buffer: one of "sbuf", "psum", "hbm", "shared_hbm".
        root: the root tensor owning the memory (``self`` for a root).
        name: a label for error messages and traces.
    """

    __slots__ = ("array", "buffer", "_parent", "name", "uid", "matmul_written", "psum_written", "written", "dynamic",
                 "out_of_bounds", "__weakref__")

    _next_uid = 0

    def __init__(self, array: np.ndarray, buffer: str, root=None, name: str = "tensor"):
        self.array = array
        self.buffer = buffer
        self._parent = root  # None for a root: no self-reference, so refcounting frees tiles at once
        self.name = name
        self.dynamic = False  # indexed with a register: only a DMA can address it
        self.out_of_bounds = False  # a register index outside the tensor (the DMA's oob_mode decides)
        if root is None:
            Tensor._next_uid += 1
            self.uid = Tensor._next_uid
            # PSUM roots: which elements were last written by nc_matmul (accumulation rule)
            self.matmul_written = np.zeros(array.shape, dtype=bool) if buffer == PSUM else None
            self.psum_written = np.zeros(array.shape, dtype=bool) if buffer == PSUM else None
            self.written = False
        else:
            self.uid = root.uid

    # ---- description -------------------------------------------------------------------
    @property
    def root(self):
        return self if self._parent is None else self._parent

    @property
    def shape(self) -> tuple:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def ndim(self) -> int:
        return self.array.ndim

    @property
    def size(self) -> int:
        return self.array.size

    @property
    def itemsize(self) -> int:
        return self.array.itemsize

    def __repr__(self):
        return f"Tensor({self.name}, shape={self.shape}, dtype={self.dtype.name}, buffer={self.buffer})"

    def __len__(self):
        return self.shape[0]

    def element_offset(self) -> int:
        """Index of this view's first element in the root's flat (C-order) storage."""
        base = self.root.array.__array_interface__["data"][0]
        return (self.array.__array_interface__["data"][0] - base) // self.itemsize

    def extent(self) -> tuple:
        """``(uid, lo, hi)``: the flat element range of the root this view can touch."""
        start = self.element_offset()
        lo = hi = start
        for n, stride in zip(self.shape, self.array.strides):
            step = (n - 1) * (stride // self.itemsize)
            if step > 0:
                hi += step
            else:
                lo += step
        return (self.uid, lo, hi)

    def shadow(self, mask: np.ndarray) -> np.ndarray:
        """The view of the root-shaped array ``mask`` matching this view's elements."""
        item = self.itemsize
        return np.ndarray(self.shape, dtype=mask.dtype, buffer=mask, offset=self.element_offset() * mask.itemsize,
                          strides=tuple(s // item * mask.itemsize for s in self.array.strides))

    # ---- views ---------------------------------------------------------------------------
    def _view(self, array: np.ndarray, what: str):
        check_partitions(what, array.shape, self.buffer, self.name)
        view = Tensor(array, self.buffer, self.root, self.name)
        view.dynamic = self.dynamic
        view.out_of_bounds = self.out_of_bounds
        return view

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        ellipses = [i for i, k in enumerate(key) if k is Ellipsis]
        if ellipses:
            at = ellipses[0]
            fill = self.ndim - (len(key) - 1)
            key = key[:at] + (slice(None),) * fill + key[at + 1:]
        normalised = []
        axis = 0
        dynamic = self.dynamic
        out_of_bounds = self.out_of_bounds
        for k in key:
            if axis >= self.ndim:
                raise ValueError(f"index {key!r}: too many indices for {self!r}")
            dim = self.shape[axis]
            if isinstance(k, Register):
                dynamic = True
                if not 0 <= k.value < dim:  # known at run time only: the DMA refuses or skips it
                    out_of_bounds = True
                    k = 0
                else:
                    k = k.value
            elif isinstance(k, DynSlice) and k.dynamic and not (0 <= k.start and k.start + k.size <= dim):
                if k.size > dim:
                    raise ValueError(f"index {k!r} on axis {axis} of {self!r}: size {k.size} > {dim}")
                dynamic = out_of_bounds = True
                k = slice(0, k.size)
            elif isinstance(k, DynSlice):
                dynamic = dynamic or k.dynamic
                if k.start + k.size > dim:
                    raise ValueError(f"index {k!r} on axis {axis} of {self!r}: reaches {k.start + k.size} > size {dim}")
                k = slice(k.start, k.start + k.size)
            elif isinstance(k, slice):
                for bound in (k.start, k.stop):
                    if bound is not None and (int(bound) > dim or int(bound) < -dim):
                        raise ValueError(f"index {k!r} on axis {axis} of {self!r}: bound {bound} outside size {dim}")
                k = slice(*(None if b is None else int(b) for b in (k.start, k.stop, k.step)))
            elif isinstance(k, (int, np.integer)):
                if not -dim <= int(k) < dim:
                    raise ValueError(f"index {int(k)} on axis {axis} of {self!r}: outside size {dim}")
                k = int(k)
            else:
                raise ValueError(
                    f"index {k!r} on axis {axis} of {self!r}: only ints, slices and nl.ds are supported "
                    "(indices are trace-time constants)"
                )
            normalised.append(k)
            axis += 1
        view = self.array[tuple(normalised)]
        if view.size == 0:
            raise ValueError(f"index {key!r} selects no element of {self!r}")
        result = self._view(view, "indexing")
        result.dynamic = dynamic
        result.out_of_bounds = out_of_bounds
        return result

    def __setitem__(self, key, value):
        raise TypeError(
            f"{self!r}: assignment is not an NKI instruction; write tiles with nisa ops "
            "(nisa.tensor_copy, nisa.dma_copy, ...)"
        )

    def reshape(self, shape):
        """A view of the same elements with ``shape`` (the view must be contiguous)."""
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        view = self.array.view()
        try:
            view.shape = shape
        except (AttributeError, ValueError) as error:
            raise ValueError(f"reshape of {self!r} to {shape}: {error}") from None
        return self._view(view, "reshape")

    def ap(self, pattern, offset: int = 0):
        """Strided view: ``pattern = [[stride, count], ...]`` in elements, outermost first.

        Element ``(i0, i1, ...)`` of the view is root element
        ``self.element_offset() + offset + sum(i_k * stride_k)``; like ``as_strided`` with
        bounds checked against the root tensor.
        """
        try:
            strides = tuple(int(p[0]) for p in pattern)
            counts = tuple(int(p[1]) for p in pattern)
        except (TypeError, IndexError):
            raise ValueError(f"ap: pattern must be a list of [stride, count] pairs, got {pattern!r}") from None
        if not counts or min(counts) < 1:
            raise ValueError(f"ap: pattern counts must be >= 1, got {pattern!r}")
        if min(strides) < 0:
            raise ValueError(f"ap: pattern strides must be >= 0, got {pattern!r}")
        start = self.element_offset() + int(offset)
        last = start + sum((c - 1) * s for s, c in zip(strides, counts))
        total = self.root.size
        if start < 0 or last >= total:
            raise ValueError(
                f"ap: pattern {pattern!r} with offset {offset} reaches elements {start}..{last} of {self.root!r}, "
                f"which has {total} elements"
            )
        item = self.itemsize
        view = np.ndarray(counts, dtype=self.dtype, buffer=self.root.array, offset=start * item,
                          strides=tuple(s * item for s in strides))
        return self._view(view, "ap")
