"""The interpreter's stand-in for the top-level ``nki`` package: ``nki.jit``, ``nki.language``, ``nki.isa``."""

from . import isa, language  # noqa: F401 - nki.isa / nki.language
from .jit import Kernel, jit  # noqa: F401

__all__ = ["jit", "Kernel", "language", "isa"]
