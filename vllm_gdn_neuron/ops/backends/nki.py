"""The ``nki`` backend: the GDN ops on the NKI kernels, through ``kernels.adapter``.

Two sets of ops over the one adapter: the paged ops a layer binds (``ops.paged``'s signatures,
both shells: ``vllm_gdn_neuron.ops.phases`` chose ``nki``), and the packed varlen ops of the
public op contract (``vllm_gdn_neuron.ops.backends``).

Implements the contract of ``vllm_gdn_neuron.ops.backends`` (arguments arrive validated and
normalised). Every kernel launch goes through the adapter (``vllm_gdn_neuron.kernels.adapter``,
one ``NkiOp`` per kernel, shaped like torch-neuronx's NKI custom ops); the kernels run on
trn2 through the real ``nki`` and anywhere else through the project's CPU interpreter.
``is_available()`` is True only with the real one, so ``backend="auto"`` picks this backend on
Neuron machines only, while ``backend="nki"`` / ``VLLM_GDN_BACKEND=nki`` runs it interpreted.

Mapping (zero-length sequences pass their state through):

- ``gdn_prefill``: sequences grouped by their length rounded up to the chunk (128); each group
  is one bucket launch (``adapter.gdn_prefill``) with the sequences on the batch axis, in the
  head-major kernel layout ``[B, H, S, D]``, padded at the end with k = v = 0, g = 0,
  beta = 0 (exact: a padded token leaves the state unchanged; its output rows are dropped);
  the group's initial states sit in a fresh buffer that serves as the kernel's state cache.
- ``gdn_decode`` / ``conv1d_decode``: one launch on the cache itself, the slot indices passed
  as a tensor (rows updated in place by the kernel); a non-contiguous cache view is
  gathered and written back.
- ``conv1d_prefill``: one bucket launch ``[B, C, T_max]`` with the sequence lengths as a tensor;
  the initial states sit in the returned final-state buffer.

With ``use_qk_l2norm``, prefill normalises q and k on chip (``gdn_cte``'s own L2 norm; the
zero padding rows stay zero); decode normalises here, in float32.
"""

import torch

from vllm_gdn_neuron.kernels import adapter
from vllm_gdn_neuron.kernels.nki_compat import using_interpreter
from vllm_gdn_neuron.kernels.l2norm import l2norm

from .. import paged
from ..step import DecodeStep, PrefillStep
from ..validation import resolve_scale
from .torch.common import prepare_qk


def is_available():
    """True where the real Neuron Kernel Interface runs the kernels (not the CPU interpreter)."""
    return not using_interpreter


def _normalised(q, k, use_qk_l2norm):
    return (l2norm(q), l2norm(k)) if use_qk_l2norm else (q, k)


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
    for padded, members in _by_padded_length(bounds, adapter.GDN_PREFILL_CHUNK).items():
        # one kernel call per padded length: the batch axis carries the sequences
        spans = [bounds[n] for n in members]
        states = final[members].contiguous()
        slots = torch.arange(len(members), device=q.device)
        out = adapter.gdn_prefill(*(_head_major(x, spans, padded) for x in (q, k, v, g, beta)), states, slots, scale,
                                  use_qk_l2norm=use_qk_l2norm, initial_state=initial_state is not None)
        final[members] = states
        for i, (start, end) in enumerate(spans):
            o[start:end] = out[i, :, :end - start].transpose(0, 1)
    return o, final


def _in_place(cache, state_indices, launch):
    """``launch(cache_rows, slots)`` on the cache itself, or on a gathered copy of a non-contiguous view."""
    if cache.is_contiguous():
        return launch(cache, state_indices)
    rows = cache[state_indices].contiguous()
    out = launch(rows, torch.arange(rows.shape[0], device=rows.device))
    cache[state_indices] = rows
    return out


def gdn_decode(q, k, v, g, beta, state, state_indices, scale, use_qk_l2norm):
    # the step kernel computes in fp32 whatever the input dtype: hand it fp32 (normalised) q/k/v
    out_dtype = q.dtype
    q, k = _normalised(q.float(), k.float(), use_qk_l2norm)
    args = (q.contiguous(), k.contiguous(), v.float().contiguous(), g.contiguous(), beta.contiguous())
    out = _in_place(state, state_indices, lambda cache, slots: adapter.gdn_decode(*args, cache, slots, scale))
    return out.to(out_dtype)


