"""The one import seam between kernels and NKI.

``from vllm_gdn_neuron.kernels.nki_compat import nki, nl, nisa`` gives the real Neuron
Kernel Interface when it is importable (trn2 images with the Neuron SDK) and the project's
CPU interpreter (:mod:`vllm_gdn_neuron.kernels.interp`) otherwise, so one kernel source
runs unchanged on both. ``VLLM_GDN_NKI_INTERPRET=1`` forces the interpreter.
``using_interpreter`` says which one was chosen (decided once, at import).
"""

import importlib
import os

ENV_FORCE_INTERPRETER = "VLLM_GDN_NKI_INTERPRET"


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
    if os.environ.get(ENV_FORCE_INTERPRETER, "") != "1":
        found = _real_nki()
        if found is not None:
            return (*found, False)
    from .interp import nki as interp_nki, nisa as interp_nisa, nl as interp_nl

    return interp_nki, interp_nl, interp_nisa, True


nki, nl, nisa, using_interpreter = _select()

__all__ = ["nki", "nl", "nisa", "using_interpreter", "ENV_FORCE_INTERPRETER"]
