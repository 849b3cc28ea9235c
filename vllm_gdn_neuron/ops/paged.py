"""Trace-safe GDN ops on page-major caches: conv1d and the gated delta rule, decode and prefill.

Each op reads its state rows with ``index_select``, computes from static shapes only (no host
read, no data-dependent shape, no loop over tensor values) and writes whole rows back with
``index_copy_``: the same code runs eagerly (vLLM's runner) and inside
``torch.compile(fullgraph=True, dynamic=False)`` (vllm-neuron's runner). Per call the ops check
shapes and dtypes only (Python on static shapes, nothing read from the device); the values of
the step metadata are checked once per step by ``check_step``, and ``g <= 0`` holds by
construction of the layer's gating (``-exp(A_log) * softplus(.)``).

Caches (page-major, one page per sequence; see ``vllm_gdn_neuron.ops.step`` for the metadata):

- ``conv_cache [P, C, K]`` float32 or the activation dtype: the last K raw inputs, oldest first;
  any strides (the shells pass the channel-fast view of ``[P, K, C]`` pages, which vLLM's CPU
  conv kernels update in place: ``model.gdn_cache.conv_state_view``).
- ``ssm_cache [P, Hv, Dk, Dv]`` float32 or bfloat16 (math in float32), K-major.

Padding rows and sequences sit on the caller's pad page, whose content is unspecified: their
outputs are zeros, they touch no other page, and nothing they read reaches a live output (NaNs
included). A sequence without ``has_state`` starts from zeros whatever its page holds
(``torch.where``, so stale NaNs on a recycled page do not leak in).
"""

import math

import torch
import torch.nn.functional as F

from .backends.torch import chunked, recurrent
from .backends.torch.common import prepare_qk
from .backends.torch.conv1d import conv_over_rows, window_dot
from .step import DecodeStep, PrefillStep, VerifyStep
from .validation import (
    ACTIVATION_DTYPES,
    ACTIVATIONS,
    F32,
    check_choice,
    check_conv_weight,
    check_qkv,
    check_tensor,
    conv_state_dtypes,
    resolve_scale,
)

SSM_CACHE_DTYPES = (torch.float32, torch.bfloat16)
#: Eager decode on a float32 cache gathers the step's state rows when each is at most
#: ``GATHERED_ROW_BYTES`` and all of them at most ``GATHERED_STEP_BYTES`` (``paged_gdn_decode``:
#: small heads, where the per-row loop's host dispatch costs more than the gathered copies);
#: other rows are updated in place, row by row.
GATHERED_ROW_BYTES = 16 << 10
GATHERED_STEP_BYTES = 256 << 10


def check_step_kind(step, kind):
    if not isinstance(step, kind):
        raise ValueError(f"step: expected a {kind.__name__}, got {type(step).__name__}")


def check_conv(x, weight, conv_cache, rows_label, rows, activation):
    _, channels = check_tensor("x", x, ((rows_label, rows), ("C", None)), ACTIVATION_DTYPES)
    width = check_conv_weight(weight, channels)
    check_tensor("conv_cache", conv_cache, (("P", None), ("C", channels), ("K", width)), conv_state_dtypes(x))
    check_choice("activation", activation, ACTIVATIONS)
    return channels, width


def check_gdn(q, k, v, g, beta, ssm_cache, rows_label, rows):
    _, _, dim_k, num_v_heads, dim_v = check_qkv(q, k, v, rows_label, rows)
    check_tensor("g", g, ((rows_label, rows), ("Hv", num_v_heads)), F32)
    check_tensor("beta", beta, ((rows_label, rows), ("Hv", num_v_heads)), F32)
    check_tensor("ssm_cache", ssm_cache, (("P", None), ("Hv", num_v_heads), ("Dk", dim_k), ("Dv", dim_v)),
                 SSM_CACHE_DTYPES)
    return dim_k


