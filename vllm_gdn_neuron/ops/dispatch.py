"""Backend choice: ``backend="auto"`` -> ``$VLLM_GDN_BACKEND`` -> ``nki`` on Neuron -> the CPU's choice -> ``torch``.

Backend modules live at ``vllm_gdn_neuron.ops.backends.<name>`` and are imported lazily, the
first time an op asks for them; see ``backends/__init__.py`` for the contract they implement.
An op the chosen backend does not implement runs on ``torch`` under ``auto`` (including a
``$VLLM_GDN_BACKEND`` choice) and is refused when the backend is named in the call.

On the CPU, ``auto`` runs each GDN call on the backend ``vllm_gdn_neuron.ops.auto`` chose for
its phase and shape, by the CPU's instruction sets or a measurement at the first call of that
shape; other calls, and other devices, run on ``torch``. The serving layer makes the same
choice once, at construction (``ops.layer_backends``), and names the backends in its calls.
"""

import functools
import importlib
import importlib.util
import os
import sys
import types

import torch

from .auto import Choice, ConvShape, GdnShape, choose, refusal

BACKENDS = ("torch", "nki", "vllm_cpu")
ENV_VAR = "VLLM_GDN_BACKEND"
NEURON_DEVICE_TYPES = ("xla", "neuron")


def _gdn_shape(q, v, scale, ssm_dtype):
    return GdnShape(q.dtype, q.shape[1], v.shape[1], q.shape[2], v.shape[2], scale, ssm_dtype)


def _gdn_prefill_backend(q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm):
    return choose("gdn_prefill", _gdn_shape(q, v, scale, torch.float32))  # the op's states are float32


def _gdn_decode_backend(q, k, v, g, beta, state, state_indices, scale, use_qk_l2norm):
    if not load_backend("vllm_cpu").rows_contiguous(state):
        return Choice("torch", "state rows not contiguous")
    return choose("gdn_decode", _gdn_shape(q, v, scale, state.dtype))


#: op -> ``backend_for(*op_args) -> auto.Choice``: the public ops ``auto`` chooses for on the CPU
#: (``vllm_gdn_neuron.ops.auto``, once per shape); the other ops run on ``torch``.
AUTO_RULES = {
    "gdn_prefill": _gdn_prefill_backend,
    "gdn_decode": _gdn_decode_backend,
}


@functools.cache
def load_backend(name):
    """Import ``vllm_gdn_neuron.ops.backends.<name>``; ValueError if it cannot be imported."""
    try:
        return importlib.import_module(f"{__package__}.backends.{name}")
    except ImportError as error:
        raise ValueError(f"backend: {name!r} is not available here ({error})") from error


def _nki_package_present():
    """The real ``nki`` package: imported with a spec, or installed (a stand-in module without a
    spec in ``sys.modules`` is not it)."""
    module = sys.modules.get("nki")
    if module is not None:
        return getattr(module, "__spec__", None) is not None
    return _nki_installed()


@functools.cache
def _nki_installed():
    """Searched once per process: a path search took 0.14 ms, paid by every layer at every step."""
    return importlib.util.find_spec("nki") is not None


def _is_available(name):
    """The backend imports and (if it can tell) says it can run here."""
    try:
        module = load_backend(name)
    except ValueError:
        return False
    is_available = getattr(module, "is_available", None)
    return is_available() if is_available is not None else True


def _nki_is_usable(device):
    """A real Neuron device (a torch device of type xla / neuron, or the real ``nki`` package)."""
    if device.type not in NEURON_DEVICE_TYPES and not _nki_package_present():
        return False
    return _is_available("nki")


def _check_name(argument, name):
    if name not in BACKENDS:
        raise ValueError(f"{argument}: expected one of {('auto',) + BACKENDS}, got {name!r}")


def select_backend(backend, op_name, device):
    """The backend module that runs ``op_name`` for tensors on ``device``.

    Args:
        backend: ``"auto"`` or a name in ``BACKENDS``.
        op_name: the op the caller is about to run (a backend may implement a subset).
        device: the torch device of the op's tensors.

    Returns:
        The backend module, or under ``auto`` on the CPU where ``AUTO_RULES`` has a rule for the
        op, an object whose ``op_name`` runs each call on the backend chosen for its shape;
        either has a function named ``op_name``.
    """
    if backend == "auto":
        override = os.environ.get(ENV_VAR, "").strip()
        if override and override != "auto":
            _check_name(ENV_VAR, override)
            module = load_backend(override)
            return module if hasattr(module, op_name) else _require_op("torch", op_name, ENV_VAR)
        if _nki_is_usable(device) and hasattr(load_backend("nki"), op_name):
            return load_backend("nki")
        if device.type == "cpu":
            return _measured_choice(op_name)
        return _require_op("torch", op_name, "backend")
    _check_name("backend", backend)
    return _require_op(backend, op_name, "backend")


