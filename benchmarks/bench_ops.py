"""GDN prefill and decode on CPU: this project's torch backend against its peers, in one run.

Ours:
  ours      backend "torch" (chunked prefill, in-place per-row decode), any dtype / head size
  vllm_cpu  backend "vllm_cpu": vLLM's C++ kernels behind this project's op surface (its argument
            conversions counted in its time); bf16, Dk = Dv in {64, 128} only
  auto      what the plugin's layers run: the backend ops.phases resolved for the phase when a
            GDN layer of the row's shapes was built (by the CPU's kind, or timed once per process),
            named in each call as the layer names it
  per call  backend "auto" of the public op: the same choice, looked up at every call (the
            environment, the device and the call's shape: a few µs of Python per call)
Peers:
  hf    transformers' Qwen3.5 torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule
        (GQA by repeat_interleave of q/k, as HF's model does before calling them)
  vllm  vLLM's C++ CPU kernels chunk_gated_delta_rule_cpu / fused_sigmoid_gating_delta_rule_update_cpu
        (bf16 only; their decode fuses the Qwen3.5 gating, so ours is timed with the gating too)

A third table times the paged conv1d the layer runs around them (bf16, the real models' C = 8192,
K = 4): ours (backend "torch", its torch math), vllm_cpu (vLLM's C++ conv behind the paged op, on
AVX-512 BF16 CPUs), auto, and vLLM's kernel alone on its own windows.

"auto vs best" is the faster backend's time (ours or vllm_cpu) over auto's (1.00x: auto took it);
"paired" is the same ratio from a second race of auto against that backend alone, the median over
its rounds of the ratio within each round (see ``duel``), the figure that load from elsewhere and
the other peers move least; "per call vs best" is the first ratio for the public op's per-call
choice. Run without $VLLM_GDN_BACKEND, which would decide for auto.

Every GDN peer runs with use_qk_l2norm and the default scale on the same inputs, round-robin
within each round (see ``race``); the table shows the best round time of each, the speed-up
of ours over each peer (peer time / our time, > 1 = ours faster) and the max abs difference
of the outputs. A PNG plot goes to benchmarks/results/bench_ops.png.

    python benchmarks/bench_ops.py            # the real models' shapes (~2 min on 2 cores at load 1-2)
    python benchmarks/bench_ops.py --quick    # small shapes, a smoke run
    python benchmarks/bench_ops.py --lengths 8192 --batches --dtypes bfloat16 --no-hf --budget 20
                                              # the T = 8192 bf16 rows again, more rounds
    python benchmarks/bench_ops.py --budget 15 --rounds 400  # every row with more rounds (~11 min)
"""

import argparse
import os
import pathlib
import random
import statistics
import time

import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.model.gdn_cache import conv_state_view
from vllm_gdn_neuron.ops.auto import ConvShape, GdnShape
from vllm_gdn_neuron.ops.cpu_isa import cpu_flags, cpu_kind
from vllm_gdn_neuron.envs import GDN_BACKEND
from vllm_gdn_neuron.ops.phases import backend_module, resolve_phases
from vllm_gdn_neuron.kernels.l2norm import L2NORM_EPS

try:
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf
except ImportError:  # pragma: no cover - transformers is a test dependency
    hf = None
try:
    import vllm._custom_ops as vllm_ops

    HAVE_VLLM = hasattr(torch.ops._C, "chunk_gated_delta_rule_cpu")
except (ImportError, AttributeError):  # pragma: no cover - vllm-cpu is optional
    vllm_ops, HAVE_VLLM = None, False

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
DIM = 128
HEADS = ((16, 16), (16, 32))


#: A timed sample lasts at least this long: calls shorter than it repeat back to back inside one
#: sample (timer and scheduler jitter of a few tens of µs otherwise decide sub-millisecond rows).
MIN_SAMPLE_S = 2e-3


