"""Errors raised where trn2 hardware (or the NKI compiler) would refuse a kernel.

Every refusal is a ``ValueError`` subclass whose message names the instruction, the
operand and the limit, so a failing kernel points at the line to fix.
"""


class NkiHardwareError(ValueError):
    """An instruction breaks a documented trn2 limit (shape, buffer, dtype)."""


class NkiCapacityError(NkiHardwareError):
    """Live SBUF or PSUM allocations exceed the core's capacity; the message reports the peak."""


def refuse(op: str, operand: str, problem: str) -> NkiHardwareError:
    """Build the error for ``op``'s ``operand`` breaking a limit described by ``problem``."""
    return NkiHardwareError(f"{op}: {operand} {problem}")
