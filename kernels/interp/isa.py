"""``nki.isa`` (``nisa``) for the interpreter: one eager NumPy call per instruction.

Every instruction takes its destination first (``dst=``), checks the operands against the
trn2 limits (raising :class:`.errors.NkiHardwareError` naming op, operand and limit) before
touching any data, computes in float32 and stores into ``dst`` with rounding to its dtype.
When a cost recorder is active the instruction is also recorded (see :mod:`.cost`).

PSUM accumulation rule of ``nc_matmul`` (the interpreter's model of the hardware):
    * ``accumulate=False``: ``dst = stationary^T @ moving``;
    * ``accumulate=True``: ``dst += stationary^T @ moving``; every element of ``dst`` must
      hold a previous ``nc_matmul`` result (accumulating onto memory written by another
      instruction, or never written, is undefined on NeuronCore-v3 and refused here);
    * ``accumulate=None`` (default): element by element, accumulate where the element was
      last written by ``nc_matmul`` and overwrite where it was freshly allocated; refused
      where any element was last written by another instruction (undefined on
      NeuronCore-v2/v3). Pass ``accumulate`` explicitly in loops that reuse one PSUM tile
      for several accumulation groups.
"""

import numpy as np

from . import dtypes as _dtypes
from . import ops as _ops
from . import runtime as _runtime
from .errors import refuse
from .tensor import HBM, ON_CHIP, PSUM, SBUF, SHARED_HBM, Register, Tensor

MATMUL_K_MAX = 128
MATMUL_M_MAX = 128
MATMUL_N_MAX = 512
TRANSPOSE_MAX = 128
HBM_BUFFERS = (HBM, SHARED_HBM)


class oob_mode:  # noqa: N801 - NKI's name
    """What a DMA with a dynamic (register) address does when the address falls outside the tensor."""

    error = "error"
    skip = "skip"


class engine:  # noqa: N801 - NKI's name
    """Engine selectors for instructions that can run on several engines."""

    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"
    unknown = "vector"


_ENGINES = ("vector", "scalar", "gpsimd")


# ---- operand checks -----------------------------------------------------------------------
def _operand(op: str, name: str, value, buffers) -> Tensor:
    if not isinstance(value, Tensor):
        raise ValueError(f"{op}: {name} must be an NKI tensor (nl.ndarray or a view), got {type(value).__name__}")
    if value.buffer not in buffers:
        allowed = " or ".join(b.upper() for b in buffers)
        raise refuse(op, f"{name} ({value.name})", f"is in {value.buffer.upper()}; it must be in {allowed}")
    if value.dynamic and op != "nisa.dma_copy":
        raise refuse(op, f"{name} ({value.name})", "is indexed with a register (a dynamic start address); "
                                                   "only nisa.dma_copy (the DMA descriptor generator) resolves one")
    return value


def _free_size(t: Tensor) -> int:
    return t.size // t.shape[0]


def _same_layout(op: str, dst: Tensor, name: str, src: Tensor) -> None:
    """``src`` must have ``dst``'s partition count and elements per partition."""
    if src.shape[0] != dst.shape[0] or src.size != dst.size:
        raise ValueError(
            f"{op}: {name} shape {src.shape} does not match dst shape {dst.shape} "
            "(same partitions and elements per partition required)"
        )


def _column(op: str, name: str, value, data: Tensor):
    """A scalar operand, or a [P, 1] tile broadcast along the free axes of ``data``."""
    if isinstance(value, Tensor):
        _operand(op, name, value, ON_CHIP)
        if value.shape[0] != data.shape[0] or value.size != value.shape[0]:
            raise ValueError(f"{op}: {name} must be a scalar or a [{data.shape[0]}, 1] tile, got shape {value.shape}")
        return _dtypes.engine_view(value.array).reshape((data.shape[0],) + (1,) * (data.ndim - 1))
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return np.float32(value)
    raise ValueError(f"{op}: {name} must be a scalar or a [P, 1] tile, got {type(value).__name__}")


