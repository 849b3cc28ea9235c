"""NKI dtypes as NumPy dtypes; bf16 comes from ``ml_dtypes`` so it is represented exactly.

Engine math runs in float32: :func:`engine_view` reads any tile as float32, and storing a
float32 result into a narrower tile rounds (round-to-nearest-even) at the store.
"""

import ml_dtypes
import numpy as np

float32 = np.dtype(np.float32)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16 = np.dtype(np.float16)
int32 = np.dtype(np.int32)
int16 = np.dtype(np.int16)
int8 = np.dtype(np.int8)
uint8 = np.dtype(np.uint8)

SUPPORTED = (float32, bfloat16, float16, int32, int16, int8, uint8)
FLOATS = (float32, bfloat16, float16)


def canonical(dtype, argument: str = "dtype") -> np.dtype:
    """Return ``dtype`` as one of :data:`SUPPORTED`, or raise a ValueError naming it."""
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved not in SUPPORTED:
        names = ", ".join(d.name for d in SUPPORTED)
        raise ValueError(f"{argument}: expected one of {names}, got {dtype!r}")
    return resolved


def engine_view(array: np.ndarray) -> np.ndarray:
    """``array`` as the float32 values an engine computes with (no copy when already fp32)."""
    if array.dtype == float32:
        return array
    return array.astype(np.float32)