def race(runs, budget_s, max_rounds, reset=None):
    """Best per-call wall time (s) of each of ``runs`` (name -> fn), timed round-robin.

    Two warm-up calls of each (the first, after ``reset()`` where given, gives the result compared;
    the second's time how many back-to-back calls make one sample of at least ``MIN_SAMPLE_S``),
    then rounds that take one sample of every fn, until ``budget_s`` has passed (at least one round)
    or ``max_rounds``: a burst of load from elsewhere hits every peer alike. Each round runs the
    peers in a fresh random order (seeded), so no peer mostly follows the same one: what a peer
    leaves behind, freed memory or busy threads, hits each alike. (Rotating one order does not do
    that: each peer keeps its predecessor in all rounds but one of every len(runs).)

    Returns:
        ``{name: (best_seconds_per_call, result_of_the_warm_up_run, [seconds_per_call of each round])}``.
    """
    results, calls = {}, {}
    for name, fn in runs.items():
        if reset is not None:
            reset()
        results[name] = fn()
        t = time.perf_counter()
        fn()  # a second call, past first-call costs, sizes the samples
        calls[name] = max(1, int(MIN_SAMPLE_S / (time.perf_counter() - t)))
    samples = {name: [] for name in runs}
    start, rounds, order = time.perf_counter(), 0, random.Random(0)
    while rounds < max_rounds and (rounds == 0 or time.perf_counter() - start < budget_s):
        names = list(runs)
        order.shuffle(names)
        for name in names:
            fn, n = runs[name], calls[name]
            t = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - t) / n)
        rounds += 1
    return {name: (min(samples[name]), results[name], samples[name]) for name in runs}


def layer_choice(phase, dtype, num_k_heads, num_v_heads):
    """The backend a GDN layer with ``num_k_heads`` / ``num_v_heads`` heads of ``DIM`` in ``dtype``
    runs ``phase`` on: chosen once, when the layer is built, as the served model chooses it."""
    gdn = GdnShape(dtype, num_k_heads, num_v_heads, DIM, DIM, DIM ** -0.5, torch.float32)
    conv = ConvShape(dtype, dtype, dtype, (2 * num_k_heads + num_v_heads) * DIM, CONV_WIDTH, "silu")
    return resolve_phases(gdn, conv, "cpu").backends[phase]


def gating_inputs(rows, num_v_heads, gen):
    """Qwen3.5 gating projections and parameters, and the g / beta they give (float32)."""
    a = torch.randn(rows, num_v_heads, generator=gen).bfloat16()
    b = torch.randn(rows, num_v_heads, generator=gen).bfloat16()
    A_log = (0.5 * torch.randn(num_v_heads, generator=gen)).float()
    dt_bias = (0.5 * torch.randn(num_v_heads, generator=gen)).bfloat16()
    return a, b, A_log, dt_bias


def qwen35_gating(a, b, A_log, dt_bias):
    g = -A_log.exp() * torch.nn.functional.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def bench_prefill(tokens, num_k_heads, num_v_heads, dtype, budget_s, with_hf=True, max_rounds=10):
    gen = torch.Generator().manual_seed(tokens + num_v_heads)
    q = torch.randn(tokens, num_k_heads, DIM, generator=gen).to(dtype)
    k = torch.randn(tokens, num_k_heads, DIM, generator=gen).to(dtype)
    v = torch.randn(tokens, num_v_heads, DIM, generator=gen).to(dtype)
    g, beta = qwen35_gating(*gating_inputs(tokens, num_v_heads, gen))
    cu = torch.tensor([0, tokens], dtype=torch.int32)
    group = num_v_heads // num_k_heads
    chosen = layer_choice("gdn_prefill", dtype, num_k_heads, num_v_heads)
    runs = {"ours": lambda: ops.gdn_prefill(q, k, v, g, beta, cu, use_qk_l2norm=True, backend="torch")[0],
            "auto": lambda: ops.gdn_prefill(q, k, v, g, beta, cu, use_qk_l2norm=True, backend=chosen)[0],
            "per_call": lambda: ops.gdn_prefill(q, k, v, g, beta, cu, use_qk_l2norm=True)[0]}
    if HAVE_VLLM and dtype == torch.bfloat16:
        runs["vllm_cpu"] = lambda: ops.gdn_prefill(q, k, v, g, beta, cu, use_qk_l2norm=True, backend="vllm_cpu")[0]
    if with_hf and hf is not None:
        runs["hf"] = lambda: hf.torch_chunk_gated_delta_rule(
            q[None].repeat_interleave(group, 2), k[None].repeat_interleave(group, 2), v[None], g[None], beta[None],
            output_final_state=True, use_qk_l2norm_in_kernel=True)[0][0]
    if HAVE_VLLM and dtype == torch.bfloat16:
        runs["vllm"] = lambda: vllm_ops.chunk_gated_delta_rule_cpu(
            query=q[None], key=k[None], value=v[None], g=g[None], beta=beta[None].bfloat16(),
            initial_state=torch.zeros(1, num_v_heads, DIM, DIM), output_final_state=True, cu_seqlens=cu,
            head_first=False, use_qk_l2norm_in_kernel=True, initial_state_indices=torch.zeros(1, dtype=torch.int32),
            eps=L2NORM_EPS)[0][0]
    return _row(runs, budget_s, max_rounds)