def _engine(op: str, selected, *tiles) -> str:
    """The engine an instruction runs on (VectorE unless ``engine=`` says otherwise).

    GpSimd cannot access PSUM: a GpSimd instruction with a PSUM operand is refused.
    """
    chosen = "vector" if selected is None else selected
    if chosen not in _ENGINES:
        raise ValueError(f"{op}: engine must be one of nisa.engine.vector/scalar/gpsimd, got {selected!r}")
    if chosen == "gpsimd":
        for t in tiles:
            if isinstance(t, Tensor) and t.buffer == PSUM:
                raise refuse(op, f"operand {t.name}", "is in PSUM; the GpSimd engine cannot access PSUM")
    return chosen


# ---- store and record -----------------------------------------------------------------------
def _store(dst: Tensor, value: np.ndarray, by_matmul: bool = False) -> None:
    """Write ``value`` (float32, dst's element count) into ``dst``, rounding to dst's dtype."""
    with np.errstate(invalid="ignore", over="ignore"):
        np.copyto(dst.array, np.reshape(value, dst.shape), casting="unsafe")
    root = dst.root
    root.written = True
    if root.matmul_written is not None:
        dst.shadow(root.matmul_written)[...] = by_matmul
        dst.shadow(root.psum_written)[...] = True


def _record(execution, engine_name: str, op: str, dst: Tensor, inputs, **work) -> None:
    recorder = execution.recorder
    if recorder is not None:
        # VectorE's 2x rate needs 2-byte data streams ([P, 1] scalar columns do not count)
        streams = [t for t in inputs if isinstance(t, Tensor) and t.size > t.shape[0]] + [dst]
        work.setdefault("narrow", all(t.itemsize == 2 for t in streams))
        recorder.add(engine_name, op, dst, [t for t in inputs if isinstance(t, Tensor)], execution.program_id, work,
                     static=execution.in_program_body)


def _read(t: Tensor) -> np.ndarray:
    return _dtypes.engine_view(t.array)


