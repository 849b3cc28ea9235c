"""Backend choice: ``backend="auto"`` -> ``$VLLM_GDN_BACKEND`` -> ``nki`` on Neuron -> ``torch``.

Backend modules live at ``vllm_gdn_neuron.ops.backends.<name>`` and are imported lazily, the
first time an op asks for them; see ``backends/__init__.py`` for the contract they implement.
An op the chosen backend does not implement runs on ``torch`` under ``auto`` (including a
``$VLLM_GDN_BACKEND`` choice) and is refused when the backend is named in the call.
"""

import functools
import importlib
import importlib.util
import os

BACKENDS = ("torch", "nki", "vllm_cpu")
ENV_VAR = "VLLM_GDN_BACKEND"
NEURON_DEVICE_TYPES = ("xla", "neuron")


@functools.cache
def load_backend(name):
    """Import ``vllm_gdn_neuron.ops.backends.<name>``; ValueError if it cannot be imported."""
    try:
        return importlib.import_module(f"{__package__}.backends.{name}")
    except ImportError as error:
        raise ValueError(f"backend: {name!r} is not available here ({error})") from error


def _nki_package_present():
    try:
        return importlib.util.find_spec("nki") is not None
    except ValueError:  # a module named nki without a spec (a stand-in) is in sys.modules
        return False


def _nki_is_usable(device):
    """A real Neuron device (a torch device of type xla / neuron, or the real ``nki`` package)."""
    if device.type not in NEURON_DEVICE_TYPES and not _nki_package_present():
        return False
    try:
        module = load_backend("nki")
    except ValueError:
        return False
    is_available = getattr(module, "is_available", None)
    return is_available() if is_available is not None else True


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
        The backend module; it has a function named ``op_name``.
    """
    if backend == "auto":
        override = os.environ.get(ENV_VAR, "").strip()
        if override and override != "auto":
            _check_name(ENV_VAR, override)
            module = load_backend(override)
            return module if hasattr(module, op_name) else _require_op("torch", op_name, ENV_VAR)
        if _nki_is_usable(device) and hasattr(load_backend("nki"), op_name):
            return load_backend("nki")
        return _require_op("torch", op_name, "backend")
    _check_name("backend", backend)
    return _require_op(backend, op_name, "backend")


def _require_op(name, op_name, argument):
    module = load_backend(name)
    if not hasattr(module, op_name):
        raise ValueError(f"{argument}: backend {name!r} does not implement {op_name}")
    return module