def _row(runs, budget_s, max_rounds, reset=None):
    """Race ``runs``, then auto against the faster backend alone (``duel``): the best time per
    peer, the paired ratio, and the max abs output difference of HF / vLLM to ours."""
    raced = race(runs, budget_s, max_rounds, reset)
    ours = raced["ours"][1].float()
    row = {name: seconds for name, (seconds, _, _) in raced.items()}
    row["paired"] = duel(runs, best_backend_name(row), budget_s, max_rounds, reset)
    for peer in ("hf", "vllm"):
        if peer in raced:
            row[f"{peer}_diff"] = (raced[peer][1].float().reshape(ours.shape) - ours).abs().max().item()
    return row


def bench_decode(batch, num_k_heads, num_v_heads, dtype, budget_s, with_hf=True, max_rounds=20):
    gen = torch.Generator().manual_seed(batch + num_v_heads)
    q = torch.randn(batch, num_k_heads, DIM, generator=gen).to(dtype)
    k = torch.randn(batch, num_k_heads, DIM, generator=gen).to(dtype)
    v = torch.randn(batch, num_v_heads, DIM, generator=gen).to(dtype)
    a, b, A_log, dt_bias = gating_inputs(batch, num_v_heads, gen)
    slots = 2 * batch
    start_cache = 0.1 * torch.randn(slots, num_v_heads, DIM, DIM, generator=gen)
    indices = torch.randperm(slots, generator=gen)[:batch].to(torch.int32)
    group = num_v_heads // num_k_heads
    # Every run advances the one cache in place, reset to the same start before each peer's
    # warm-up run (the one compared). One cache, not one per peer: a second 2 x B state tensor
    # can land on memory that reads up to 15 % slower for the whole run (measured at B = 16:
    # two copies of one call on their own caches read 1.13-1.15x apart in 4 of 10 runs of 400
    # rounds; on one cache 0.996-1.007x), which would decide the rows by placement.
    cache = start_cache.clone()
    chosen = layer_choice("gdn_decode", dtype, num_k_heads, num_v_heads)

    def run_ours():
        g, beta = qwen35_gating(a, b, A_log, dt_bias)
        return ops.gdn_decode(q, k, v, g, beta, cache, indices, use_qk_l2norm=True, backend="torch")

    def run_auto():
        g, beta = qwen35_gating(a, b, A_log, dt_bias)
        return ops.gdn_decode(q, k, v, g, beta, cache, indices, use_qk_l2norm=True, backend=chosen)

    def run_per_call():
        g, beta = qwen35_gating(a, b, A_log, dt_bias)
        return ops.gdn_decode(q, k, v, g, beta, cache, indices, use_qk_l2norm=True)

    def run_vllm_cpu():
        g, beta = qwen35_gating(a, b, A_log, dt_bias)
        return ops.gdn_decode(q, k, v, g, beta, cache, indices, use_qk_l2norm=True, backend="vllm_cpu")

    def run_hf():
        g, beta = qwen35_gating(a, b, A_log, dt_bias)
        return hf.torch_recurrent_gated_delta_rule(
            q[:, None].repeat_interleave(group, 2), k[:, None].repeat_interleave(group, 2), v[:, None],
            g[:, None], beta[:, None], initial_state=start_cache[indices.long()], output_final_state=True,
            use_qk_l2norm_in_kernel=True)[0][:, 0]

    def run_vllm():
        return vllm_ops.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=A_log, dt_bias=dt_bias, q=q[None], k=k[None], v=v[None], a=a, b=b,
            initial_state_source=cache, initial_state_indices=indices,
            cu_seqlens=torch.arange(batch + 1, dtype=torch.int32), use_qk_l2norm_in_kernel=True)

    runs = {"ours": run_ours, "auto": run_auto, "per_call": run_per_call}
    if with_hf and hf is not None:
        runs["hf"] = run_hf
    if HAVE_VLLM and dtype == torch.bfloat16:
        runs["vllm"] = run_vllm
        runs["vllm_cpu"] = run_vllm_cpu
    return _row(runs, budget_s, max_rounds, reset=lambda: cache.copy_(start_cache))