# ---- TensorE ------------------------------------------------------------------------------
def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, accumulate=None,
              name=None):
    """``dst[M, N] (+)= stationary[K, M]^T @ moving[K, N]`` on TensorE.

    Args:
        dst: PSUM tile, float32, shape [M, N] (free axes may be split, N elements in all).
        stationary: SBUF tile [K, M], K <= 128 partitions (contracted), M <= 128.
        moving: SBUF tile [K, N], N <= 512 elements per partition.
        is_stationary_onezero / is_moving_onezero: the hint that the operand holds only 0.0 and
            1.0 (checked here: a false hint is refused). With an fp32 stationary the ISA docs
            promise up to 2x the fp32 speed; the cost model charges 2 passes instead of 4.
        accumulate: True / False / None, see the module docstring for the PSUM rule.
    Notes:
        Products and sums are float32 whatever the operand dtype (bf16 products are exact in
        fp32). The cost model charges fp32 operands four passes of the array.
    """
    op = "nisa.nc_matmul"
    execution = _runtime.current(op)
    _operand(op, "dst", dst, (PSUM,))
    _operand(op, "stationary", stationary, (SBUF,))
    _operand(op, "moving", moving, (SBUF,))
    k, m, n = stationary.shape[0], _free_size(stationary), _free_size(moving)
    if k > MATMUL_K_MAX:
        raise refuse(op, "stationary", f"contraction (partition) size {k} > {MATMUL_K_MAX}")
    if m > MATMUL_M_MAX:
        raise refuse(op, "stationary", f"free size {m} > {MATMUL_M_MAX}")
    if n > MATMUL_N_MAX:
        raise refuse(op, "moving", f"free size {n} > {MATMUL_N_MAX}")
    if moving.shape[0] != k:
        raise ValueError(f"{op}: moving partition size {moving.shape[0]} != stationary partition size {k} (K)")
    if dst.shape[0] != m or dst.size != m * n:
        raise ValueError(f"{op}: dst shape {dst.shape} must be [M={m}, N={n}] for stationary {stationary.shape}, moving {moving.shape}")
    if dst.dtype != _dtypes.float32:
        raise refuse(op, "dst", f"has dtype {dst.dtype.name}; matmul results are float32 in PSUM")
    for label, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in _dtypes.FLOATS:
            raise refuse(op, label, f"has dtype {t.dtype.name}; TensorE takes float32, bfloat16 or float16 operands")
    if (stationary.dtype == _dtypes.float32) != (moving.dtype == _dtypes.float32):
        raise refuse(op, "stationary and moving", f"are {stationary.dtype.name} and {moving.dtype.name}; an fp32 "
                                                  "operand needs an fp32 partner (cast the other one first)")
    if accumulate not in (None, True, False):
        raise ValueError(f"{op}: accumulate must be None, True or False, got {accumulate!r}")
    for label, flag, t in (("stationary", is_stationary_onezero, stationary), ("moving", is_moving_onezero, moving)):
        if flag and not np.isin(_read(t), (0.0, 1.0)).all():
            raise refuse(op, label, f"is_{label}_onezero=True but {label} holds values other than 0.0 and 1.0")
    written = dst.shadow(dst.root.matmul_written)
    by_other = dst.shadow(dst.root.psum_written) & ~written
    if accumulate is True and not written.all():
        raise refuse(op, "dst", "accumulate=True onto PSUM elements not last written by nc_matmul "
                                "(undefined on NeuronCore-v2/v3: open each accumulation group with accumulate=False)")
    if accumulate is None and by_other.any():
        raise refuse(op, "dst", "would accumulate (accumulate=None) onto PSUM elements last written by another "
                                "instruction (memset, copy, ...), undefined on NeuronCore-v2/v3: pass "
                                "accumulate=False or use a fresh PSUM tile")
    with np.errstate(all="ignore"):
        result = (_read(stationary).reshape(k, m).T @ _read(moving).reshape(k, n)).reshape(dst.shape)
        if accumulate is True:
            result = result + dst.array
        elif accumulate is None and written.any():
            result = np.where(written, result + dst.array, result)
    _store(dst, result, by_matmul=True)
    fp32 = stationary.dtype == _dtypes.float32 or moving.dtype == _dtypes.float32
    _record(execution, "tensor", "nc_matmul", dst, (stationary, moving), macs=k * m * n, columns=n, fp32=fp32,
            onezero=bool(is_stationary_onezero) and stationary.dtype == _dtypes.float32)


def nc_transpose(dst, data, name=None):
    """``dst[F, P] = data[P, F]^T`` on TensorE (data in SBUF, P, F <= 128; dst in PSUM)."""
    op = "nisa.nc_transpose"
    execution = _runtime.current(op)
    _operand(op, "dst", dst, (PSUM,))
    _operand(op, "data", data, (SBUF,))
    if data.ndim != 2 or dst.ndim != 2:
        raise ValueError(f"{op}: data and dst must be 2-D tiles, got {data.shape} and {dst.shape}")
    p, f = data.shape
    if f > TRANSPOSE_MAX:
        raise refuse(op, "data", f"free size {f} > {TRANSPOSE_MAX}")
    if dst.shape != (f, p):
        raise ValueError(f"{op}: dst shape {dst.shape} must be {(f, p)} for data {data.shape}")
    if dst.dtype != data.dtype:
        raise refuse(op, "dst", f"has dtype {dst.dtype.name}; a TensorE transpose writes the dtype of data "
                                f"({data.dtype.name}): cast when copying out of PSUM")
    _store(dst, _read(data).T)
    _record(execution, "tensor", "nc_transpose", dst, (data,), macs=p * f * p, columns=p,
            fp32=data.dtype == _dtypes.float32)


