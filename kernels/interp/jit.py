"""``@nki.jit`` for the interpreter: run a kernel eagerly on NumPy arrays or torch tensors.

A kernel is called with NumPy arrays or CPU torch tensors (and any trace-time constants:
ints, floats, strings, bools, None). Array arguments become HBM tensors that share the
caller's memory, so a kernel writing an input (``nisa.dma_copy(dst=state, ...)``) updates
the caller's buffer in place. The kernel returns its outputs - tensors it allocated with
``nl.ndarray(..., buffer=nl.shared_hbm)`` (or inputs it updated) - alone or in a tuple/list;
they come back as NumPy arrays, or as torch tensors when any argument was a torch tensor.
A returned input comes back as the caller's own object.

``kernel[grid](...)`` runs the body once per program index of ``grid`` (an int or a tuple),
in order, with ``nl.program_id(axis)`` giving the index; ``shared_hbm`` outputs are shared by
all programs (the k-th shared_hbm allocation of each program is the same tensor).
"""

import contextlib
import functools
import itertools

import numpy as np

try:  # optional: keeps NumPy's BLAS on one thread while a kernel runs
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover - the interpreter still runs, slower on busy machines
    threadpool_limits = None

from . import cost as _cost
from . import dtypes as _dtypes
from . import frontend as _frontend
from . import runtime as _runtime
from .tensor import HBM, SHARED_HBM, Tensor


def _one_blas_thread():
    """Tiles are at most 128 x 512: a multi-threaded BLAS only adds synchronisation at these
    sizes, so kernels run with one BLAS thread."""
    if threadpool_limits is None:
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def _is_torch(value) -> bool:
    cls = type(value)
    return cls.__module__.startswith("torch") and cls.__name__ in ("Tensor", "Parameter")


def _torch_to_numpy(value) -> np.ndarray:
    """A NumPy view of a CPU torch tensor's memory (bf16 through an int16 view)."""
    import torch

    if value.device.type != "cpu":
        raise ValueError(f"nki.jit: torch tensors must be on the CPU, got device {value.device}")
    value = value.detach()
    if value.dtype == torch.bfloat16:
        return value.view(torch.int16).numpy().view(_dtypes.bfloat16)
    return value.numpy()


def _numpy_to_torch(array: np.ndarray):
    import torch

    if array.dtype == _dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


class _Arguments:
    """Converts a call's arrays to HBM tensors and the kernel's results back."""

    def __init__(self):
        self.torch = False
        self.originals = {}  # uid of the HBM root -> (caller object, its NumPy view)

    def wrap(self, value, label: str):
        if _is_torch(value):
            self.torch = True
            array = _torch_to_numpy(value)
        elif isinstance(value, np.ndarray):
            array = value
        else:
            return value
        _dtypes.canonical(array.dtype, f"nki.jit: argument {label} dtype")
        storage = array if array.flags.c_contiguous else np.ascontiguousarray(array)
        tensor = Tensor(storage, HBM, name=label)
        self.originals[tensor.uid] = (value, array)
        return tensor

    def write_back(self):
        """Copy kernel writes into inputs that had to be made contiguous first."""
        for uid, (value, array) in self.originals.items():
            tensor = self._roots.get(uid)
            if tensor is not None and tensor.written and tensor.array is not array:
                np.copyto(array, tensor.array)

    def track(self, args):
        self._roots = {a.uid: a for a in args if isinstance(a, Tensor)}

    def unwrap(self, result):
        if result is None:
            return None
        if isinstance(result, (tuple, list)):
            return type(result)(self.unwrap(r) for r in result)
        if not isinstance(result, Tensor):
            raise ValueError(f"nki.jit: a kernel returns tensors (or a tuple/list of them), got {type(result).__name__}")
        if result.buffer not in (HBM, SHARED_HBM):
            raise ValueError(
                f"nki.jit: kernel returned {result!r}; outputs must live in HBM (allocate with buffer=nl.shared_hbm)"
            )
        if result is result.root and result.uid in self.originals:
            return self.originals[result.uid][0]
        array = result.array if result is result.root else np.array(result.array)
        return _numpy_to_torch(array) if self.torch else array


class Kernel:
    """A kernel function under ``@nki.jit``; call it, or index it with a grid first."""

    def __init__(self, func, options):
        self.func = func
        self.options = options
        functools.update_wrapper(self, func)

    def __call__(self, *args, **kwargs):
        return self._launch((), args, kwargs)

    def __getitem__(self, grid):
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        try:
            grid = tuple(int(g) for g in grid)
        except (TypeError, ValueError):
            raise ValueError(f"nki.jit: grid must be an int or a tuple of ints, got {grid!r}") from None
        if not grid or min(grid) < 1:
            raise ValueError(f"nki.jit: grid sizes must be >= 1, got {grid}")
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _launch(self, grid, args, kwargs):
        if _runtime.is_running():
            # a kernel calling another jit kernel inlines its body
            return self.func(*args, **kwargs)
        if self.options.get("frontend_check", True):
            _frontend.check(self.func)  # the NKI front end's Python subset, once per kernel
        arguments = _Arguments()
        args = tuple(arguments.wrap(a, f"arg{i}") for i, a in enumerate(args))
        kwargs = {k: arguments.wrap(v, k) for k, v in kwargs.items()}
        arguments.track(list(args) + list(kwargs.values()))
        execution = _runtime.Execution(grid, _cost.active_recorder())
        result = None
        with _runtime.running(execution), _one_blas_thread():
            for program_id in itertools.product(*(range(g) for g in grid)):
                execution.start_program(program_id)
                result = self.func(*args, **kwargs)
        if execution.recorder is not None:
            execution.recorder.finish_launch(self.func.__name__, grid, execution.memory)
        arguments.write_back()
        return arguments.unwrap(result)


def jit(func=None, **options):
    """Decorator: ``@nki.jit`` or ``@nki.jit(**options)`` (options are accepted and kept).

    ``frontend_check=False`` (interpreter only) skips the front-end subset check: for the
    interpreter's own instruction tests, whose bodies are test code rather than kernels.
    """
    if func is None:
        return lambda f: Kernel(f, options)
    return Kernel(func, options)
