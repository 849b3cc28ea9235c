"""The one import seam between kernels and NKI.

``from vllm_gdn_neuron.kernels.nki_compat import nki, nl, nisa`` gives the real Neuron
Kernel Interface when it is importable (trn2 images with the Neuron SDK). The project's CPU
interpreter (:mod:`vllm_gdn_neuron.kernels.interp`) serves instead only on an explicit opt-in:
``VLLM_GDN_NKI_INTERPRET=1`` (read here, once: the kernels import nothing of the package; it
also wins over the SDK), or a program that imported the interpreter before the kernels (the
tests, the cost-model benchmarks). No serving module imports it. One kernel source runs
unchanged on both; ``using_interpreter`` says which one was chosen (decided once, at import).
With neither, importing a kernel raises ImportError saying so.
"""

import importlib
import os
import sys

ENV_FORCE_INTERPRETER = "VLLM_GDN_NKI_INTERPRET"
INTERPRETER = "vllm_gdn_neuron.kernels.interp"


def _real_nki():
    """``(nki, nki.language, nki.isa)`` of a working Neuron SDK install, or None.

    PyPI's ``nki`` is an empty placeholder: a package without ``jit`` does not count.
    """
    try:
        real = importlib.import_module("nki")
        language = importlib.import_module("nki.language")
        isa = importlib.import_module("nki.isa")
    except ImportError:
        return None
    if not callable(getattr(real, "jit", None)):
        return None
    return real, language, isa


def _select():
    opted_in = os.environ.get(ENV_FORCE_INTERPRETER, "") == "1"
    if not opted_in:
        found = _real_nki()
        if found is not None:
            return (*found, False)
    interpreter = sys.modules.get(INTERPRETER)
    if interpreter is None and opted_in:
        interpreter = importlib.import_module(INTERPRETER)
    if interpreter is None:
        raise ImportError(f"the NKI kernels need the Neuron SDK's nki, not importable here, or the CPU interpreter: "
                          f"set {ENV_FORCE_INTERPRETER}=1 (or import {INTERPRETER} before the kernels) to run them "
                          f"interpreted")
    return interpreter.nki, interpreter.nl, interpreter.nisa, True


nki, nl, nisa, using_interpreter = _select()

__all__ = ["nki", "nl", "nisa", "using_interpreter", "ENV_FORCE_INTERPRETER", "INTERPRETER"]