# ---- registers ----------------------------------------------------------------------------
def register_alloc(x=0):
    """A fresh 32-bit register holding the int ``x``."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise ValueError(f"nisa.register_alloc: x must be an int, got {x!r}")
    _runtime.current("nisa.register_alloc")
    return Register(int(x))


def register_move(dst, imm):
    """``dst = imm`` (an int constant)."""
    if not isinstance(dst, Register):
        raise ValueError(f"nisa.register_move: dst must be a register, got {type(dst).__name__}")
    _runtime.current("nisa.register_move")
    dst.value = int(imm)


def register_load(dst, src):
    """``dst`` = the one integer element of the SBUF tile ``src`` (a ``[1, 1]`` int tile)."""
    op = "nisa.register_load"
    _runtime.current(op)
    if not isinstance(dst, Register):
        raise ValueError(f"{op}: dst must be a register (nisa.register_alloc), got {type(dst).__name__}")
    _operand(op, "src", src, (SBUF,))
    if src.size != 1:
        raise refuse(op, "src", f"has shape {src.shape}; a register loads one element of a [1, 1] SBUF tile")
    if src.dtype in _dtypes.FLOATS:
        raise refuse(op, "src", f"has dtype {src.dtype.name}; an index register loads an integer tile")
    dst.value = int(src.array.reshape(-1)[0])


def register_store(dst, src):
    """The [1, 1] SBUF tile ``dst`` = the register ``src``."""
    op = "nisa.register_store"
    _runtime.current(op)
    _operand(op, "dst", dst, (SBUF,))
    if not isinstance(src, Register) or dst.size != 1:
        raise ValueError(f"{op}: dst must be a [1, 1] SBUF tile and src a register")
    _store(dst, np.full(dst.shape, src.value))


# ---- DMA ----------------------------------------------------------------------------------
def _contiguous_run(array: np.ndarray) -> int:
    """Elements of the innermost contiguous run of ``array`` (one DMA descriptor)."""
    run, expected = 1, array.itemsize
    for size, stride in zip(reversed(array.shape), reversed(array.strides)):
        if size == 1:
            continue
        if stride != expected:
            break
        run *= size
        expected *= size
    return run


def _dma_work(dst: Tensor, src: Tensor) -> dict:
    run = min(_contiguous_run(dst.array), _contiguous_run(src.array))
    hbm = sum(t.size * t.itemsize for t in (dst, src) if t.buffer in HBM_BUFFERS)
    return dict(bytes=src.size * max(src.itemsize, dst.itemsize), hbm_bytes=hbm,
                descriptors=src.size // run, run_bytes=run * max(src.itemsize, dst.itemsize))


def _squeezed(shape) -> tuple:
    return tuple(s for s in shape if s != 1)


def dma_copy(dst, src, oob_mode=oob_mode.error, name=None):
    """Copy ``src`` to ``dst`` by DMA (HBM <-> SBUF, SBUF -> SBUF, HBM -> HBM), casting dtype.

    Shapes must agree up to size-1 axes. DMA cannot read (or write) PSUM. Either side may be
    addressed through a register (a dynamic start address); one that falls outside its
    tensor raises (``oob_mode.error``, the default) or skips the transfer (``oob_mode.skip``).
    """
    op = "nisa.dma_copy"
    execution = _runtime.current(op)
    _operand(op, "src", src, (SBUF, HBM, SHARED_HBM))
    _operand(op, "dst", dst, (SBUF, HBM, SHARED_HBM))
    if _squeezed(src.shape) != _squeezed(dst.shape):
        raise ValueError(f"{op}: src shape {src.shape} does not match dst shape {dst.shape}")
    if oob_mode not in ("error", "skip"):
        raise ValueError(f"{op}: oob_mode must be nisa.oob_mode.error or .skip, got {oob_mode!r}")
    if src.out_of_bounds or dst.out_of_bounds:
        if oob_mode == "error":
            side = "src" if src.out_of_bounds else "dst"
            raise refuse(op, side, "has a register address outside its tensor (run-time out-of-bounds error, "
                                   "oob_mode.error)")
        _record(execution, "dma", "dma_copy", dst, (src,), **_dma_work(dst, src))
        return
    value = src.array if src.dtype == dst.dtype else _read(src)
    _store(dst, value)
    _record(execution, "dma", "dma_copy", dst, (src,), **_dma_work(dst, src))


def dma_transpose(dst, src, name=None):
    """``dst[B, A] = src[A, B]^T`` by the DMA engine; 2-byte dtypes only, B <= 128, dst in SBUF."""
    op = "nisa.dma_transpose"
    execution = _runtime.current(op)
    _operand(op, "src", src, (SBUF, HBM, SHARED_HBM))
    _operand(op, "dst", dst, (SBUF,))
    for label, t in (("src", src), ("dst", dst)):
        if t.itemsize != 2:
            raise refuse(op, label, f"has dtype {t.dtype.name} ({t.itemsize} bytes); dma_transpose moves 2-byte dtypes only")
    if src.ndim != 2:
        raise ValueError(f"{op}: src must be 2-D, got shape {src.shape}")
    a, b = src.shape
    if b > TRANSPOSE_MAX:
        raise refuse(op, "src", f"last axis {b} > {TRANSPOSE_MAX}")
    if dst.shape != (b, a):
        raise ValueError(f"{op}: dst shape {dst.shape} must be {(b, a)} for src {src.shape}")
    _store(dst, src.array.T)
    # costed like a copy of the source rows (the transpose engine's own rate is not public)
    _record(execution, "dma", "dma_transpose", dst, (src,), **_dma_work(src, src))


# ---- VectorE / ScalarE / GpSimd -----------------------------------------------------------
def memset(dst, value, engine=None, name=None):
    """Fill ``dst`` (SBUF or PSUM) with the scalar ``value``."""
    op = "nisa.memset"
    execution = _runtime.current(op)
    _operand(op, "dst", dst, ON_CHIP)
    unit = _engine(op, engine, dst)
    fill = _column(op, "value", value, dst)
    _store(dst, np.broadcast_to(fill, dst.shape))
    _record(execution, unit, "memset", dst, (), elements=dst.size, partitions=dst.shape[0])


def tensor_copy(dst, src, engine=None, name=None):
    """``dst = src`` (SBUF or PSUM -> SBUF), casting to dst's dtype."""
    op = "nisa.tensor_copy"
    execution = _runtime.current(op)
    _operand(op, "src", src, ON_CHIP)
    _operand(op, "dst", dst, (SBUF,))
    _same_layout(op, dst, "src", src)
    unit = _engine(op, engine, src)
    _store(dst, src.array if src.dtype == dst.dtype else _read(src))
    _record(execution, unit, "tensor_copy", dst, (src,), elements=dst.size, partitions=dst.shape[0])


