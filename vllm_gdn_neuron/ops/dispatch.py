"""Backend choice: ``backend="auto"`` -> ``$VLLM_GDN_BACKEND`` -> ``nki`` on Neuron -> the CPU's choice -> ``torch``.

Backend modules live at ``vllm_gdn_neuron.ops.backends.<name>`` and are imported lazily, the
first time an op asks for them; see ``backends/__init__.py`` for the contract they implement.
An op the chosen backend does not implement runs on ``torch`` under ``auto`` (including a
``$VLLM_GDN_BACKEND`` choice) and is refused when the backend is named in the call.

On the CPU, ``auto`` runs each GDN call on the backend ``vllm_gdn_neuron.ops.auto`` chose for
its phase and shape, by the CPU's instruction sets or a measurement at the first call of that
shape; other calls, and other devices, run on ``torch``. These are the public varlen ops'
rules; a serving layer's paged ops are chosen once, at construction (``ops.phases``).
"""

import functools
import importlib
import importlib.util
import sys
import types

import torch

from vllm_gdn_neuron import envs

from .auto import Choice, GdnShape, choose
from .phases import BACKENDS, NEURON_DEVICE_TYPES

ENV_VAR = envs.GDN_BACKEND


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
    """Searched once per process, not at every call (a path search per call would be paid by every layer at every step)."""
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


@functools.cache
def env_override() -> str:
    """``$VLLM_GDN_BACKEND`` (``"auto"`` when unset), read once per process, at the first public
    op call under ``backend="auto"``."""
    return envs.gdn_backend()


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
        override = env_override()
        if override != "auto":
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