def conv1d_prefill(x, weight, cu_seqlens, initial_state, activation):
    bounds = _bounds(cu_seqlens)
    channels, width = weight.shape
    final = _initial_states(initial_state, len(bounds), (channels, width), x.device)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    live = [n for n, (start, end) in enumerate(bounds) if end > start]
    if not live:
        return y, final
    longest = max(bounds[n][1] - bounds[n][0] for n in live)
    batch = x.new_zeros((len(live), channels, longest))
    for i, n in enumerate(live):
        start, end = bounds[n]
        batch[i, :, :end - start] = x[start:end].T
    lengths = torch.tensor([bounds[n][1] - bounds[n][0] for n in live], device=x.device)
    states = final[live].contiguous()
    out = adapter.conv1d_prefill(batch, weight.contiguous(), states, torch.arange(len(live), device=x.device),
                                 lengths, activation=activation, initial_state=initial_state is not None)
    final[live] = states
    for i, n in enumerate(live):
        start, end = bounds[n]
        y[start:end] = out[i, :, :end - start].T
    return y, final


def conv1d_decode(x, weight, state, state_indices, activation):
    weight = weight.contiguous()
    return _in_place(state, state_indices,
                     lambda cache, slots: adapter.conv1d_decode(x.contiguous(), weight, cache, slots, activation))


# --- the paged ops --------------------------------------------------------------------
# Same arguments, step metadata and results as ``ops.paged``'s; every kernel launch goes
# through the adapter: decode runs ``gdn_conv1d_decode`` and the recurrent step on the step's
# pages, prefill runs ``gdn_conv1d_prefill`` and ``gdn_cte`` on a right-padded bucket.
# Layout changes are static-shape tensor arithmetic (no host read):
#
# - prefill: the packed tokens ``[T, ...]`` of the step's S sequences scatter into a head-major
#   bucket ``[S, H, L, D]`` (L = T rounded up to the kernels' 128-token chunk), each sequence
#   from its own row's column 0, the rest zeros: k = v = 0, g = beta = 0 leaves a state exact,
#   so padding needs no lengths; the outputs gather back to ``[T, ...]``. A padding sequence
#   (length 0) is given length 1 for the conv kernel (its one zero column only touches the
#   pad page).
# - states: the kernels read every sequence's page (``initial_state=True``); a sequence
#   without ``has_state`` has its page zeroed first (``torch.where``, NaN-safe like ``paged``).
# - the kernels keep float32 states: caches of another dtype go through a float32 copy.


def _zero_fresh_pages(cache, step):
    """Zero the pages of the step's sequences that start without a state (whole rows)."""
    rows = cache.index_select(0, step.pages)
    keep = step.has_state.view((-1,) + (1,) * (rows.dim() - 1))
    cache.index_copy_(0, step.pages, torch.where(keep, rows, 0.0))