def check_gdn_raw_gating(q, k, v, a, b, A_log, dt_bias, ssm_cache, rows_label, rows):
    """``check_gdn`` for a phase on the raw gating (``vllm_gdn_neuron.ops.gating``): a, b
    ``[rows, Hv]``, A_log, dt_bias ``[Hv]``, any float dtype."""
    _, _, dim_k, num_v_heads, dim_v = check_qkv(q, k, v, rows_label, rows)
    for name, x in (("a", a), ("b", b)):
        check_tensor(name, x, ((rows_label, rows), ("Hv", num_v_heads)), ACTIVATION_DTYPES)
    for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
        check_tensor(name, x, (("Hv", num_v_heads),), ACTIVATION_DTYPES)
    check_tensor("ssm_cache", ssm_cache, (("P", None), ("Hv", num_v_heads), ("Dk", dim_k), ("Dv", dim_v)),
                 SSM_CACHE_DTYPES)
    return dim_k


def _activate(y, activation):
    return F.silu(y) if activation == "silu" else y


def _initial_rows(cache, step):
    """The float32 initial states of the step's sequences: their pages, or zeros without has_state."""
    rows = cache.index_select(0, step.pages).float()
    keep = step.has_state.view((-1,) + (1,) * (rows.dim() - 1))
    return torch.where(keep, rows, 0.0)


def paged_conv1d_decode(x, weight, conv_cache, step, *, activation="silu"):
    """One conv1d step per decode row; each row's page becomes its window.

    Dimensions:
        N: decode rows (bucket-padded), C: channels, K: kernel width, P: cache pages.

    Args:
        x: ``[N, C]`` float32 or bfloat16.
        weight: ``[C, K]`` float32 or bfloat16.
        conv_cache: ``[P, C, K]`` float32 or x's dtype; pages ``step.pages`` are rewritten.
        step: the step's ``DecodeStep``.
        activation: ``"silu"`` or None.

    Returns:
        ``y``: ``[N, C]`` in x's dtype; padding rows zero.
    """
    check_step_kind(step, DecodeStep)
    check_conv(x, weight, conv_cache, "N", step.num_rows, activation)
    rows = conv_cache.index_select(0, step.pages)
    y, window = _conv_step(rows, x, weight, activation)
    conv_cache.index_copy_(0, step.pages, window.to(rows.dtype))
    return torch.where(step.is_real[:, None], y, 0.0).to(x.dtype)


def _conv_step(window, x, weight, activation):
    """One conv1d token per row: ``window [N, C, K]`` (any float dtype) shifted left by one with
    ``x [N, C]`` appended -> ``(y [N, C], new window [N, C, K])``, both float32."""
    window = torch.cat([window[..., 1:].float(), x.float()[..., None]], -1)
    return _activate(window_dot(window, weight), activation), window


def paged_conv1d_prefill(x, weight, conv_cache, step, *, activation="silu"):
    """Causal conv1d over the step's packed prompts, from (and back to) their pages.

    Every sequence is laid out behind its K-row incoming state in one token-major float32 buffer
    ``[state_0; x_0; state_1; x_1; ...; zeros; padding tokens]`` and one depthwise conv runs down
    it (``conv_over_rows``): each output reads at most K - 1 rows back, never past its own state;
    each final state is the K rows ending at the sequence's last token (its incoming state for an
    empty sequence).

    Args:
        x: ``[T, C]`` float32 or bfloat16, T = ``step.num_tokens``.
        weight: ``[C, K]`` float32 or bfloat16.
        conv_cache: ``[P, C, K]`` float32 or x's dtype; pages ``step.pages`` get the final states.
        step: the step's ``PrefillStep``.
        activation: ``"silu"`` or None.

    Returns:
        ``y``: ``[T, C]`` in x's dtype; padding tokens zero.
    """
    check_step_kind(step, PrefillStep)
    channels, width = check_conv(x, weight, conv_cache, "T", step.num_tokens, activation)
    num_tokens, num_seqs, device = step.num_tokens, step.num_seqs, x.device
    bounds = step.query_start_loc
    taps = torch.arange(width, device=device)
    seqs = torch.arange(num_seqs, device=device)
    token_rows = torch.arange(num_tokens, device=device) + (step.token_seq + 1) * width
    state_rows = (bounds[:-1] + seqs * width)[:, None] + taps
    rows = x.new_zeros(num_tokens + (num_seqs + 1) * width, channels, dtype=torch.float32)
    rows.index_copy_(0, token_rows, x.float())
    initial = _initial_rows(conv_cache, step)
    rows.index_copy_(0, state_rows.reshape(-1), initial.transpose(1, 2).reshape(-1, channels))
    y = _activate(conv_over_rows(rows, weight).index_select(0, token_rows - width + 1), activation)
    final_rows = (bounds[1:] + seqs * width)[:, None] + taps
    final = rows.index_select(0, final_rows.reshape(-1)).view(num_seqs, width, channels).transpose(1, 2)
    conv_cache.index_copy_(0, step.pages, final.to(conv_cache.dtype))
    return torch.where(step.is_real_token[:, None], y, 0.0).to(x.dtype)