CONV_HEADS = (16, 32)  # the real models' GDN heads Hk / Hv of DIM: q | k | v channels 8192
CONV_CHANNELS, CONV_WIDTH = (2 * CONV_HEADS[0] + CONV_HEADS[1]) * DIM, 4


def bench_conv(phase, size, num_seqs, budget_s, max_rounds=20):
    """Paged conv1d of bf16 C = 8192, K = 4: prefill of ``num_seqs`` fresh sequences of ``size``
    tokens in all, or decode of ``size`` rows; ours (torch), vllm_cpu, auto and vLLM's C++ kernel on its own
    ``[S, C, K - 1]`` windows (no page indexing, no K-column windows: its floor)."""
    gen = torch.Generator().manual_seed(size)
    weight = torch.randn(CONV_CHANNELS, CONV_WIDTH, generator=gen).bfloat16()
    rows = size if phase == "decode" else num_seqs
    # the layers' pages: [P, K, C] (channel-fast), seen by the ops as [P, C, K]
    start_cache = conv_state_view(torch.randn(2 * rows + 1, CONV_WIDTH, CONV_CHANNELS, generator=gen).bfloat16())
    pages = torch.randperm(2 * rows, generator=gen)[:rows] + 1
    x = torch.randn(size, CONV_CHANNELS, generator=gen).bfloat16()
    start_windows = start_cache[pages, :, 1:].transpose(1, 2).contiguous().transpose(1, 2)
    # The paged ops advance the cache pages in place and vLLM's kernel its windows (decode; prefill
    # writes them): both are reset to the same start before each peer's first (compared) call.
    cache, windows = start_cache.clone(), start_windows.clone()
    indices = torch.arange(rows, dtype=torch.int32)
    if phase == "decode":
        step = ops.DecodeStep.build(pages, 0)
        paged = lambda backend: backend_module(backend).paged_conv1d_decode(x, weight, cache, step)  # noqa: E731
        vllm = lambda: vllm_ops.causal_conv1d_update_cpu(x, windows, weight, None, True, indices, False)  # noqa: E731
    else:
        bounds = torch.linspace(0, size, num_seqs + 1).round().to(torch.int32)
        step = ops.PrefillStep.build(bounds, pages, torch.zeros(num_seqs, dtype=torch.bool), size, exact_plan=True)
        paged = lambda backend: backend_module(backend).paged_conv1d_prefill(x, weight, cache, step)  # noqa: E731
        vllm = lambda: vllm_ops.causal_conv1d_fwd_cpu(x.T, weight, None, windows, bounds, indices,  # noqa: E731
                                                      torch.zeros(num_seqs, dtype=torch.bool), True, False).T
    chosen = layer_choice(f"conv_{phase}", torch.bfloat16, *CONV_HEADS)
    # the paged ops have no per-call choice: a layer resolves its backend once, so per_call is auto
    runs = {"ours": lambda: paged("torch"), "auto": lambda: paged(chosen), "per_call": lambda: paged(chosen)}
    if HAVE_VLLM and hasattr(torch.ops._C, "causal_conv1d_fwd_cpu") and torch.cpu._is_avx512_bf16_supported():
        runs["vllm_cpu"] = lambda: paged("vllm_cpu")
        runs["vllm"] = vllm

    def reset():
        cache.copy_(start_cache)
        windows.copy_(start_windows)

    return _row(runs, budget_s, max_rounds, reset)