class _Bucket:
    """Where each packed token of a ``PrefillStep`` sits in a right-padded ``[S, L]`` bucket."""

    def __init__(self, step: PrefillStep):
        self.num_seqs = step.num_seqs
        self.length = -(-step.num_tokens // adapter.GDN_PREFILL_CHUNK) * adapter.GDN_PREFILL_CHUNK
        tokens = torch.arange(step.num_tokens, device=step.pages.device)
        position = tokens - step.query_start_loc.index_select(0, step.token_seq)
        # Padding tokens (token_seq == S) land in an extra row that is dropped.
        self.flat = step.token_seq * self.length + position
        self.real = step.is_real_token
        self.seq_lens = (step.query_start_loc[1:] - step.query_start_loc[:-1]).clamp_min(1)

    def scatter(self, x):
        """``[T, *rest]`` -> ``[S, L, *rest]`` (zeros where no token sits)."""
        out = x.new_zeros(((self.num_seqs + 1) * self.length,) + tuple(x.shape[1:]))
        out.index_copy_(0, self.flat, x)
        return out.view((self.num_seqs + 1, self.length) + tuple(x.shape[1:]))[: self.num_seqs]

    def gather(self, y):
        """``[S, L, *rest]`` -> ``[T, *rest]``, padding tokens zero."""
        flat = y.reshape((-1,) + tuple(y.shape[2:]))
        picked = flat.index_select(0, torch.where(self.real, self.flat, 0))
        return torch.where(self.real.view((-1,) + (1,) * (picked.dim() - 1)), picked, 0)


def _float32_run(cache, run):
    """``run(cache)`` on a contiguous float32 cache; a strided view, or a cache of another dtype
    (vLLM's bfloat16 pages), is updated through a float32 copy of the whole cache."""
    if cache.is_contiguous() and cache.dtype == torch.float32:
        return run(cache)
    work = cache.float().contiguous()
    result = run(work)
    cache.copy_(work)
    return result


def paged_conv1d_decode(x, weight, conv_cache, step, *, activation="silu"):
    """:func:`~vllm_gdn_neuron.ops.paged.paged_conv1d_decode` through ``gdn_conv1d_decode``."""
    paged.check_step_kind(step, DecodeStep)
    paged.check_conv(x, weight, conv_cache, "N", step.num_rows, activation)
    real = step.is_real[:, None]
    y = _float32_run(conv_cache, lambda cache: adapter.conv1d_decode(
        torch.where(real, x, 0), weight, cache, step.pages, activation=activation))
    return torch.where(real, y, 0).to(x.dtype)


def paged_gdn_decode(q, k, v, g, beta, ssm_cache, step, *, scale=None, use_qk_l2norm=False):
    """:func:`~vllm_gdn_neuron.ops.paged.paged_gdn_decode` through the recurrent-step kernel (float32 inputs)."""
    paged.check_step_kind(step, DecodeStep)
    dim_k = paged.check_gdn(q, k, v, g, beta, ssm_cache, "N", step.num_rows)
    scale = resolve_scale(scale, dim_k)
    real = step.is_real[:, None]
    # Normalised (if asked) and scaled here; padding rows step on zeros, leaving their page as is.
    q, k = prepare_qk(q, k, scale, bool(use_qk_l2norm))
    q, k, v_in = (torch.where(real[..., None], t, 0.0) for t in (q, k, v.float()))
    g, beta = torch.where(real, g, 0.0), torch.where(real, beta, 0.0)
    o = _float32_run(ssm_cache, lambda cache: adapter.gdn_decode(q, k, v_in, g, beta, cache, step.pages, 1.0))
    return torch.where(real[..., None], o, 0.0).to(v.dtype)


def paged_conv1d_prefill(x, weight, conv_cache, step, *, activation="silu"):
    """:func:`~vllm_gdn_neuron.ops.paged.paged_conv1d_prefill` through ``gdn_conv1d_prefill`` on a bucket."""
    paged.check_step_kind(step, PrefillStep)
    paged.check_conv(x, weight, conv_cache, "T", step.num_tokens, activation)
    bucket = _Bucket(step)
    channel_major = bucket.scatter(x).transpose(1, 2).contiguous()       # [S, C, L]

    def run(cache):
        _zero_fresh_pages(cache, step)
        return adapter.conv1d_prefill(channel_major, weight, cache, step.pages, bucket.seq_lens,
                                      activation=activation, initial_state=True)

    y = _float32_run(conv_cache, run)                                   # [S, C, L]
    return bucket.gather(y.transpose(1, 2)).to(x.dtype)


def paged_gdn_prefill(q, k, v, g, beta, ssm_cache, step, *, scale=None, use_qk_l2norm=False):
    """:func:`~vllm_gdn_neuron.ops.paged.paged_gdn_prefill` through ``gdn_cte`` on a bucket."""
    paged.check_step_kind(step, PrefillStep)
    dim_k = paged.check_gdn(q, k, v, g, beta, ssm_cache, "T", step.num_tokens)
    scale = resolve_scale(scale, dim_k)
    bucket = _Bucket(step)

    def head_major(t):                                                     # [T, H, ...] -> [S, H, L, ...]
        return bucket.scatter(t).transpose(1, 2).contiguous()

    def run(cache):
        _zero_fresh_pages(cache, step)
        return adapter.gdn_prefill(head_major(q), head_major(k), head_major(v), head_major(g), head_major(beta),
                                   cache, step.pages, scale, use_qk_l2norm=bool(use_qk_l2norm),
                                   initial_state=True)

    o = _float32_run(ssm_cache, run)                                    # [S, Hv, L, Dv]
    return bucket.gather(o.transpose(1, 2))
