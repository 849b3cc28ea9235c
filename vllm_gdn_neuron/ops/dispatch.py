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
import sys
import types

import torch

BACKENDS = ("torch", "nki", "vllm_cpu")
ENV_VAR = "VLLM_GDN_BACKEND"
NEURON_DEVICE_TYPES = ("xla", "neuron")
#: vLLM's C++ GDN prefill kernel: bfloat16, Dk == Dv in these sizes, the default scale.
VLLM_CPU_HEAD_DIMS = (64, 128)


def _vllm_cpu_wins(q, v, scale):
    """bf16 GDN on the CPU with Dk == Dv in {64, 128} and the default scale: vLLM's kernels.

    Measured on this project's 2-core AVX-512-BF16 + AMX machine, torch backend against this
    backend on the same call, round-robin, best of 4-30 rounds, ``use_qk_l2norm``, Hk/Hv 16/32
    and D = 128 unless said (1-min load average in brackets; ``benchmarks/README.md`` has the
    benchmark tables):

    | call | torch ms | vllm_cpu ms |
    |---|---|---|
    | prefill T = 8192, 1 sequence, 16/16 [0.0] | 237 | 127 |
    | prefill T = 8192, 1 sequence [0.0] | 529 | 230 |
    | prefill T = 4096, 8 sequences, initial states [5.0] | 2959 | 294 |
    | prefill T = 512, 1 sequence [5.0] | 129 | 18.1 |
    | prefill T = 512, 1 sequence, 16/16, D = 64 [5.0] | 20.9 | 4.6 |
    | prefill T = 128, 1 sequence [5.0] | 27.5 | 5.1 |
    | prefill T = 16, 16 sequences of 1 [5.0] | 475 | 44 |
    | decode, 1 row [8.5] | 0.27 | 0.17 |
    | decode, 8 rows [8.5] | 2.30 | 1.30 |
    | decode, 32 rows [8.5] | 86.9 | 7.9 |

    No measured shape favoured torch; under load the gap widens (each torch op that spans both
    cores waits for the other core's thread; vLLM's kernels run one parallel region per call).

    Their bf16 arithmetic costs accuracy against torch's float32 (decode: about 0.5 % of the
    state's peak per step, the kernel's own; prefill: about one bf16 ulp); both are held to the
    same float64 references in ``tests/ops/test_vllm_cpu_backend.py``. ``VLLM_GDN_BACKEND=torch``
    pins the float32 torch math.
    """
    dim_k, dim_v = q.shape[2], v.shape[2]
    return q.dtype == torch.bfloat16 and dim_k == dim_v and dim_k in VLLM_CPU_HEAD_DIMS and scale == dim_k ** -0.5


def _gdn_prefill_on_vllm_cpu(q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm):
    return _vllm_cpu_wins(q, v, scale)


def _gdn_decode_on_vllm_cpu(q, k, v, g, beta, state, state_indices, scale, use_qk_l2norm):
    return _vllm_cpu_wins(q, v, scale) and load_backend("vllm_cpu").rows_contiguous(state)


#: op -> ``((backend, wins(*op_args) -> bool), ...)``, tried in order under ``auto`` on the CPU;
#: the first available backend whose rule holds runs the call, else ``torch``.
AUTO_RULES = {
    "gdn_prefill": (("vllm_cpu", _gdn_prefill_on_vllm_cpu),),
    "gdn_decode": (("vllm_cpu", _gdn_decode_on_vllm_cpu),),
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
        The backend module, or under ``auto`` on the CPU where ``AUTO_RULES`` has rules for the
        op, an object whose ``op_name`` picks the backend per call; either has a function named
        ``op_name``.
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
        A name in ``BACKENDS``, or ``"auto"`` where ``auto`` picks per call (the CPU's
        measured rules).
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


def _gdn_rows_in_place(q, v, ssm_cache, scale):
    """vLLM's GDN kernels on float32 CPU cache rows, each contiguous, where ``_vllm_cpu_wins``."""
    return (q.device.type == "cpu" and ssm_cache.dtype == torch.float32 and _vllm_cpu_wins(q, v, scale)
            and _is_available("vllm_cpu") and load_backend("vllm_cpu").rows_contiguous(ssm_cache))


def _conv_in_place(x, weight, conv_cache, activation):
    """vLLM's C++ causal conv1d on CPU inputs it can run (``vllm_cpu.conv_refusal``: bf16 x, weight
    and cache, K = 4, C % 32 == 0, an AVX-512 BF16 CPU).

    Measured on this project's 2-core AVX-512-BF16 + AMX machine (1-min load average 2.4),
    C = 8192 (the real models' q | k | v channels), K = 4: ``paged_conv1d_prefill`` of 8 fresh
    sequences of 256 tokens, torch 413 ms, vLLM's kernel 26 ms; ``paged_conv1d_decode`` of 32
    rows (1-min load 1.6), torch 3.07 ms, vLLM's kernel with its staging 0.83 ms.
    """
    return (x.device.type == "cpu" and _is_available("vllm_cpu")
            and load_backend("vllm_cpu").conv_refusal(x, weight, conv_cache, activation) is None)


#: The in-place cache-page ops of ``vllm_cpu`` that eager paged ops may call, each with the rule
#: (over the arguments ``select_in_place`` takes for it) under which it runs.
IN_PLACE_RULES = {
    "paged_gdn_prefill": _gdn_rows_in_place,   # (q, v, ssm_cache, scale)
    "gdn_decode": _gdn_rows_in_place,          # (q, v, ssm_cache, scale)
    "paged_conv1d_prefill": _conv_in_place,    # (x, weight, conv_cache, activation)
    "paged_conv1d_decode": _conv_in_place,     # (x, weight, conv_cache, activation)
}
IN_PLACE_OPS = tuple(IN_PLACE_RULES)


def select_in_place(op_name, *args):
    """The ``vllm_cpu`` function an eager CPU paged op can run on its cache, or None for torch.

    ``op_name`` is one of ``IN_PLACE_OPS`` (the backend functions of those names, which update
    cache pages in place), ``args`` the ones its rule in ``IN_PLACE_RULES`` takes. Chosen where
    that rule holds and ``$VLLM_GDN_BACKEND`` names no other backend. Never for traced code (C++
    calls).
    """
    if op_name not in IN_PLACE_RULES:
        raise ValueError(f"op_name: expected one of {IN_PLACE_OPS}, got {op_name!r}")
    override = os.environ.get(ENV_VAR, "").strip()
    if override not in ("", "auto", "vllm_cpu") or not IN_PLACE_RULES[op_name](*args):
        return None
    return getattr(load_backend("vllm_cpu"), op_name)
