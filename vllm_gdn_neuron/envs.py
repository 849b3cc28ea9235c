"""The environment variables the package reads: their names, and one reader each (and the one
it sets: ``LD_PRELOAD``, by ``vllm-gdn-serve`` for the processes vLLM starts).

Each is read where a decision made once needs it: the plugin's at registration, the backend
choice when a GDN layer is built, the serving CLI's at its start; never per op call. (The
kernels, which import nothing of this package, read their one switch themselves:
``kernels.nki_compat``'s ``VLLM_GDN_NKI_INTERPRET``.)
"""

import os

#: The GDN layers' backend: ``auto`` (default), ``torch``, ``nki`` or ``vllm_cpu``
#: (``vllm_gdn_neuron.ops.phases``).
GDN_BACKEND = "VLLM_GDN_BACKEND"
#: ``1``: the plugin registers nothing.
DISABLE = "VLLM_GDN_NEURON_DISABLE"
#: ``1``: the plugin registers its CPU classes on any vLLM platform.
ANY_PLATFORM = "VLLM_GDN_NEURON_ANY_PLATFORM"
#: GiB of memory ``vllm-gdn-serve`` sizes the server for.
SERVE_MEMORY_GIB = "VLLM_GDN_SERVE_MEMORY_GIB"
#: vLLM's CPU KV-cache space in GiB (vLLM's own variable, read by the CLI's sizing).
CPU_KVCACHE_SPACE = "VLLM_CPU_KVCACHE_SPACE"
#: vLLM's CPU worker thread binding (vLLM's own variable, read by the CLI's report).
CPU_OMP_THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
#: The C++ compiler torch's Inductor calls in vLLM's compiled mode (Inductor's own variable,
#: read by the CLI's check that one is installed).
CXX = "CXX"
#: The libraries the dynamic linker loads first in the processes vLLM starts (set by
#: ``vllm-gdn-serve``: ``vllm_gdn_neuron.cpu_preload``).
LD_PRELOAD = "LD_PRELOAD"


def gdn_backend() -> str:
    """``$VLLM_GDN_BACKEND`` stripped, ``"auto"`` when unset or empty."""
    return os.environ.get(GDN_BACKEND, "").strip() or "auto"


def flag(name: str) -> bool:
    """The switch ``name`` is set to ``1``."""
    return os.environ.get(name) == "1"


def value(name: str) -> "str | None":
    """``$name``, or None when unset or empty."""
    return os.environ.get(name) or None


def environment() -> dict:
    """A copy of the whole environment (for code that reads several vLLM variables at once)."""
    return dict(os.environ)


def set_for_children(name: str, value: str) -> None:
    """Set ``$name`` in this process's environment, which the processes it starts inherit."""
    os.environ[name] = value