def backend_name(backend, op_name, device):
    """The backend ``select_backend`` resolves ``backend`` to for ``op_name`` on ``device``.

    Returns:
        A name in ``BACKENDS``, or ``"auto"`` where ``auto`` chooses per shape (the CPU's
        choice, ``vllm_gdn_neuron.ops.auto``).
    """
    chosen = select_backend(backend, op_name, device)
    return chosen.__name__.rsplit(".", 1)[-1] if isinstance(chosen, types.ModuleType) else "auto"


def _require_op(name, op_name, argument):
    module = load_backend(name)
    if not hasattr(module, op_name):
        raise ValueError(f"{argument}: backend {name!r} does not implement {op_name}")
    return module


@functools.cache
def _measured_choice(op_name):
    """``torch``, or a stand-in whose ``op_name`` runs each call on the backend AUTO_RULES choose."""
    fallback = _require_op("torch", op_name, "backend")
    backend_for = AUTO_RULES.get(op_name)
    if backend_for is None or not _is_available("vllm_cpu"):
        return fallback

    def run(*args):
        return getattr(load_backend(backend_for(*args).backend), op_name)(*args)

    run.__name__ = run.__qualname__ = op_name
    return types.SimpleNamespace(**{op_name: run})


def _gdn_rows_in_place(q, v, ssm_cache, scale):
    """The shape of an in-place GDN call on CPU cache rows, each contiguous, else None."""
    if q.device.type != "cpu" or not load_backend("vllm_cpu").rows_contiguous(ssm_cache):
        return None
    return _gdn_shape(q, v, scale, ssm_cache.dtype)


def _conv_in_place(x, weight, conv_cache, activation):
    """The shape of an in-place conv call on CPU pages, else None."""
    if x.device.type != "cpu":
        return None
    return ConvShape(x.dtype, weight.dtype, conv_cache.dtype, weight.shape[0], weight.shape[1], activation)


#: The in-place cache-page ops of ``vllm_cpu`` that eager paged ops may call: their phase in
#: ``vllm_gdn_neuron.ops.auto`` and the shape of a call (from the arguments ``select_in_place``
#: takes for it), None where the tensors themselves rule the kernel out.
IN_PLACE_RULES = {
    "paged_gdn_prefill": ("gdn_prefill", _gdn_rows_in_place),   # (q, v, ssm_cache, scale)
    "gdn_decode": ("gdn_decode", _gdn_rows_in_place),           # (q, v, ssm_cache, scale)
    # Verify rows are decode steps over 1 + N tokens: the decode phase's choice, whose kernel
    # has a speculative variant with the same per-token update.
    "paged_gdn_verify": ("gdn_decode", _gdn_rows_in_place),     # (q, v, ssm_cache, scale)
    "paged_conv1d_prefill": ("conv_prefill", _conv_in_place),   # (x, weight, conv_cache, activation)
    "paged_conv1d_decode": ("conv_decode", _conv_in_place),     # (x, weight, conv_cache, activation)
}
IN_PLACE_OPS = tuple(IN_PLACE_RULES)
PAGED_BACKENDS = ("auto", "torch", "vllm_cpu")


def select_in_place(op_name, backend, *args):
    """The ``vllm_cpu`` function an eager CPU paged op can run on its cache, or None for torch.

    Args:
        op_name: one of ``IN_PLACE_OPS`` (the backend functions of those names, which update
            cache pages in place).
        backend: ``"torch"`` (None), ``"vllm_cpu"`` (the kernel wherever it can run the call's
            tensors), or ``"auto"``: ``$VLLM_GDN_BACKEND`` when it names ``torch`` or
            ``vllm_cpu``, else the kernel where ``auto.choose`` took it for the call's shape.
        args: the ones its shape rule in ``IN_PLACE_RULES`` takes.

    Never for traced code (C++ calls).
    """
    if op_name not in IN_PLACE_RULES:
        raise ValueError(f"op_name: expected one of {IN_PLACE_OPS}, got {op_name!r}")
    if backend == "auto":
        override = os.environ.get(ENV_VAR, "").strip()
        if override not in ("", "auto"):
            backend = override if override == "vllm_cpu" else "torch"
    elif backend not in PAGED_BACKENDS:
        raise ValueError(f"backend: expected one of {PAGED_BACKENDS}, got {backend!r}")
    if backend == "torch":
        return None
    phase, shape_of = IN_PLACE_RULES[op_name]
    shape = shape_of(*args)
    if shape is None:
        return None
    if backend == "auto":
        runs_on_vllm_cpu = choose(phase, shape).backend == "vllm_cpu"
    else:
        runs_on_vllm_cpu = refusal(phase, shape) is None
    return getattr(load_backend("vllm_cpu"), op_name) if runs_on_vllm_cpu else None
