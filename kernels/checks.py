"""Argument checks shared by the kernels' public entry points.

Each raises ``ValueError`` naming the argument, what was expected and what was given, before
any kernel instruction runs. Arrays may be NumPy arrays or torch tensors.
"""

FLOAT_DTYPES = ("float32", "bfloat16", "float16")


def dtype_name(array):
    """``'float32'``, ``'bfloat16'``, ... for a NumPy array or a torch tensor."""
    return str(array.dtype).replace("torch.", "")


def check_rank(name, array, rank, layout):
    if array.ndim != rank:
        raise ValueError(f"{name} must have rank {rank} ({layout}), got shape {tuple(array.shape)}")


def check_shape(name, array, expected, layout):
    if tuple(array.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {layout} = {tuple(expected)}, got {tuple(array.shape)}")


def check_dtype(name, array, allowed):
    if dtype_name(array) not in allowed:
        raise ValueError(f"{name} must have dtype {' or '.join(allowed)}, got {dtype_name(array)}")


def check_same_dtype(name, array, reference_name, reference):
    if dtype_name(array) != dtype_name(reference):
        raise ValueError(
            f"{name} must have the dtype of {reference_name} ({dtype_name(reference)}), got {dtype_name(array)}")


def check_at_most(name, value, limit, what):
    if value > limit:
        raise ValueError(f"{name} must be <= {limit} ({what}), got {value}")


def check_multiple(name, value, multiple, what):
    if value % multiple:
        raise ValueError(f"{name} must be a multiple of {multiple} ({what}), got {value}")


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def check_positive_int(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def check_slots(name, slots, num_slots, count):
    """``slots``: a sequence of ``count`` distinct ints in ``[0, num_slots)``."""
    slots = [int(s) for s in slots]
    if len(slots) != count:
        raise ValueError(f"{name} must hold {count} slot indices (one per sequence), got {len(slots)}")
    bad = [s for s in slots if not 0 <= s < num_slots]
    if bad:
        raise ValueError(f"{name} must lie in [0, {num_slots}), got {bad}")
    if len(set(slots)) != len(slots):
        raise ValueError(f"{name} must not repeat a slot, got {slots}")
    return tuple(slots)
