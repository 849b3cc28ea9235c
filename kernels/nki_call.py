"""The one way a kernel is launched from torch: :class:`NkiOp`, shaped like torch-neuronx's NKI ops.

torch-neuronx calls an ``@nki.jit`` kernel from a traced model through a custom-op wrapper
(``nki_op``, formerly ``wrap_nki(kernel)[grid](...)``), which must be told which tensor
arguments the kernel writes (``mutates_args``) so that functionalisation keeps the update;
non-tensor arguments are compile-time constants, one compiled kernel per value. So here:

* an op names its kernel, its launch ``grid`` and the arguments it mutates;
* the kernel returns every tensor it updates (``(out, state_cache)``), and the op checks it;
* tensors must all live on one device; a Python list or tuple where a tensor belongs (slot
  ids, sequence lengths) is refused: it would compile a kernel per batch composition;
* :func:`device_constant` makes constant tensors (the mask pack) once per device, on the
  caller's device; :func:`index_tensor` turns slot ids into the ``[1, N]`` int32 tensor
  the kernels read into registers.

With the real NKI (a Neuron device), the op is registered through torch-neuronx; anywhere
else the project's interpreter runs the kernel eagerly on the CPU tensors (memory shared,
so mutated arguments are updated in place, as on the device).
"""

import functools
import inspect

import numpy as np
import torch

from .nki_compat import using_interpreter

NAMESPACE = "vllm_gdn_neuron"


def _is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def _is_array(value) -> bool:
    """A torch tensor, or a NumPy array (the interpreter's own input kind, for tests)."""
    return _is_tensor(value) or (using_interpreter and isinstance(value, np.ndarray))


class NkiOp:
    """An ``@nki.jit`` kernel as a torch op.

    Args:
        name: the op's name (``vllm_gdn_neuron::<name>`` when registered with torch-neuronx).
        kernel: the ``@nki.jit`` kernel.
        mutates_args: names of the tensor arguments the kernel writes in place; the kernel
            returns each of them (after its fresh outputs).
        grid: the SPMD launch grid (a tuple of ints), or None for a single program.
        static_args: arguments deliberately passed as compile-time Python sequences (each new
            value compiles a new kernel); any other Python int sequence is refused.

    Calling the op with the kernel's arguments returns the kernel's outputs.
    """

    def __init__(self, name, kernel, mutates_args=(), grid=None, static_args=()):
        self.name = name
        self.static_args = tuple(static_args)
        self.kernel = kernel
        self.mutates_args = tuple(mutates_args)
        self.grid = grid
        function = getattr(kernel, "func", kernel)
        self.signature = inspect.signature(function)
        unknown = [a for a in self.mutates_args if a not in self.signature.parameters]
        if unknown:
            raise ValueError(f"NkiOp {name}: mutates_args {unknown} are not parameters of {function.__name__}")

    def __repr__(self):
        return f"NkiOp({NAMESPACE}::{self.name}, mutates_args={self.mutates_args}, grid={self.grid})"

    def _check(self, bound):
        devices = {}
        for arg, value in bound.arguments.items():
            if _is_tensor(value):
                devices.setdefault(value.device, arg)
            elif (isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value)
                  and arg not in self.static_args):
                raise ValueError(f"{self.name}: argument {arg} is a Python sequence {tuple(value)[:8]}; pass it as an "
                                 "int32 tensor (a Python value is a compile-time constant: one kernel per value)")
        if len(devices) > 1:
            raise ValueError(f"{self.name}: tensor arguments on several devices: "
                             + ", ".join(f"{a} on {d}" for d, a in devices.items()))
        for arg in self.mutates_args:
            value = bound.arguments.get(arg)
            if not _is_array(value):
                raise ValueError(f"{self.name}: mutated argument {arg} must be a tensor, got {type(value).__name__}")
            if not (value.is_contiguous() if _is_tensor(value) else value.flags.c_contiguous):
                raise ValueError(f"{self.name}: mutated argument {arg} must be contiguous (written in place)")

    def __call__(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs)
        self._check(bound)
        launch = self.kernel if self.grid is None else self.kernel[self.grid]
        if not using_interpreter:
            launch = _registered(self)
        result = launch(*args, **kwargs)
        outputs = result if isinstance(result, tuple) else (result,)
        returned = outputs[len(outputs) - len(self.mutates_args):]
        for arg, value in zip(self.mutates_args, returned):
            if using_interpreter and value is not bound.arguments[arg]:
                raise ValueError(f"{self.name}: the kernel must return its updated {arg} (mutated arguments come last)")
        return result


@functools.lru_cache(maxsize=None)
def _registered(op):
    """The op registered with torch-neuronx (real NKI only).

    UNVERIFIED against a device: torch-neuronx documents ``nki_op`` (a custom-op decorator
    taking ``mutates_args``) for SDK 2.33, and ``wrap_nki`` before it; the import paths and
    signatures used here are read from its documentation, not run.
    """
    import torch_neuronx

    nki_op = getattr(torch_neuronx, "nki_op", None)
    if nki_op is not None:
        registered = nki_op(f"{NAMESPACE}::{op.name}", mutates_args=op.mutates_args)(op.kernel)
        return registered if op.grid is None else registered[op.grid]
    from torch_neuronx.xla_impl.ops import nki_jit  # older SDKs

    wrapped = nki_jit()(getattr(op.kernel, "func", op.kernel))
    return wrapped if op.grid is None else wrapped[op.grid]


_constants = {}


def device_constant(key, build, like):
    """The constant tensor ``build()`` (a NumPy array) on ``like``'s device, made once per device."""
    if not _is_tensor(like):
        return build()
    device = like.device
    cached = _constants.get((key, device))
    if cached is None:
        cached = torch.from_numpy(build()).to(device)
        _constants[(key, device)] = cached
    return cached


def index_tensor(indices, like):
    """``indices`` (a tensor of ints, or a sequence for tests) as a ``[1, N]`` int32 tensor on ``like``'s device.

    No host read: a device tensor stays on its device.
    """
    if not _is_tensor(like):
        return np.asarray(list(indices), dtype=np.int32).reshape(1, -1)
    if not _is_tensor(indices):
        indices = torch.tensor(list(indices), dtype=torch.int64)
    return indices.to(device=like.device, dtype=torch.int32).reshape(1, -1).contiguous()
