"""Argument checks shared by the public ops: each failure is a ValueError naming the argument,
what was expected and what was given, raised before any work or any write."""

import numbers

import torch

#: Activation dtypes the ops accept for q / k / v and the conv input x.
ACTIVATION_DTYPES = (torch.float32, torch.bfloat16)
#: The conv ops' ``activation`` choices.
ACTIVATIONS = ("silu", None)
#: vLLM's padded-slot marker (``vllm.v1.attention.backends.utils.PAD_SLOT_ID``).
PAD_SLOT_ID = -1
INDEX_DTYPES = (torch.int32, torch.int64)
#: The dtype the gates (g, beta) and the recurrent states must have.
F32 = (torch.float32,)


def _dtype_names(dtypes):
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def _labels(shape):
    """``[(label, size), ...]`` as the error messages show it: ``"T=5, C"``."""
    return ", ".join(label if size is None else f"{label}={size}" for label, size in shape)


def check_tensor(name, x, shape, dtypes=None):
    """Check that ``x`` is a tensor of ``len(shape)`` dims matching ``shape``.

    Args:
        name: argument name used in the error message.
        x: the value to check.
        shape: tuple of (label, size) pairs; size None accepts any size on that axis.
        dtypes: accepted dtypes, or None for any.

    Returns:
        ``x.shape`` as a tuple.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor [{_labels(shape)}], got {type(x).__name__}")
    if x.dim() != len(shape):
        raise ValueError(f"{name}: expected {len(shape)} dims [{_labels(shape)}], got shape {tuple(x.shape)}")
    for axis, (label, size) in enumerate(shape):
        if size is not None and x.shape[axis] != size:
            raise ValueError(
                f"{name}: expected shape [{_labels(shape)}], got {tuple(x.shape)} ({label} = {x.shape[axis]})")
    if dtypes is not None and x.dtype not in dtypes:
        raise ValueError(f"{name}: expected dtype {_dtype_names(dtypes)}, got {x.dtype}")
    return tuple(x.shape)


def check_same_device(**tensors):
    """All given tensors (None entries skipped) live on one device; returns it."""
    present = {name: t for name, t in tensors.items() if t is not None}
    first_name, first = next(iter(present.items()))
    for name, t in present.items():
        if t.device != first.device:
            raise ValueError(f"{name}: expected device {first.device} (the device of {first_name}), got {t.device}")
    return first.device


def check_heads(num_k_heads, num_v_heads):
    if num_k_heads == 0 or num_v_heads % num_k_heads:
        raise ValueError(f"v: expected Hv to be a multiple of Hk = {num_k_heads}, got Hv = {num_v_heads}")


def check_qkv(q, k, v, rows_label, rows=None):
    """q, k ``[rows, Hk, Dk]``, v ``[rows, Hv, Dv]`` in one activation dtype, ``Hv % Hk == 0``.

    Returns:
        ``(rows, Hk, Dk, Hv, Dv)``.
    """
    rows, num_k_heads, dim_k = check_tensor("q", q, ((rows_label, rows), ("Hk", None), ("Dk", None)),
                                            ACTIVATION_DTYPES)
    check_tensor("k", k, ((rows_label, rows), ("Hk", num_k_heads), ("Dk", dim_k)), (q.dtype,))
    _, num_v_heads, dim_v = check_tensor("v", v, ((rows_label, rows), ("Hv", None), ("Dv", None)), (q.dtype,))
    check_heads(num_k_heads, num_v_heads)
    return rows, num_k_heads, dim_k, num_v_heads, dim_v


def check_conv_weight(weight, channels):
    """The depthwise conv kernel ``[C, K]``, K >= 1; returns K."""
    _, width = check_tensor("weight", weight, (("C", channels), ("K", None)), ACTIVATION_DTYPES)
    if width < 1:
        raise ValueError(f"weight: expected a kernel width K >= 1, got {width}")
    return width


def conv_state_dtypes(x):
    """Conv states may be float32 or the activation dtype of ``x``."""
    return (torch.float32,) if x.dtype == torch.float32 else (torch.float32, x.dtype)


def check_cu_seqlens(cu_seqlens, num_tokens):
    """Validate packed-sequence boundaries; returns them as an int64 CPU tensor."""
    check_tensor("cu_seqlens", cu_seqlens, (("N+1", None),), INDEX_DTYPES)
    if cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens: expected at least 2 entries (N >= 1 sequences), got {cu_seqlens.numel()}")
    bounds = cu_seqlens.detach().to("cpu", torch.int64)
    if bounds[0] != 0:
        raise ValueError(f"cu_seqlens: expected to start at 0, got {int(bounds[0])}")
    steps = bounds[1:] - bounds[:-1]
    if (steps < 0).any():
        at = int(torch.nonzero(steps < 0)[0])
        raise ValueError(f"cu_seqlens: expected non-decreasing values, got {int(bounds[at])} then "
                         f"{int(bounds[at + 1])} at index {at}")
    if bounds[-1] != num_tokens:
        raise ValueError(f"cu_seqlens: expected to end at T = {num_tokens}, got {int(bounds[-1])}")
    return bounds


def check_state_indices(state_indices, num_rows, num_slots, device):
    """Validate cache-slot indices: in [0, num_slots) or PAD_SLOT_ID, and no slot twice.

    Returns:
        ``(indices, keep)``: int64 indices on ``device`` (the state's), and the boolean mask of
        the rows that are not padding (None when no row is padding).
    """
    check_tensor("state_indices", state_indices, (("N", num_rows),), INDEX_DTYPES)
    indices = state_indices.to(device=device, dtype=torch.int64)
    host = indices.detach().cpu()
    pad = host == PAD_SLOT_ID
    real = host[~pad]
    bad = (real < 0) | (real >= num_slots)
    if bad.any():
        raise ValueError(f"state_indices: expected values in [0, {num_slots}) or PAD_SLOT_ID = {PAD_SLOT_ID}, "
                         f"got {int(real[bad][0])}")
    if real.numel() != torch.unique(real).numel():
        values, counts = torch.unique(real, return_counts=True)
        raise ValueError(f"state_indices: expected distinct slots, got slot {int(values[counts > 1][0])} "
                         f"{int(counts[counts > 1][0])} times")
    return indices, (~pad).to(indices.device) if pad.any() else None


def check_decay(name, g):
    """g is a natural-log decay: every entry <= 0 (NaN fails too)."""
    if g.numel() and not bool(g.max() <= 0):
        raise ValueError(f"{name}: expected a natural-log decay <= 0, got max {float(g.max())}")


def resolve_scale(scale, head_dim):
    if scale is None:
        return head_dim ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise ValueError(f"scale: expected a real number or None (= Dk ** -0.5), got {type(scale).__name__}")
    return float(scale)


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {value!r}")
