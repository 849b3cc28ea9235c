"""Byte units and dtype sizes, and sizes and counts as people read them: a unit that fits the value
(``230 k``, ``3.1 MiB``, ``1.37 GiB``)."""

KiB, MiB, GiB = 2**10, 2**20, 2**30

#: Bytes per element, by the dtype names of checkpoints' configs and of vLLM's ``--dtype`` and
#: ``--kv-cache-dtype`` (``fp8``: vLLM's one-byte cache).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


def format_bytes(count: float) -> str:
    """``count`` bytes in the largest binary unit it reaches: ``512 B``, ``2.0 KiB``, ``3.1 MiB``, ``1.37 GiB``.

    A negative count keeps its sign and takes the unit of its magnitude.
    """
    magnitude = abs(count)
    if magnitude >= GiB:
        return f"{count / GiB:.2f} GiB"
    if magnitude >= MiB:
        return f"{count / MiB:.1f} MiB"
    if magnitude >= KiB:
        return f"{count / KiB:.1f} KiB"
    return f"{count:.0f} B"


def format_count(count: int) -> str:
    """A count with three significant digits and a decimal prefix: ``230 k``, ``737 M``, ``1.88 B``, ``42``."""
    for scale, prefix in ((10**9, "B"), (10**6, "M"), (10**3, "k")):
        if abs(count) >= scale:
            return f"{count / scale:.3g} {prefix}"
    return str(count)
