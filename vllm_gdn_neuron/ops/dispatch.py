"""Backend choice: ``backend="auto"`` -> ``$VLLM_GDN_BACKEND`` -> ``nki`` on Neuron -> measured rules -> ``torch``.

Backend modules live at ``vllm_gdn_neuron.ops.backends.<name>`` and are imported lazily, the
first time an op asks for them; see ``backends/__init__.py`` for the contract they implement.
An op the chosen backend does not implement runs on ``torch`` under ``auto`` (including a
``$VLLM_GDN_BACKEND`` choice) and is refused when the backend is named in the call.

On the CPU, ``auto`` picks per call, by the call's dtype and shapes, the backend the benchmarks
measured fastest (``AUTO_RULES``); calls no rule claims, and other devices, run on ``torch``.
"""

import functools
import importlib
import importlib.util
import os
import types

import torch

BACKENDS = ("torch", "nki", "vllm_cpu")
ENV_VAR = "VLLM_GDN_BACKEND"
NEURON_DEVICE_TYPES = ("xla", "neuron")
#: vLLM's C++ GDN prefill kernel: bfloat16, Dk == Dv in these sizes, the default scale.
VLLM_CPU_HEAD_DIMS = (64, 128)


def _vllm_cpu_prefill_wins(q, v, scale):
    """bf16 GDN prefill on the CPU with Dk == Dv in {64, 128} and the default scale: vLLM's kernel.

    Measured on this project's 2-core AVX-512-BF16 + AMX machine (best of rounds, one sequence
    unless said, with ``use_qk_l2norm``; ``benchmarks/README.md`` has the tables):

    | T | N | Hk/Hv | D | torch ms | vllm_cpu ms |
    |---|---|---|---|---|---|
    | 8192 | 1 | 16/16 | 128 | 237 | 127 |
    | 8192 | 1 | 16/32 | 128 | 529 | 230 |
    MEASURED_SMALL_ROWS

    Its bf16 dot products and bf16 beta cost about one bf16 ulp against torch's float32
    (``tests/ops/test_vllm_cpu_backend.py`` holds it to the same float64 references).
    """
    dim_k, dim_v = q.shape[2], v.shape[2]
    return q.dtype == torch.bfloat16 and dim_k == dim_v and dim_k in VLLM_CPU_HEAD_DIMS and scale == dim_k ** -0.5


def _gdn_prefill_on_vllm_cpu(q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm):
    return _vllm_cpu_prefill_wins(q, v, scale)


#: op -> ``((backend, wins(*op_args) -> bool), ...)``, tried in order under ``auto`` on the CPU;
#: the first available backend whose rule holds runs the call, else ``torch``.
AUTO_RULES = {
    "gdn_prefill": (("vllm_cpu", _gdn_prefill_on_vllm_cpu),),
}


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
    """``torch``, or a stand-in whose ``op_name`` runs each call on the backend AUTO_RULES pick."""
    fallback = _require_op("torch", op_name, "backend")
    rules = tuple((name, wins) for name, wins in AUTO_RULES.get(op_name, ()) if _is_available(name))
    if not rules:
        return fallback

    def run(*args):
        for name, wins in rules:
            if wins(*args):
                return getattr(load_backend(name), op_name)(*args)
        return getattr(fallback, op_name)(*args)

    run.__name__ = run.__qualname__ = op_name
    return types.SimpleNamespace(**{op_name: run})


def select_paged_prefill(q, v, ssm_cache, scale):
    """The in-place paged prefill ``auto`` takes for an eager CPU call, or None for the torch math.

    ``vllm_cpu.paged_gdn_prefill`` when the ``gdn_prefill`` rule holds (``_vllm_cpu_prefill_wins``),
    the cache is contiguous float32 on the CPU, the backend is available and
    ``$VLLM_GDN_BACKEND`` does not name another backend. Not for traced code (a C++ call).
    """
    override = os.environ.get(ENV_VAR, "").strip()
    if override not in ("", "auto", "vllm_cpu"):
        return None
    if not (q.device.type == "cpu" and ssm_cache.dtype == torch.float32 and ssm_cache.is_contiguous()
            and _vllm_cpu_prefill_wins(q, v, scale)
            and _is_available("vllm_cpu")):
        return None
    return load_backend("vllm_cpu").paged_gdn_prefill
