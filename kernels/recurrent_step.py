"""One GDN decode step for a batch of sequences, on their cache slots in place, as an NKI kernel.

API (documented here, used by the ``nki`` backend's ``gdn_decode``)::

    gdn_recurrent_step(query, key, value, g_log, beta, state, state_indices, scale) -> out

- ``query``, ``key``: ``[N, Hk, Dk]`` (L2-normalised), ``value``: ``[N, Hv, Dv]``, one dtype
  (fp32, bf16 or fp16; loaded into fp32 tiles); ``g_log``, ``beta``: ``[N, Hv]`` fp32.
- ``state``: ``[num_slots, Hv, Dk, Dv]`` fp32, the whole recurrent cache; row
  ``state_indices[n]`` holds sequence ``n``'s state and is advanced one token IN PLACE;
  no other row is read or written.
- ``state_indices``: ``N`` distinct slot numbers (an integer tensor, or a sequence for tests);
  they reach the kernel as a ``[1, N]`` int32 tensor read into a register per sequence, so
  the state DMAs address their slot at run time and one compiled kernel serves every slot
  assignment of a batch size.
- returns ``out`` ``[N, Hv, Dv]`` in q's dtype.

Per sequence ``n`` and value head ``h`` (key head ``h // (Hv // Hk)``), with ``S`` the slot's
``[Dk, Dv]`` state on ``Dk`` partitions, all fp32::

    kS    = k^T S                       TensorE  [1, Dv]
    v_new = beta * (v - e^g kS)         VectorE  [1, Dv]
    S     = e^g S + k v_new^T           TensorE outer product (K = 1) + one fused VectorE op
    o     = scale * q^T S               TensorE  [1, Dv]

Design notes: ``docs/kernels/recurrent_step.md``; torch mirror: ``recurrent_step_torch.py``.
"""

from . import tiles as tl
from .checks import check_dtype, check_rank, check_shape, check_slots, check_token_major_qkv
from .gdn_cte import MAX_HEAD_DIM
from .nki_call import NkiOp, index_tensor
from .nki_compat import nki, nisa, nl


def _broadcast_gate(gate, n, h, hv, partitions):
    """Element ``gate[n, h]`` of an ``[N, Hv]`` HBM tensor on ``partitions`` partitions, ``[P, 1]`` fp32."""
    return tl.load(gate.ap(pattern=[[0, partitions], [1, 1]], offset=n * hv + h))


@nki.jit
def recurrent_step_kernel(query, key, value, g_log, beta, state, state_indices, scale=1.0):
    """The NKI kernel behind :func:`gdn_recurrent_step` (arguments already checked).

    ``state_indices`` is a ``[1, N]`` int32 tensor; sequence ``n`` reads it into a register, so
    its state row is addressed at run time (one compiled kernel for every slot assignment).
    Sequences are a device loop.

    Returns:
        ``(out [N, Hv, Dv] in q's dtype, state)`` (the cache, updated in place).
    """
    n_seq, hk_size, dk = query.shape
    hv_size = value.shape[1]
    dv = value.shape[2]
    ratio = hv_size // hk_size
    out = nl.ndarray((n_seq, hv_size, dv), dtype=query.dtype, buffer=nl.shared_hbm)
    slots = tl.load(state_indices)
    for n in nl.affine_range(n_seq):
        slot = nisa.register_alloc(0)
        nisa.register_load(slot, slots[0:1, n:n + 1])
        for hk in range(hk_size):
            k_col = tl.load(key[n, hk, :].reshape((dk, 1)), nl.float32)
            q_col = tl.load(query[n, hk, :].reshape((dk, 1)), nl.float32)
            k_row = tl.load(key[n, hk:hk + 1, :], nl.float32)
            for r in range(ratio):
                h = hk * ratio + r
                s = tl.load(state[slot, h])
                v_row = tl.load(value[n, h:h + 1, :], nl.float32)
                decay = tl.activation(_broadcast_gate(g_log, n, h, hv_size, dk), nl.exp)   # [Dk, 1] e^g
                b_col = tl.load(beta[n, h:h + 1].reshape((1, 1)))
                minus_decay = tl.scalar(decay[0:1, :], nl.multiply, -1.0)
                k_s = tl.matmul(k_col, s)                                                    # [1, Dv]
                residual = tl.scalar_tensor(k_s, nl.multiply, minus_decay, nl.add, v_row)   # v - e^g kS
                v_new = tl.scalar(residual, nl.multiply, b_col)
                s = tl.scalar_tensor(s, nl.multiply, decay, nl.add, tl.matmul(k_row, v_new))
                tl.store(out[n, h:h + 1, :], tl.scalar(tl.matmul(q_col, s), nl.multiply, scale, dtype=query.dtype))
                tl.store(state[slot, h], s)
    return out, state


RECURRENT_STEP = NkiOp("gdn_recurrent_step", recurrent_step_kernel, mutates_args=("state",))


def gdn_recurrent_step(query, key, value, g_log, beta, state, state_indices, scale=1.0):
    """Advance ``N`` sequences one token on their cache slots in place; see the module docstring.

    Raises:
        ValueError: naming the argument, before anything is read or written.
    """
    n_seq, hk, dk, hv, dv = check_token_major_qkv(("query", "key", "value"), query, key, value, "N", MAX_HEAD_DIM)
    for name, gate in (("g_log", g_log), ("beta", beta)):
        check_shape(name, gate, (n_seq, hv), "[N, Hv]")
        check_dtype(name, gate, ("float32",))
    check_rank("state", state, 4, "[num_slots, Hv, Dk, Dv]")
    check_shape("state", state, (state.shape[0], hv, dk, dv), "[num_slots, Hv, Dk, Dv]")
    check_dtype("state", state, ("float32",))
    if hasattr(state, "is_contiguous") and not state.is_contiguous():
        raise ValueError("state must be contiguous (its slot rows are updated in place)")
    check_slots("state_indices", state_indices, state.shape[0], n_seq)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise ValueError(f"scale must be a Python float, got {scale!r}")
    out, _ = RECURRENT_STEP(query, key, value, g_log, beta, state, index_tensor(state_indices, query),
                            scale=float(scale))
    return out