def _two_tile_inputs(op: str, dst, first: tuple, second: tuple) -> None:
    """Checks of an elementwise instruction reading two tiles: on chip, not both in PSUM,
    each laid out like ``dst``. ``first`` / ``second`` are ``(argument name, tile)``."""
    (name_a, a), (name_b, b) = first, second
    _operand(op, "dst", dst, ON_CHIP)
    _operand(op, name_a, a, ON_CHIP)
    _operand(op, name_b, b, ON_CHIP)
    if a.buffer == PSUM and b.buffer == PSUM:
        raise refuse(op, f"{name_a} and {name_b}", "are both in PSUM; at most one of them may be in PSUM")
    _same_layout(op, dst, name_a, a)
    _same_layout(op, dst, name_b, b)


def tensor_tensor(dst, data1, data2, op, name=None):
    """``dst = data1 <op> data2`` elementwise on VectorE; not both inputs in PSUM."""
    name_ = "nisa.tensor_tensor"
    execution = _runtime.current(name_)
    _two_tile_inputs(name_, dst, ("data1", data1), ("data2", data2))
    fn = _ops.resolve(op, name_, "op", "binary").binary
    with np.errstate(all="ignore"):
        value = fn(_read(data1).reshape(dst.shape), _read(data2).reshape(dst.shape))
    _store(dst, value)
    _record(execution, "vector", "tensor_tensor", dst, (data1, data2), elements=dst.size, partitions=dst.shape[0])


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=None, name=None):
    """``dst = (data <op0> operand0) <op1> operand1``; operands are scalars or [P, 1] tiles.

    ``reverse0`` / ``reverse1`` swap the operator's inputs (``operand0 <op0> data``).
    """
    op = "nisa.tensor_scalar"
    execution = _runtime.current(op)
    _operand(op, "dst", dst, ON_CHIP)
    _operand(op, "data", data, ON_CHIP)
    _same_layout(op, dst, "data", data)
    unit = _engine(op, engine, dst, data, operand0, operand1)
    fn0 = _ops.resolve(op0, op, "op0", "binary").binary
    a0 = _column(op, "operand0", operand0, data)
    if (op1 is None) != (operand1 is None):
        raise ValueError(f"{op}: op1 and operand1 must be given together (got op1={op1!r}, operand1={operand1!r})")
    fn1 = _ops.resolve(op1, op, "op1", "binary").binary if op1 is not None else None
    a1 = _column(op, "operand1", operand1, data) if op1 is not None else None
    with np.errstate(all="ignore"):
        x = _read(data)
        x = fn0(a0, x) if reverse0 else fn0(x, a0)
        if fn1 is not None:
            x = fn1(a1, x) if reverse1 else fn1(x, a1)
    _store(dst, np.asarray(x, dtype=np.float32))
    _record(execution, unit, "tensor_scalar", dst, (data, operand0, operand1),
            elements=dst.size, partitions=dst.shape[0])


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    """``dst = (data <op0> operand0) <op1> operand1`` with operand0 scalar / [P, 1], operand1 a tile."""
    op = "nisa.scalar_tensor_tensor"
    execution = _runtime.current(op)
    _two_tile_inputs(op, dst, ("data", data), ("operand1", operand1))
    fn0 = _ops.resolve(op0, op, "op0", "binary").binary
    fn1 = _ops.resolve(op1, op, "op1", "binary").binary
    a0 = _column(op, "operand0", operand0, data)
    with np.errstate(all="ignore"):
        x = _read(data)
        x = fn0(a0, x) if reverse0 else fn0(x, a0)
        y = _read(operand1).reshape(x.shape)
        x = fn1(y, x) if reverse1 else fn1(x, y)
    _store(dst, np.asarray(x, dtype=np.float32))
    _record(execution, "vector", "scalar_tensor_tensor", dst, (data, operand0, operand1),
            elements=dst.size, partitions=dst.shape[0])


