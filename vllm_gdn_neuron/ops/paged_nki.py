"""The paged GDN ops of :mod:`.paged` through the NKI kernels (``kernels.adapter``).

Same arguments, step metadata and results as ``paged_conv1d_decode``, ``paged_gdn_decode``,
``paged_conv1d_prefill`` and ``paged_gdn_prefill``; the Neuron shell's GatedDeltaNet layer
calls these on a Neuron device (and, in the CPU harness, with the NKI interpreter behind the
adapter). Every kernel launch goes through the adapter: decode runs ``gdn_conv1d_decode`` and
the recurrent step on the step's pages, prefill runs ``gdn_conv1d_prefill`` and ``gdn_cte``
on a right-padded bucket.

Layout changes are static-shape tensor arithmetic (no host read):

- prefill: the packed tokens ``[T, ...]`` of the step's S sequences scatter into a head-major
  bucket ``[S, H, L, D]`` (L = T rounded up to the kernels' 128-token chunk), each sequence
  from its own row's column 0, the rest zeros: k = v = 0, g = beta = 0 leaves a state exact,
  so padding needs no lengths; the outputs gather back to ``[T, ...]``. A padding sequence
  (length 0) is given length 1 for the conv kernel (its one zero column only touches the
  pad page).
- states: the kernels read every sequence's page (``initial_state=True``); a sequence
  without ``has_state`` has its page zeroed first (``torch.where``, NaN-safe like ``paged``).

The kernels keep float32 states: a bfloat16 ``ssm_cache`` is refused (the torch ops take one).
"""

import sys

import torch

from ..kernels import adapter
from . import dispatch
from .backends.torch.common import prepare_qk
from .paged import _check_conv, _check_gdn, _check_step
from .step import DecodeStep, PrefillStep
from .validation import resolve_scale


def select(backend, device):
    """The paged ops a layer runs: this module where ``backend`` resolves to ``nki`` for
    ``device`` (``"auto"``: ``$VLLM_GDN_BACKEND``, else nki on a Neuron device), else ``ops``
    (the torch math of :mod:`.paged`)."""
    if dispatch.backend_name(backend, "gdn_decode", device) == "nki":
        return sys.modules[__name__]
    from vllm_gdn_neuron import ops

    return ops


def _check_state_dtype(name, cache):
    if cache.dtype != torch.float32:
        raise ValueError(f"{name}: the nki paged ops keep float32 states, got {cache.dtype}")


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


def _contiguous_run(cache, run):
    """``run(cache)`` on a contiguous cache; a strided view is updated through a copy."""
    if cache.is_contiguous():
        return run(cache)
    work = cache.contiguous()
    result = run(work)
    cache.copy_(work)
    return result


def paged_conv1d_decode(x, weight, conv_cache, step, *, activation="silu"):
    """:func:`.paged.paged_conv1d_decode` through ``gdn_conv1d_decode``."""
    _check_step(step, DecodeStep)
    _check_conv(x, weight, conv_cache, "N", step.num_rows, activation)
    _check_state_dtype("conv_cache", conv_cache)
    real = step.is_real[:, None]
    y = _contiguous_run(conv_cache, lambda cache: adapter.conv1d_decode(
        torch.where(real, x, 0), weight, cache, step.pages, activation=activation))
    return torch.where(real, y, 0).to(x.dtype)


def paged_gdn_decode(q, k, v, g, beta, ssm_cache, step, *, scale=None, use_qk_l2norm=False):
    """:func:`.paged.paged_gdn_decode` through the recurrent-step kernel (float32 inputs)."""
    _check_step(step, DecodeStep)
    dim_k = _check_gdn(q, k, v, g, beta, ssm_cache, "N", step.num_rows)
    _check_state_dtype("ssm_cache", ssm_cache)
    scale = resolve_scale(scale, dim_k)
    real = step.is_real[:, None]
    # Normalised (if asked) and scaled here; padding rows step on zeros, leaving their page as is.
    q, k = prepare_qk(q, k, scale, bool(use_qk_l2norm))
    q, k, v_in = (torch.where(real[..., None], t, 0.0) for t in (q, k, v.float()))
    g, beta = torch.where(real, g, 0.0), torch.where(real, beta, 0.0)
    o = _contiguous_run(ssm_cache, lambda cache: adapter.gdn_decode(q, k, v_in, g, beta, cache, step.pages, 1.0))
    return torch.where(real[..., None], o, 0.0).to(v.dtype)


def paged_conv1d_prefill(x, weight, conv_cache, step, *, activation="silu"):
    """:func:`.paged.paged_conv1d_prefill` through ``gdn_conv1d_prefill`` on a bucket."""
    _check_step(step, PrefillStep)
    _check_conv(x, weight, conv_cache, "T", step.num_tokens, activation)
    _check_state_dtype("conv_cache", conv_cache)
    bucket = _Bucket(step)
    channel_major = bucket.scatter(x).transpose(1, 2).contiguous()       # [S, C, L]

    def run(cache):
        _zero_fresh_pages(cache, step)
        return adapter.conv1d_prefill(channel_major, weight, cache, step.pages, bucket.seq_lens,
                                      activation=activation, initial_state=True)

    y = _contiguous_run(conv_cache, run)                                   # [S, C, L]
    return bucket.gather(y.transpose(1, 2)).to(x.dtype)


def paged_gdn_prefill(q, k, v, g, beta, ssm_cache, step, *, scale=None, use_qk_l2norm=False):
    """:func:`.paged.paged_gdn_prefill` through ``gdn_cte`` on a bucket."""
    _check_step(step, PrefillStep)
    dim_k = _check_gdn(q, k, v, g, beta, ssm_cache, "T", step.num_tokens)
    _check_state_dtype("ssm_cache", ssm_cache)
    scale = resolve_scale(scale, dim_k)
    bucket = _Bucket(step)

    def head_major(t):                                                     # [T, H, ...] -> [S, H, L, ...]
        return bucket.scatter(t).transpose(1, 2).contiguous()

    def run(cache):
        _zero_fresh_pages(cache, step)
        return adapter.gdn_prefill(head_major(q), head_major(k), head_major(v), head_major(g), head_major(beta),
                                   cache, step.pages, scale, use_qk_l2norm=bool(use_qk_l2norm),
                                   initial_state=True)

    o = _contiguous_run(ssm_cache, run)                                    # [S, Hv, L, Dv]
    return bucket.gather(o.transpose(1, 2))