def paged_gdn_decode(q, k, v, g, beta, ssm_cache, step, *, scale=None, use_qk_l2norm=False):
    """One gated delta rule step per decode row, from and back to its page.

    Per value head: ``S <- exp(g) S``; ``v_new = beta (v - S^T k)``; ``S <- S + k v_new^T``;
    ``o = S^T q`` (q scaled), with both reads of the undecayed state in one matmul
    ``[k; q]^T S``. Traced, with a bfloat16 cache, or with small state rows (``_gathers``), the
    rows are gathered, stepped and written back whole; otherwise (eager, float32 cache, larger
    rows) the torch backend updates them in place (same math, padding rows left out, no
    gathered copy of the state rows; the in-place step loops over rows on the host, so eager
    only).

    Args:
        q, k: ``[N, Hk, Dk]`` float32 or bfloat16.
        v: ``[N, Hv, Dv]``, q's dtype; ``Hv % Hk == 0``.
        g, beta: ``[N, Hv]`` float32 (g <= 0).
        ssm_cache: ``[P, Hv, Dk, Dv]`` float32 or bfloat16; pages ``step.pages`` advance one token.
        step: the step's ``DecodeStep``.
        scale: output scale, None for ``Dk ** -0.5``.
        use_qk_l2norm: L2-normalise q and k per head (float32) first.

    Returns:
        ``o``: ``[N, Hv, Dv]`` in q's dtype; padding rows zero.
    """
    check_step_kind(step, DecodeStep)
    dim_k = check_gdn(q, k, v, g, beta, ssm_cache, "N", step.num_rows)
    scale = resolve_scale(scale, dim_k)
    if ssm_cache.dtype == torch.float32 and not torch.compiler.is_compiling() and not _gathers(ssm_cache, step):
        return decode_in_place(recurrent.gdn_decode, (q, k, v, g, beta), ssm_cache, step, scale, bool(use_qk_l2norm))
    state = ssm_cache.index_select(0, step.pages).float()
    q, k = prepare_qk(q, k, scale, bool(use_qk_l2norm))
    o, new = _gdn_step(state, q, k, v, g, beta)
    ssm_cache.index_copy_(0, step.pages, new.to(ssm_cache.dtype))
    return torch.where(step.is_real[:, None, None], o, 0.0).to(v.dtype)


def _gathers(ssm_cache, step):
    """The eager decode of ``step`` gathers its state rows: each at most ``GATHERED_ROW_BYTES``,
    all of them at most ``GATHERED_STEP_BYTES`` (measured on one core: 2 to 2.5x faster at 8 to 32
    rows of 8 KiB; slower from rows of 64 KiB, and from 32 rows of 16 KiB; ``benchmarks/README.md``)."""
    row_bytes = math.prod(ssm_cache.shape[1:]) * ssm_cache.element_size()
    return row_bytes <= GATHERED_ROW_BYTES and row_bytes * step.num_rows <= GATHERED_STEP_BYTES


def _gdn_step(state, q, k, v, g, beta):
    """One gated delta rule token per row, on gathered float32 states.

    Args:
        state: ``[N, Hv, Dk, Dv]`` float32.
        q, k: ``[N, Hk, Dk]`` float32, already prepared (``prepare_qk``: normalised, q scaled).
        v: ``[N, Hv, Dv]``; g, beta: ``[N, Hv]`` float32.

    Returns:
        ``(o [N, Hv, Dv], new state [N, Hv, Dk, Dv])``, float32.
    """
    return _gdn_advance(state, *_gdn_token_terms(q, k, g), v, beta)


