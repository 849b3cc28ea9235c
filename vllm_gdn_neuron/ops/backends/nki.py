"""The ``nki`` backend: the packed varlen ops on the NKI kernels of ``vllm_gdn_neuron.kernels``.

Implements the contract of ``vllm_gdn_neuron.ops.backends`` (arguments arrive validated and
normalised). The kernels run on trn2 through the real ``nki`` and anywhere else through the
project's CPU interpreter (``kernels.nki_compat``); ``is_available()`` is True only with the
real one, so ``backend="auto"`` picks this backend on Neuron machines only, while
``backend="nki"`` / ``VLLM_GDN_BACKEND=nki`` runs it interpreted on CPU.

Mapping (zero-length sequences pass their state through):

- ``gdn_prefill``: sequences grouped by their length rounded up to the chunk (128); each group
  is one ``gdn_cte`` "schur" call with the sequences on the batch axis, in the head-major
  kernel layout ``[B, H, S, D]``, padded at the end with k = v = 0, g = 0, beta = 0 (exact: a
  padded token leaves the state unchanged, its output rows are dropped), and the group's
  initial states in a fresh buffer the kernel updates in place.
- ``gdn_decode``: ``gdn_recurrent_step`` (fp32 math; q/k/v handed over in fp32) on the
  cache itself (slot rows in place) in the interpreter; with the real NKI, or for a
  non-contiguous cache view, on a gathered copy of the rows that is written back
  (``SLOTS_IN_PLACE``).
- ``conv1d_prefill`` / ``conv1d_decode``: channel-major ``[1, C, T]`` per sequence /
  ``[N, C, 1]`` batch with the gathered slot states, new states written back to the slots.
- ``gdn2_prefill``: ``gdn2_chunked`` on the packed tokens with ``cu_seqlens``.

With ``use_qk_l2norm``, prefill normalises q and k on chip (``gdn_cte``'s own L2 norm; the
zero padding rows stay zero); decode and GDN-2 normalise here, in float32.
"""

import torch

from vllm_gdn_neuron.kernels.conv1d import gdn_conv1d_decode, gdn_conv1d_prefill
from vllm_gdn_neuron.kernels.gdn2 import gdn2_chunked
from vllm_gdn_neuron.kernels.gdn_cte import CHUNK_OF, gdn_cte
from vllm_gdn_neuron.kernels.nki_compat import using_interpreter
from vllm_gdn_neuron.kernels.recurrent_step import gdn_recurrent_step
from vllm_gdn_neuron.kernels.reference.norms import L2NORM_EPS

ALGORITHM = "schur"
# The step kernel addresses cache slots as trace-time constants. Interpreted, that costs
# nothing and the kernel updates the cache in place; compiled by the real NKI, every new slot
# list would be a new kernel, so there the backend gathers the rows and runs the kernel on
# slots 0..N-1 (one kernel per batch size), then writes the rows back.
SLOTS_IN_PLACE = using_interpreter


def is_available():
    """True where the real Neuron Kernel Interface runs the kernels (not the CPU interpreter)."""
    return not using_interpreter


def _l2norm(x):
    """``x * rsqrt(sum(x^2) + 1e-6)`` over the head axis in fp32, back in ``x``'s dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt((x32 * x32).sum(-1, keepdim=True) + L2NORM_EPS)).to(x.dtype)


def _normalised(q, k, use_qk_l2norm):
    return (_l2norm(q), _l2norm(k)) if use_qk_l2norm else (q, k)


def _bounds(cu_seqlens):
    edges = cu_seqlens.tolist()
    return list(zip(edges[:-1], edges[1:]))


def _head_major(x, bounds, padded):
    """The sequences ``bounds`` of ``[T, H, ...]`` tokens as ``[B, H, padded, ...]``, zero rows appended."""
    batch = x.new_zeros((len(bounds), padded) + tuple(x.shape[1:]))
    for i, (start, end) in enumerate(bounds):
        batch[i, :end - start] = x[start:end]
    return batch.transpose(1, 2).contiguous()


def _initial_states(initial_state, n_seq, shape, device):
    if initial_state is None:
        return torch.zeros((n_seq,) + shape, dtype=torch.float32, device=device)
    return initial_state.to(torch.float32).clone()


def _by_padded_length(bounds, chunk):
    """Sequence indices grouped by their length rounded up to ``chunk`` (empty sequences left out)."""
    groups = {}
    for n, (start, end) in enumerate(bounds):
        if end > start:
            groups.setdefault(-(-(end - start) // chunk) * chunk, []).append(n)
    return groups


def gdn_prefill(q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm):
    hv, dk, dv = v.shape[1], q.shape[2], v.shape[2]
    bounds = _bounds(cu_seqlens)
    final = _initial_states(initial_state, len(bounds), (hv, dk, dv), q.device)
    o = torch.zeros(v.shape, dtype=q.dtype, device=q.device)
    for padded, members in _by_padded_length(bounds, CHUNK_OF[ALGORITHM]).items():
        # one kernel call per padded length: the batch axis carries the sequences
        spans = [bounds[n] for n in members]
        states = final[members].contiguous()
        out, _ = gdn_cte(*(_head_major(x, spans, padded) for x in (q, k, v, g, beta)), scale=scale,
                         algorithm=ALGORITHM, recurrent_state=states, use_qk_l2norm=use_qk_l2norm)
        final[members] = states
        for i, (start, end) in enumerate(spans):
            o[start:end] = out[i, :, :end - start].transpose(0, 1)
    return o, final


def gdn_decode(q, k, v, g, beta, state, state_indices, scale, use_qk_l2norm):
    # the step kernel computes in fp32 whatever the input dtype: hand it fp32 (normalised) q/k/v
    out_dtype = q.dtype
    q, k = _normalised(q.float(), k.float(), use_qk_l2norm)
    args = (q.contiguous(), k.contiguous(), v.float().contiguous(), g.contiguous(), beta.contiguous())
    if state.is_contiguous() and SLOTS_IN_PLACE:
        return gdn_recurrent_step(*args, state, state_indices.tolist(), scale).to(out_dtype)
    rows = state[state_indices].contiguous()
    out = gdn_recurrent_step(*args, rows, list(range(rows.shape[0])), scale)
    state[state_indices] = rows
    return out.to(out_dtype)


def gdn2_prefill(q, k, v, g, beta, w, cu_seqlens, initial_state, scale, use_qk_l2norm):
    q, k = _normalised(q, k, use_qk_l2norm)
    return gdn2_chunked(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(),
                        beta.contiguous(), None if w is None else w.contiguous(), cu_seqlens.tolist(),
                        scale=scale, initial_state=None if initial_state is None else initial_state.contiguous())


def conv1d_prefill(x, weight, cu_seqlens, initial_state, activation):
    bounds = _bounds(cu_seqlens)
    channels, width = weight.shape
    final = _initial_states(initial_state, len(bounds), (channels, width), x.device)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    for n, (start, end) in enumerate(bounds):
        if end == start:
            continue
        incoming = None if initial_state is None else final[n:n + 1]
        out, state = gdn_conv1d_prefill(x[start:end].T.unsqueeze(0).contiguous(), weight.contiguous(), incoming,
                                        activation=activation)
        y[start:end] = out[0].T
        final[n] = state[0]
    return y, final


def conv1d_decode(x, weight, state, state_indices, activation):
    rows = state[state_indices].contiguous()
    out, new_rows = gdn_conv1d_decode(x.unsqueeze(-1).contiguous(), rows, weight.contiguous(), activation=activation)
    state[state_indices] = new_rows
    return out[..., 0]
