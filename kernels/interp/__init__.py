"""A CPU interpreter of the public NKI API (NKI 0.6 / Neuron SDK 2.32 style) with trn2 limits and a cost model.

Kernels never import this package: they import ``nki``, ``nl``, ``nisa`` from
``vllm_gdn_neuron.kernels.nki_compat``, which gives the real NKI where it is installed and
this interpreter only on an opt-in (``VLLM_GDN_NKI_INTERPRET=1``, or this package imported
before the kernels, as the tests do); no serving module imports it.

Public surface
--------------
``nki.jit``: ``@nki.jit def kernel(a, b, n=4): ...``; call ``kernel(x, y)`` with NumPy arrays
    or CPU torch tensors (bf16 included) plus trace-time constants; ``kernel[grid](...)``
    runs the body once per program index, read with ``nl.program_id(axis)`` /
    ``nl.num_programs(axis)``. Array arguments become HBM tensors that SHARE the caller's
    memory: writing one (``nisa.dma_copy(dst=state_hbm, src=tile)``) updates the caller's
    buffer in place.
Outputs: allocate them in the kernel with ``nl.ndarray(shape, dtype, buffer=nl.shared_hbm)``,
    fill them by ``nisa.dma_copy`` and ``return`` them (one tensor, or a tuple/list). They
    come back as NumPy arrays, or torch tensors when any argument was a torch tensor;
    a returned input argument comes back as the caller's own object. In a grid launch the
    k-th shared_hbm allocation is the same tensor in every program.
``nl``: dtypes ``float32, bfloat16, float16, int32`` (``int16, int8, uint8``); buffers
    ``sbuf, psum, hbm (private_hbm), shared_hbm``; ``ndarray(shape, dtype, buffer=nl.sbuf,
    name=None)`` (uninitialised: NaN-filled), ``zeros`` (ndarray + memset); ``ds(start,
    size)``; ``affine_range / sequential_range`` (device loops: run in order, their
    index an affine ``LoopIndex``, counted once in the program size), ``static_range`` (= ``range``);
    ``NKIObject``;
    ``program_id, num_programs, program_ndim``; ``tile_size.pmax / psum_fmax /
    gemm_stationary_fmax / gemm_moving_fmax``; operator tokens ``add subtract multiply
    divide maximum minimum max min power equal not_equal greater greater_equal less
    less_equal`` and activation functions ``copy exp log sigmoid silu tanh relu
    gelu_apprx_tanh sqrt rsqrt square reciprocal softplus abs negative`` (NumPy ufuncs such
    as ``np.add`` are accepted too). Tokens are arguments of nisa ops, not callables.
Tensors: axis 0 is the partition axis (<= 128 in SBUF/PSUM). Views: ``t[i, a:b]``,
    ``t[nl.ds(start, size), :]``, ``t.ap([[stride, count], ...], offset=0)`` (element
    strides into the root, outermost first), ``t.reshape(shape)`` (contiguous views only).
    Writes through any view land in the root tensor. ``t[...] = x`` is refused (not an NKI
    instruction). Indices must be trace-time ints.
``nisa`` (destination first, documented keyword names): ``nc_matmul(dst, stationary, moving,
    accumulate=None)``, ``nc_transpose(dst, data)``, ``dma_copy(dst, src)``,
    ``dma_transpose(dst, src)``, ``memset(dst, value)``, ``tensor_copy(dst, src)``,
    ``tensor_tensor(dst, data1, data2, op)``, ``tensor_scalar(dst, data, op0, operand0,
    reverse0=False, op1=None, operand1=None, reverse1=False, engine=None)``,
    ``scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0, reverse1)``,
    ``activation(dst, op, data, bias=None, scale=1.0)``, ``activation_reduce(dst, op, data,
    reduce_op, reduce_res, bias=None, scale=1.0)``, ``tensor_tensor_scan(dst, data0, data1,
    initial, op0, op1, reverse0=False, reverse1=False)``, ``reciprocal(dst, data)``,
    ``affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value,
    cmp_op=nl.equal, offset=0)``, ``iota(dst, pattern, offset=0, channel_multiplier=0)``,
    ``tensor_reduce(dst, op, data, axis, negate=False, keepdims=False)``;
    ``nisa.engine.vector/scalar/gpsimd`` select engines where an op takes ``engine=``.

Numerics: engine math is float32; storing into a bf16/fp16 tile rounds to nearest even.
PSUM accumulation (``nc_matmul``): ``accumulate=False`` overwrites, ``True`` adds (only onto
    elements last written by nc_matmul, else refused as undefined on trn2), ``None``
    (default) adds where the element was last written by nc_matmul, overwrites where it is
    fresh, and is refused where another instruction wrote it last. Open each accumulation group with
    ``accumulate=False`` when one PSUM tile is reused across groups.
Lifetime and capacity: an SBUF/PSUM tile is live from ``nl.ndarray`` until the tile and all
    its views are garbage-collected (drop the last reference, e.g. rebinding a loop
    variable, or return). SBUF: 192 KiB per partition (24 MiB usable); PSUM: 8 banks of
    2 KiB per partition, a tile must fit one bank. Over capacity raises
    ``NkiCapacityError`` with the peak.
Front end: the first launch parses the kernel and everything it reaches and refuses Python
    outside the NKI <= 0.6 subset (``NkiFrontendError``, file:line, construct, rule); see
    ``docs/nki-rules.md``. Registers (``nisa.register_alloc`` / ``register_load`` ...) index
    tensors for ``dma_copy`` only (``oob_mode`` error / skip).
Refusals (``NkiHardwareError``, a ``ValueError``; message = op, operand, limit): partition
    axis > 128; nc_matmul K or M > 128, N > 512, dst not PSUM fp32, operands not in SBUF,
    an fp32 operand with a non-fp32 partner, a false is_stationary_onezero; nc_transpose
    into another dtype than its input's;
    a PSUM tile wider than a bank; dma_copy touching PSUM; both tensor_tensor inputs in
    PSUM; dma_transpose of a non-2-byte dtype; GpSimd ops (affine_select, iota,
    engine=gpsimd) touching PSUM; SBUF/PSUM over capacity.
Cost model: ``with interp.cost.record() as rec: kernel(...)``; ``rec.report()`` gives a
    :class:`~.cost.CostReport` (modeled time, per-engine busy share, TensorE utilisation,
    HBM bytes, roofline; ``.table()`` prints them, each labelled "modeled");
    ``rec.instructions`` is the trace. See ``cost.py`` and ``docs/kernels/interpreter.md``.
"""

from . import api as nki
from . import cost
from . import isa as nisa
from . import language as nl
from . import frontend
from .errors import NkiCapacityError, NkiHardwareError
from .frontend import NkiFrontendError

__all__ = ["nki", "nl", "nisa", "cost", "frontend", "NkiHardwareError", "NkiCapacityError", "NkiFrontendError"]