def _gdn_token_terms(q, k, g):
    """The state-independent terms of a token (any leading dims ``...``): ``k_q [..., Hv, 2, Dk]``
    (k and q per value head), ``decay [..., Hv, 1]`` = exp(g), ``kq [..., Hv, 1]`` = k . q."""
    group = g.shape[-1] // q.shape[-2]
    k_q = torch.stack([k, q], dim=-2).repeat_interleave(group, dim=-3)
    return k_q, g.exp()[..., None], (k_q[..., 0, :] * k_q[..., 1, :]).sum(-1, keepdim=True)


def _gdn_advance(state, k_q, decay, kq, v, beta):
    """``_gdn_step`` from its token terms (``_gdn_token_terms``): both reads of the undecayed
    state in one matmul ``[k; q]^T S``."""
    reads = k_q @ state                                                       # [N, Hv, 2, Dv]
    v_new = beta[..., None] * (v.float() - decay * reads[:, :, 0])
    o = decay * reads[:, :, 1] + kq * v_new
    new = state * decay[..., None] + k_q[:, :, 0, :, None] * v_new[:, :, None, :]
    return o, new


def decode_in_place(step_fn, per_row, ssm_cache, step, scale, use_qk_l2norm):
    """Eager decode through ``step_fn(*per_row, ssm_cache, pages, scale, use_qk_l2norm)`` (a
    backend's decode), which updates the pages where they are.

    ``per_row`` holds the ``[N, ...]`` inputs, q, k, v first (then g and beta, or the raw
    gating's a and b). The backends take distinct pages, so padding rows (which share the pad
    page) are left out; whether there are any is ``step.all_real``, one host read per step.
    """
    if step.all_real:
        return step_fn(*per_row, ssm_cache, step.pages, scale, use_qk_l2norm)
    real, v = step.is_real, per_row[2]
    o = v.new_zeros(v.shape)
    o[real] = step_fn(*(t[real] for t in per_row), ssm_cache, step.pages[real], scale, use_qk_l2norm)
    return o


def paged_gdn_prefill(q, k, v, g, beta, ssm_cache, step, *, scale=None, use_qk_l2norm=False):
    """Chunked gated delta rule over the step's packed prompts, from and back to their pages.

    Runs the torch backend's chunked scan on ``step.chunks`` (a layout planned per bucket, or
    exactly from the host values with ``PrefillStep.build(exact_plan=True)``).

    Args:
        q, k: ``[T, Hk, Dk]`` float32 or bfloat16, T = ``step.num_tokens``.
        v: ``[T, Hv, Dv]``, q's dtype.
        g, beta: ``[T, Hv]`` float32 (g <= 0).
        ssm_cache: ``[P, Hv, Dk, Dv]`` float32 or bfloat16; pages ``step.pages`` get the final states.
        step: the step's ``PrefillStep``.
        scale, use_qk_l2norm: as in ``paged_gdn_decode``.

    Returns:
        ``o``: ``[T, Hv, Dv]`` in q's dtype; padding tokens zero.
    """
    check_step_kind(step, PrefillStep)
    dim_k = check_gdn(q, k, v, g, beta, ssm_cache, "T", step.num_tokens)
    scale = resolve_scale(scale, dim_k)
    o, final = chunked.gdn_prefill(q, k, v, g, beta, None, _initial_rows(ssm_cache, step), scale,
                                   bool(use_qk_l2norm), layout=step.chunks)
    ssm_cache.index_copy_(0, step.pages, final.to(ssm_cache.dtype))
    return torch.where(step.is_real_token[:, None, None], o, 0.0)


def _grid(x, step):
    """Packed tokens ``[T, ...]`` -> ``[R, W, ...]`` by (row, draft position); zeros where none."""
    rows = x.index_select(0, step.token_index.reshape(-1)).view(*step.token_index.shape, *x.shape[1:])
    mask = step.is_real.view(*step.is_real.shape, *(1,) * (x.dim() - 1))
    return torch.where(mask, rows, torch.zeros((), dtype=x.dtype, device=x.device))


def _packed(y, step):
    """``[R, W, ...]`` by (row, draft position) -> packed tokens ``[T, ...]``; padding tokens zero."""
    flat = y.reshape(-1, *y.shape[2:]).index_select(0, step.token_slot)
    mask = step.is_real_token.view(-1, *(1,) * (y.dim() - 2))
    return torch.where(mask, flat, torch.zeros((), dtype=y.dtype, device=y.device))