def print_conv_table(rows):
    print("\nPaged conv1d (bf16, C = 8192, K = 4; vLLM C++ on its own K - 1 windows, no page gather)")
    print("| phase | tokens / rows | sequences | ours ms | vllm_cpu ms | auto ms | per call ms | vLLM C++ ms "
          "| auto vs best | paired | per call vs best | auto vs vLLM | max abs diff vLLM |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (phase, size, seqs), r in rows:
        print(f"| {phase} | {size} | {seqs} | {fmt_ms(r['ours'])} | {fmt_ms(r.get('vllm_cpu'))} | {fmt_ms(r['auto'])} "
              f"| {fmt_ms(r['per_call'])} | {fmt_ms(r.get('vllm'))} | {fmt_ratio(best_backend(r), r['auto'])} "
              f"| {r['paired']:.2f}x | {fmt_ratio(best_backend(r), r['per_call'])} "
              f"| {fmt_ratio(r.get('vllm'), r['auto'])} | {r.get('vllm_diff', float('nan')):.2e} |")


def duel(runs, best, budget_s, max_rounds, reset=None):
    """Median over the rounds of a race of auto against the backend ``best`` alone of (that
    backend's time / auto's time) within the round.

    Two peers back to back in every round, without the slow ones that leave a budget few rounds
    and without what they leave behind: a burst of load that slows one round slows both, and
    where auto runs ``best``'s very function the ratio is that of a call against itself (1.00x
    but for noise).
    """
    raced = race({"auto": runs["auto"], best: runs[best]}, budget_s, max_rounds, reset)
    return statistics.median(b / a for b, a in zip(raced[best][2], raced["auto"][2]))


def best_backend_name(row):
    """The faster backend of ``row``: "ours" (torch) or "vllm_cpu"."""
    return min((name for name in ("ours", "vllm_cpu") if name in row), key=row.get)


def best_backend(row):
    """The faster backend's time: ours (torch) or vllm_cpu."""
    return row[best_backend_name(row)]


def fmt_ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def fmt_ratio(peer, ours):
    return "-" if peer is None else f"{peer / ours:.2f}x"


def print_table(title, size_name, rows):
    print(f"\n{title}")
    header = (f"| {size_name:>6} | Hk/Hv | dtype | ours ms | vllm_cpu ms | auto ms | per call ms | HF ms "
              f"| vLLM C++ ms | auto vs best | paired | per call vs best | ours vs HF | ours vs vLLM | auto vs HF "
              f"| auto vs vLLM | max abs diff HF | max abs diff vLLM |")
    print(header)
    print("|" + "|".join("---" for _ in header.split("|")[1:-1]) + "|")
    for (size, hk, hv, dtype), r in rows:
        auto = r.get("auto")
        print(f"| {size:>6} | {hk}/{hv} | {str(dtype).replace('torch.', ''):>8} | {fmt_ms(r['ours'])} "
              f"| {fmt_ms(r.get('vllm_cpu'))} | {fmt_ms(auto)} | {fmt_ms(r['per_call'])} | {fmt_ms(r.get('hf'))} "
              f"| {fmt_ms(r.get('vllm'))} | {fmt_ratio(best_backend(r), auto)} | {r['paired']:.2f}x "
              f"| {fmt_ratio(best_backend(r), r['per_call'])} "
              f"| {fmt_ratio(r.get('hf'), r['ours'])} | {fmt_ratio(r.get('vllm'), r['ours'])} "
              f"| {'-' if auto is None else fmt_ratio(r.get('hf'), auto)} "
              f"| {'-' if auto is None else fmt_ratio(r.get('vllm'), auto)} "
              f"| {r.get('hf_diff', float('nan')):.2e} | {r.get('vllm_diff', float('nan')):.2e} |")


def plot(prefill, decode, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, rows, size_name, title in ((axes[0], prefill, "T (tokens)", "prefill"),
                                       (axes[1], decode, "batch", "decode (one token per sequence)")):
        for hk, hv in HEADS:
            for dtype, style in ((torch.bfloat16, "-"), (torch.float32, "--")):
                sel = [(size, r) for (size, h, v, d), r in rows if (h, v, d) == (hk, hv, dtype)]
                if not sel:
                    continue
                sizes = [s for s, _ in sel]
                for peer, marker in (("ours", "o"), ("vllm_cpu", "v"), ("auto", "x"), ("hf", "s"), ("vllm", "^")):
                    times = [r.get(peer) for _, r in sel]
                    if all(t is not None for t in times):
                        label = f"{peer} {hk}/{hv} {str(dtype).replace('torch.', '')}"
                        ax.plot(sizes, [t * 1e3 for t in times], style, marker=marker, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(size_name)
        ax.set_ylabel("ms (best of runs)")
        ax.set_title(f"GDN {title}, D = {DIM}, {torch.get_num_threads()} threads")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, a smoke run")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timed runs per case and peer")
    parser.add_argument("--lengths", type=int, nargs="*", help="prefill lengths T (default 512 2048 8192)")
    parser.add_argument("--batches", type=int, nargs="*", help="decode batches B (default 1 16 64; none: skip)")
    parser.add_argument("--dtypes", nargs="*", choices=("bfloat16", "float32"), default=("bfloat16", "float32"))
    parser.add_argument("--no-hf", action="store_true", help="leave out transformers' functions (slow)")
    parser.add_argument("--rounds", type=int, help="most timed rounds per case (default 10 prefill, 20 decode "
                                                   "and conv; --budget ends them sooner)")
    args = parser.parse_args()
    if os.environ.get(GDN_BACKEND, "").strip() not in ("", "auto"):
        parser.error(f"{GDN_BACKEND}={os.environ[GDN_BACKEND]} would decide for auto: unset it to compare the backends")
    lengths = args.lengths if args.lengths is not None else (256, 512) if args.quick else (512, 2048, 8192)
    batches = args.batches if args.batches is not None else (1, 16) if args.quick else (1, 16, 64)
    dtypes = tuple(getattr(torch, name) for name in args.dtypes)
    bench_prefill(128, 16, 16, torch.bfloat16, 0.0)  # warm up thread pools and lazy imports
    with_hf = hf is not None and not args.no_hf
    rounds = {} if args.rounds is None else {"max_rounds": args.rounds}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, HF: {with_hf}, "
          f"vLLM C++ kernels: {HAVE_VLLM}; CPU kind {cpu_kind(cpu_flags())}; load averages {os.getloadavg()}")
    prefill = [((t, hk, hv, d), bench_prefill(t, hk, hv, d, args.budget, with_hf, **rounds))
               for t in lengths for hk, hv in HEADS for d in dtypes]
    print_table("Prefill (one sequence of T tokens, D = 128)", "T", prefill)
    decode = [((b, hk, hv, d), bench_decode(b, hk, hv, d, args.budget, with_hf, **rounds))
              for b in batches for hk, hv in HEADS for d in dtypes]
    if decode:
        print_table("Decode (one token for each of B sequences, cache slots in place, D = 128)", "B", decode)
    conv_cases = (("prefill", 2048, 8), ("prefill", 8192, 1), ("decode", 1, 1), ("decode", 32, 32))
    if args.quick:
        conv_cases = (("prefill", 2048, 8), ("decode", 1, 1))
    conv = [(case, bench_conv(*case, args.budget, **rounds)) for case in conv_cases]
    print_conv_table(conv)
    print(f"load averages at the end {os.getloadavg()}")
    path = RESULTS / "bench_ops.png"
    plot(prefill, decode, path)
    print(f"\nplot: {path}")


if __name__ == "__main__":
    main()
