"""Argument checks shared by the kernels' public entry points.

Each raises ``ValueError`` naming the argument, what was expected and what was given, before
any kernel instruction runs. Arrays may be NumPy arrays or torch tensors.
"""

FLOAT_DTYPES = ("float32", "bfloat16", "float16")
#: Dk and Dv at most one partition tile (what a model shell checks at start-up, without NKI).
MAX_HEAD_DIM = 128


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


def check_token_major_qkv(names, query, key, value, rows, max_head_dim):
    """query, key ``[rows, Hk, Dk]`` and value ``[rows, Hv, Dv]`` in one float dtype.

    ``names`` are the caller's argument names for the three arrays; ``rows`` names the
    leading axis in messages (``"T"`` packed tokens, ``"N"`` sequences). Also checks
    ``Hv % Hk == 0`` and both head sizes against ``max_head_dim``.

    Returns:
        ``(leading, Hk, Dk, Hv, Dv)``.
    """
    q_name, k_name, v_name = names
    check_rank(q_name, query, 3, f"[{rows}, Hk, Dk]")
    check_dtype(q_name, query, FLOAT_DTYPES)
    leading, hk, dk = query.shape
    check_shape(k_name, key, (leading, hk, dk), f"[{rows}, Hk, Dk]")
    check_same_dtype(k_name, key, q_name, query)
    check_rank(v_name, value, 3, f"[{rows}, Hv, Dv]")
    check_same_dtype(v_name, value, q_name, query)
    hv, dv = value.shape[1], value.shape[2]
    if value.shape[0] != leading:
        raise ValueError(f"{v_name} must have {rows} = {leading} rows, got shape {tuple(value.shape)}")
    if hv % hk:
        raise ValueError(
            f"Hv ({v_name}.shape[1]) must be a multiple of Hk ({k_name}.shape[1]), got Hv={hv}, Hk={hk}")
    check_at_most(f"Dk ({k_name}.shape[2])", dk, max_head_dim, "one partition tile")
    check_at_most(f"Dv ({v_name}.shape[2])", dv, max_head_dim, "one partition tile")
    return leading, hk, dk, hv, dv


def check_slots(name, slots, num_slots, count):
    """``slots``: ``count`` distinct ints in ``[0, num_slots)`` (a sequence, or a tensor read on the host)."""
    slots = [int(s) for s in (slots.tolist() if hasattr(slots, "tolist") else slots)]
    if len(slots) != count:
        raise ValueError(f"{name} must hold {count} slot indices (one per sequence), got {len(slots)}")
    bad = [s for s in slots if not 0 <= s < num_slots]
    if bad:
        raise ValueError(f"{name} must lie in [0, {num_slots}), got {bad}")
    if len(set(slots)) != len(slots):
        raise ValueError(f"{name} must not repeat a slot, got {slots}")
    return tuple(slots)