def paged_conv1d_verify(x, weight, conv_cache, step, *, activation="silu"):
    """Conv1d over the verify rows of a speculative step, one state page per draft position.

    Row r starts from the window on ``step.source_pages[r]`` (the one after its last accepted
    token); the window after its token t is written to ``step.write_pages[r, t]``. Each token is
    the decode step of ``paged_conv1d_decode`` (same math), all W at once: the row's inputs as
    the cache keeps them, ``[window; x_0 .. x_{W-1}]``, hold every window after a token as K
    consecutive columns; each token's own input enters its output as given (a decode step
    convolves it before the cache rounds it).

    Dimensions:
        T: packed verify tokens, R: rows, W: draft positions per row, C: channels, K: kernel width.

    Args:
        x: ``[T, C]`` float32 or bfloat16, T = ``step.num_tokens``.
        weight: ``[C, K]`` float32 or bfloat16.
        conv_cache: ``[P, C, K]`` float32 or x's dtype; pages ``step.write_pages`` are rewritten.
        step: the step's ``VerifyStep``.
        activation: ``"silu"`` or None.

    Returns:
        ``y``: ``[T, C]`` in x's dtype; padding tokens zero.
    """
    check_step_kind(step, VerifyStep)
    _, width = check_conv(x, weight, conv_cache, "T", step.num_tokens, activation)
    grid = _grid(x, step)                                                     # [R, W, C]
    held = torch.cat([conv_cache.index_select(0, step.source_pages), grid.transpose(1, 2).to(conv_cache.dtype)], -1)
    # The window after each token, as a stack of slices: torch-mlir has no lowering of aten.unfold.
    windows = torch.stack([held[..., j:j + width] for j in range(1, held.shape[-1] - width + 1)], 1)  # [R, W, C, K]
    y = window_dot(windows[..., :-1].float(), weight[:, :-1]) + grid.float() * weight[:, -1].float()
    conv_cache.index_copy_(0, step.write_pages.reshape(-1), windows.flatten(0, 1))
    return _packed(_activate(y, activation), step).to(x.dtype)


def paged_gdn_verify(q, k, v, g, beta, ssm_cache, step, *, scale=None, use_qk_l2norm=False):
    """Gated delta rule over the verify rows of a speculative step, one state page per draft position.

    Row r starts from the state on ``step.source_pages[r]``; the state after its token t is
    written to ``step.write_pages[r, t]`` (the pad page for positions without a token). Each token
    is the decode step of ``paged_gdn_decode`` (same math, the state rounded to the cache dtype
    between tokens as a decode step would leave it).

    Args:
        q, k: ``[T, Hk, Dk]`` float32 or bfloat16, T = ``step.num_tokens``.
        v: ``[T, Hv, Dv]``, q's dtype.
        g, beta: ``[T, Hv]`` float32 (g <= 0).
        ssm_cache: ``[P, Hv, Dk, Dv]`` float32 or bfloat16; pages ``step.write_pages`` are rewritten.
        step: the step's ``VerifyStep``.
        scale, use_qk_l2norm: as in ``paged_gdn_decode``.

    Returns:
        ``o``: ``[T, Hv, Dv]`` in q's dtype; padding tokens zero.
    """
    check_step_kind(step, VerifyStep)
    dim_k = check_gdn(q, k, v, g, beta, ssm_cache, "T", step.num_tokens)
    scale = resolve_scale(scale, dim_k)
    q, k = prepare_qk(q, k, scale, bool(use_qk_l2norm))
    q, k, v, g, beta = (_grid(t, step) for t in (q, k, v, g, beta))
    k_q, decay, kq = _gdn_token_terms(q, k, g)
    state = ssm_cache.index_select(0, step.source_pages).float()
    outputs, states = [], []
    for position in range(step.width):
        o, stepped = _gdn_advance(state, k_q[:, position], decay[:, position], kq[:, position], v[:, position],
                                  beta[:, position])
        kept = stepped.to(ssm_cache.dtype)
        state = kept.float()
        outputs.append(o)
        states.append(kept)
    ssm_cache.index_copy_(0, step.write_pages.reshape(-1), torch.stack(states, 1).flatten(0, 1))
    return _packed(torch.stack(outputs, 1), step).to(v.dtype)