def _activate(name_: str, dst, op, data, bias, scale) -> np.ndarray:
    """Check the operands of an activation and return ``op(data * scale + bias)`` in fp32."""
    _operand(name_, "dst", dst, ON_CHIP)
    _operand(name_, "data", data, ON_CHIP)
    _same_layout(name_, dst, "data", data)
    fn = _ops.resolve(op, name_, "op", "unary").unary
    if bias is not None and not isinstance(bias, Tensor):
        raise ValueError(f"{name_}: bias must be None or a [P, 1] tile, got {type(bias).__name__}")
    b = _column(name_, "bias", bias, data) if bias is not None else None
    s = _column(name_, "scale", scale, data)
    with np.errstate(all="ignore"):
        x = _read(data) * s
        if b is not None:
            x = x + b
        return np.asarray(fn(np.asarray(x, dtype=np.float32)), dtype=np.float32)


def activation(dst, op, data, bias=None, scale=1.0, name=None):
    """``dst = op(data * scale + bias)`` on ScalarE.

    Args:
        op: an activation function token (nl.exp, nl.silu, nl.copy, ...).
        bias: None or a [P, 1] tile (float32) added per partition.
        scale: a scalar or a [P, 1] tile.
    """
    name_ = "nisa.activation"
    execution = _runtime.current(name_)
    _store(dst, _activate(name_, dst, op, data, bias, scale))
    _record(execution, "scalar", "activation", dst, (data, bias, scale), elements=dst.size, partitions=dst.shape[0])


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """``activation`` plus ``reduce_res[P, 1] = reduce_op`` over the free axes of its fp32 result."""
    name_ = "nisa.activation_reduce"
    execution = _runtime.current(name_)
    _operand(name_, "data", data, ON_CHIP)
    _operand(name_, "reduce_res", reduce_res, ON_CHIP)
    if reduce_res.shape[0] != data.shape[0] or reduce_res.size != data.shape[0]:
        raise ValueError(f"{name_}: reduce_res must be a [{data.shape[0]}, 1] tile, got shape {reduce_res.shape}")
    reducer = _ops.resolve(reduce_op, name_, "reduce_op", "reduce").reduce
    value = _activate(name_, dst, op, data, bias, scale)
    _store(dst, value)
    _store(reduce_res, reducer(value.reshape(data.shape[0], -1), axis=1))
    _record(execution, "scalar", "activation_reduce", dst, (data, bias, scale),
            elements=dst.size, partitions=dst.shape[0])


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    """Scan along the free elements of each partition (VectorE):

    ``r[:, i] = (data0[:, i] <op0> r[:, i - 1]) <op1> data1[:, i]`` with ``r[:, -1] = initial``
    (a scalar or a [P, 1] tile); ``reverse0`` / ``reverse1`` swap each operator's inputs.
    Vectorised over partitions, sequential over the free elements, like the hardware.
    """
    op = "nisa.tensor_tensor_scan"
    execution = _runtime.current(op)
    _two_tile_inputs(op, dst, ("data0", data0), ("data1", data1))
    fn0 = _ops.resolve(op0, op, "op0", "binary").binary
    fn1 = _ops.resolve(op1, op, "op1", "binary").binary
    partitions = dst.shape[0]
    previous = np.broadcast_to(_column(op, "initial", initial, dst), (partitions,) + (1,) * (dst.ndim - 1))
    previous = np.asarray(previous, dtype=np.float32).reshape(partitions)
    x0 = _read(data0).reshape(partitions, -1)
    x1 = _read(data1).reshape(partitions, -1)
    result = np.empty(x0.shape, dtype=np.float32)
    with np.errstate(all="ignore"):
        for i in range(x0.shape[1]):
            step = fn0(previous, x0[:, i]) if reverse0 else fn0(x0[:, i], previous)
            previous = fn1(x1[:, i], step) if reverse1 else fn1(step, x1[:, i])
            result[:, i] = previous
    _store(dst, result)
    _record(execution, "vector", "tensor_tensor_scan", dst, (data0, data1, initial),
            elements=dst.size, partitions=partitions)


def reciprocal(dst, data, name=None):
    """``dst = 1 / data`` elementwise on VectorE."""
    op = "nisa.reciprocal"
    execution = _runtime.current(op)
    _operand(op, "dst", dst, ON_CHIP)
    _operand(op, "data", data, ON_CHIP)
    _same_layout(op, dst, "data", data)
    with np.errstate(divide="ignore"):
        _store(dst, np.float32(1.0) / _read(data))
    _record(execution, "vector", "reciprocal", dst, (data,), elements=dst.size, partitions=dst.shape[0])


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce ``data`` over free ``axis`` (int or tuple, never 0) with ``op`` on VectorE.

    dst must hold the reduced elements: [P, ...] with the reduced axes dropped or kept as 1.
    Reduce across partitions with a ones-vector ``nc_matmul`` instead.
    """
    name_ = "nisa.tensor_reduce"
    execution = _runtime.current(name_)
    _operand(name_, "dst", dst, ON_CHIP)
    _operand(name_, "data", data, ON_CHIP)
    reducer = _ops.resolve(op, name_, "op", "reduce").reduce
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(int(a) % data.ndim for a in axes)
    if not axes or 0 in axes:
        raise refuse(name_, "axis", f"{axis!r} includes the partition axis 0; tensor_reduce reduces free axes only")
    expected = tuple(1 if i in axes else s for i, s in enumerate(data.shape))
    if dst.shape[0] != data.shape[0] or dst.size != int(np.prod(expected)):
        raise ValueError(f"{name_}: dst shape {dst.shape} must hold the reduction of {data.shape} over axes {axes}")
    value = reducer(_read(data), axis=axes, keepdims=True)
    if negate:
        value = -value
    _store(dst, value)
    _record(execution, "vector", "tensor_reduce", dst, (data,), elements=data.size, partitions=data.shape[0])


def _affine(op: str, pattern, partitions: int, channel_multiplier, offset, free_size: int) -> np.ndarray:
    """``offset + p * channel_multiplier + sum_i idx_i * step_i`` as a [P, prod(num_i)] array."""
    try:
        steps = [int(p[0]) for p in pattern]
        nums = [int(p[1]) for p in pattern]
    except (TypeError, IndexError):
        raise ValueError(f"{op}: pattern must be a list of [step, num] pairs, got {pattern!r}") from None
    if not nums or min(nums) < 1:
        raise ValueError(f"{op}: pattern nums must be >= 1, got {pattern!r}")
    if int(np.prod(nums)) != free_size:
        raise ValueError(f"{op}: pattern {pattern!r} covers {int(np.prod(nums))} elements per partition, dst has {free_size}")
    value = np.zeros(nums, dtype=np.int64) + int(offset)
    for axis, (step, num) in enumerate(zip(steps, nums)):
        shape = [1] * len(nums)
        shape[axis] = num
        value = value + np.arange(num, dtype=np.int64).reshape(shape) * step
    channel = np.arange(partitions, dtype=np.int64).reshape(partitions, 1) * int(channel_multiplier)
    return channel + value.reshape(1, free_size)


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=_ops.equal,
                  offset=0, name=None):
    """``dst = on_true_tile`` where ``cmp_op(affine, 0)`` else ``on_false_value`` (GpSimd, SBUF only).

    ``affine[p, idx] = offset + p * channel_multiplier + sum_i idx_i * step_i`` for
    ``pattern = [[step_i, num_i], ...]`` (outermost first) over dst's free elements.
    Example (causal mask, keep j <= p): ``pattern=[[-1, F]], channel_multiplier=1,
    cmp_op=nl.greater_equal``.
    """
    op = "nisa.affine_select"
    execution = _runtime.current(op)
    _operand(op, "dst", dst, (SBUF,))  # GpSimd: no PSUM access
    _operand(op, "on_true_tile", on_true_tile, (SBUF,))
    _same_layout(op, dst, "on_true_tile", on_true_tile)
    compare = _ops.resolve(cmp_op, op, "cmp_op", "binary").binary
    if isinstance(on_false_value, Tensor):
        raise ValueError(f"{op}: on_false_value must be a scalar, got a tensor")
    false_value = _column(op, "on_false_value", on_false_value, dst)
    affine = _affine(op, pattern, dst.shape[0], channel_multiplier, offset, _free_size(dst))
    keep = compare(affine, 0) != 0
    value = np.where(keep, _read(on_true_tile).reshape(keep.shape), false_value)
    _store(dst, value)
    _record(execution, "gpsimd", "affine_select", dst, (on_true_tile,), elements=dst.size, partitions=dst.shape[0])


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """``dst[p, idx] = offset + p * channel_multiplier + sum_i idx_i * step_i`` (GpSimd, dst in SBUF)."""
    op = "nisa.iota"
    execution = _runtime.current(op)
    _operand(op, "dst", dst, (SBUF,))
    affine = _affine(op, pattern, dst.shape[0], channel_multiplier, offset, _free_size(dst))
    _store(dst, affine if dst.dtype not in _dtypes.FLOATS else affine.astype(np.float32))
    _record(execution, "gpsimd", "iota", dst, (), elements=dst.size, partitions=dst.shape[0])


__all__ = [
    "oob_mode", "engine", "register_alloc", "register_move", "register_load", "register_store", "nc_matmul", "nc_transpose", "dma_copy", "dma_transpose", "memset", "tensor_copy",
    "tensor_tensor", "tensor_scalar", "scalar_tensor_tensor", "activation", "activation_reduce",
    "tensor_tensor_scan", "reciprocal",
    "tensor_reduce", "affine_select", "iota",
]
