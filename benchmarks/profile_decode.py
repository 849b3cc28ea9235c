"""Where one decode step's time goes, per layer kind and per op, as vLLM serves it on CPU.

Each profile runs an in-process ``vllm.LLM`` (``enforce_eager=True``;
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``bench_serve.py --layout in-process``) in a subprocess
of its own (the plugin is switched on or off per process), submits N prompts of ``--prompt-len`` random tokens, steps the engine until every request is
decoding, then times ``--steps`` engine steps of N decode rows twice:

  timed     forward hooks on every decoder layer's mixer (``linear_attn``: the GatedDeltaNet
            mixer; ``self_attn``: gated full attention), its ``mlp`` (dense MLP or MoE) and its
            norms (``input_layernorm``, ``post_attention_layernorm``, the final ``norm``) add up
            the wall time of each kind; ``rest`` is the engine step less all of them
            (embedding, logits, sampling, the scheduler, the runner's input preparation)
  profiled  the same steps under ``torch.profiler`` (CPU), each kind's ops inside a
            ``record_function`` of the kind: per kind, the time of its arithmetic ops
            (matrix products and vLLM's C++ kernels: ``ARITHMETIC``), the self time of every
            other op (elementwise, indexing, copies, allocation: "small ops") and the op count

Per kind the table shows ms per step (timed), the arithmetic share of it (profiled arithmetic
over timed wall), the overhead (wall less arithmetic: Python, dispatch, small ops and copies)
and the ops per step; then the ops with the most self time in the step. The profiler's own
cost inflates its op times a little, so the arithmetic share is an upper bound.

The engine runs in-process because the forward hooks and the profiler must live in the process
that holds the model and steps the engine; ``bench_serve.py``'s default ``served`` layout puts
the model in a worker process of vLLM's executor instead. So the profile runs with torch's
default OpenMP threads (one per CPU, unbound), not the bound threads vLLM's CPU executor gives a
served worker (``vllm/utils/ompmultiprocessing.py``: one per physical core, less the cores kept
for the engine-core process); where the two thread set-ups differ, its step times are not a
served engine's. ``--threads N`` gives the engine N OpenMP threads pinned to the first N CPUs:
``--threads 1`` is a served worker's set-up on a 2-vCPU machine (one thread, on CPU 0; here the
scheduler shares that CPU, where a server keeps it on the other).

Models (``--models``):

  tiny24    the trained tiny checkpoint (``configs/trained/qwen3_5-tiny-mtp``, hidden 64) deepened
            to 24 decoder layers (``scripts/scale_checkpoint.py``: the added layers' outputs zero),
            plugin only (vLLM's C++ GDN kernels refuse its Dv = 16), N = 1
  real      ``bench_serve.py``'s ``qwen3-next-real`` (hidden 2048, GDN 16/32 x 128, 8-expert MoE,
            4 layers), the plugin (``auto``) and vLLM's built-in Qwen3-Next, N = 1, 8 and 32

    python benchmarks/profile_decode.py                     # both models (~5 min on 2 quiet cores)
    python benchmarks/profile_decode.py --models real --n 32
    python benchmarks/profile_decode.py --threads 1         # a served worker's threads (2 vCPUs)

Writes ``benchmarks/results/profile_decode.{md,json,png}``.
"""

import argparse
import functools
import json
import os
import pathlib
import subprocess
import sys
import time

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
REPO = pathlib.Path(__file__).resolve().parents[1]
TRAINED_CHECKPOINT = REPO / "configs" / "trained" / "qwen3_5-tiny-mtp"
TINY_LAYERS = 24
RESULT_TAG = "@@profile_decode "
#: engine -> its environment (on top of this process's, without either variable).
ENGINES = {"auto": {}, "built-in": {"VLLM_GDN_NEURON_DISABLE": "1"}}
#: the decoder layer's submodules timed, by attribute name -> the kind shown.
KINDS = {"linear_attn": "GDN mixer", "self_attn": "attention", "mlp": "MLP/MoE",
         "input_layernorm": "norms", "post_attention_layernorm": "norms"}
KIND_ORDER = ("GDN mixer", "attention", "MLP/MoE", "norms", "rest")
#: ops counted as arithmetic: matrix products and vLLM's compiled CPU kernels (``_C::...``).
ARITHMETIC = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
              "aten::_weight_int8pack_mm", "aten::mkldnn_rnn_layer")
TOP_OPS = 12


def _program(name):
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import importlib

    return importlib.import_module(f"scripts.{name}")


def tiny_checkpoint():
    """The trained tiny checkpoint deepened to TINY_LAYERS layers, written under RESULTS on first use."""
    target = RESULTS / f"{TRAINED_CHECKPOINT.name}-{TINY_LAYERS}layers"
    if not (target / "config.json").exists():
        RESULTS.mkdir(parents=True, exist_ok=True)
        _program("scale_checkpoint").deepen(TRAINED_CHECKPOINT, target, TINY_LAYERS)
    return target


def real_checkpoint():
    """``bench_serve.py``'s checkpoint (built under RESULTS on first use)."""
    target = RESULTS / "qwen3-next-real"
    if not (target / "config.json").exists():
        _program("build_tiny_models").build("qwen3-next-real", RESULTS)
    return target


# --------------------------------------------------------------------------------------------
# One engine (the subprocess)
# --------------------------------------------------------------------------------------------

def is_arithmetic(name):
    return name in ARITHMETIC or name.startswith("_C::")


class KindTimer:
    """Forward hooks adding up each kind's wall time; in ``profiling`` mode each kind's call
    also runs inside a ``record_function("kind:<kind>")``."""

    def __init__(self, model):
        import torch

        self.torch, self.seconds, self.calls, self.profiling, self._open = torch, {}, {}, False, []
        for name, module in model.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            kind = KINDS.get(leaf) if ".layers." in f".{name}" else None
            if name.endswith("model.norm") or name == "norm":
                kind = "norms"
            if kind is not None:
                module.register_forward_pre_hook(self._enter(kind))
                module.register_forward_hook(self._leave(kind))

    def _enter(self, kind):
        def hook(module, args):
            scope = self.torch.profiler.record_function(f"kind:{kind}") if self.profiling else None
            if scope is not None:
                scope.__enter__()
            self._open.append((kind, time.perf_counter(), scope))
        return hook

    def _leave(self, kind):
        def hook(module, args, output):
            _, start, scope = self._open.pop()
            if scope is not None:
                scope.__exit__(None, None, None)
            self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - start
            self.calls[kind] = self.calls.get(kind, 0) + 1
        return hook

    def reset(self):
        self.seconds, self.calls = {}, {}


def _kind_of(event):
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("kind:"):
            return parent.name[len("kind:"):]
        parent = parent.cpu_parent
    return "rest"


def _under_arithmetic(event):
    parent = event.cpu_parent
    while parent is not None:
        if is_arithmetic(parent.name):
            return True
        parent = parent.cpu_parent
    return False


def op_breakdown(events):
    """Per kind ``{arithmetic_us, small_us, ops, by_op}`` (``by_op``: top-level op name -> calls) and
    per op ``{self_us, calls}`` of profiled events."""
    kinds, ops = {}, {}
    for event in events:
        if event.name.startswith("kind:") or event.name.startswith("ProfilerStep"):
            continue
        if _under_arithmetic(event):
            continue
        kind = kinds.setdefault(_kind_of(event), dict(arithmetic_us=0.0, small_us=0.0, ops=0, by_op={}))
        if is_arithmetic(event.name):
            kind["arithmetic_us"] += event.cpu_time_total
        else:
            kind["small_us"] += event.self_cpu_time_total
        if event.cpu_parent is None or event.cpu_parent.name.startswith("kind:"):
            kind["ops"] += 1
            kind["by_op"][event.name] = kind["by_op"].get(event.name, 0) + 1
        op = ops.setdefault(event.name, dict(self_us=0.0, calls=0))
        op["self_us"] += event.cpu_time_total if is_arithmetic(event.name) else event.self_cpu_time_total
        op["calls"] += 1
    return kinds, ops


def _decode_steps(engine, steps):
    """Wall seconds of ``steps`` engine steps."""
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return time.perf_counter() - start


def worker(args):
    """Profile ``args.steps`` decode steps at each ``args.n``; print one tagged JSON line per N."""
    import torch
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(args.model), dtype="bfloat16", enforce_eager=True, max_model_len=1024,
              max_num_seqs=max(args.n), max_num_batched_tokens=4096, enable_prefix_caching=False,
              gpu_memory_utilization=0.15, kv_cache_memory_bytes=512 * 2**20, seed=0)
    engine = llm.llm_engine
    model = llm.collective_rpc(lambda worker: worker.model_runner.model)[0]
    timer = KindTimer(model)
    for n in args.n:
        params = SamplingParams(max_tokens=4 + 4 * args.steps + 8, temperature=0.0, ignore_eos=True)
        for i in range(n):
            ids = [3 + (97 * i + 31 * j) % 400 for j in range(args.prompt_len)]
            engine.add_request(f"n{n}-{i}", {"prompt_token_ids": ids}, params)
        for _ in range(4):  # the prefill step(s), then decode steps to warm up
            engine.step()
        timer.reset()
        wall = _decode_steps(engine, args.steps)
        timed = {kind: seconds / args.steps * 1e3 for kind, seconds in timer.seconds.items()}
        calls = {kind: count // args.steps for kind, count in timer.calls.items()}
        timer.profiling = True
        for _ in range(2):  # the first profile of a process pays the profiler's own start-up: discarded
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                profiled_wall = _decode_steps(engine, args.steps)
        timer.profiling = False
        kinds, ops = op_breakdown(prof.events())
        while engine.has_unfinished_requests():
            engine.step()
        print(RESULT_TAG + json.dumps(dict(
            n=n, step_ms=wall / args.steps * 1e3, profiled_step_ms=profiled_wall / args.steps * 1e3, timed_ms=timed,
            calls=calls, kinds={k: {m: ({o: c / args.steps for o, c in v.items()} if m == "by_op" else v / args.steps)
                                    for m, v in d.items()} for k, d in kinds.items()},
            ops={k: {m: v / args.steps for m, v in d.items()} for k, d in ops.items()})), flush=True)


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------

def run_engine(name, model, ns, args):
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.pop("VLLM_GDN_NEURON_DISABLE", None)
    env.update(ENGINES[name])
    pin = None
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
        pin = functools.partial(os.sched_setaffinity, 0, range(args.threads))
    argv = [sys.executable, __file__, "--worker", "--model", str(model), "--steps", str(args.steps),
            "--prompt-len", str(args.prompt_len), "--n", *map(str, ns)]
    log = RESULTS / f"profile_decode-{name}-{model.name}.log"
    with open(log, "w") as stderr:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=stderr, env=env, text=True, preexec_fn=pin)
    results = [json.loads(line[len(RESULT_TAG):]) for line in out.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if out.returncode or len(results) != len(ns):
        raise RuntimeError(f"engine {name!r} on {model.name} exited (rc {out.returncode}); see {log}")
    return results


def kind_rows(result):
    """Per kind ``(kind, calls, wall ms, arithmetic ms, overhead ms, ops)`` of one profile, per step."""
    rows = []
    for kind in KIND_ORDER:
        if kind == "rest":
            wall = result["step_ms"] - sum(result["timed_ms"].values())
        elif kind in result["timed_ms"]:
            wall = result["timed_ms"][kind]
        else:
            continue
        ops = result["kinds"].get(kind, dict(arithmetic_us=0.0, small_us=0.0, ops=0, by_op={}))
        arithmetic = min(ops["arithmetic_us"] / 1e3, wall)
        rows.append((kind, result["calls"].get(kind, 1), wall, arithmetic, wall - arithmetic, ops["ops"]))
    return rows


def table(profiles):
    lines = []
    for (label, engine), results in profiles.items():
        for result in results:
            lines.append(f"\n{label}, {engine}, N = {result['n']}: {result['step_ms']:.1f} ms per decode step "
                         f"({result['profiled_step_ms']:.1f} ms profiled)")
            lines.append(f"| {'kind':<10} | {'calls':>5} | {'ms/step':>8} | {'arith ms':>8} | {'overhead ms':>11} "
                         f"| {'overhead':>8} | {'ops/step':>8} | {'ops/call':>8} |")
            lines.append("|" + "|".join("-" * w for w in (12, 7, 10, 10, 13, 10, 10, 10)) + "|")
            for kind, calls, wall, arith, over, ops in kind_rows(result):
                lines.append(f"| {kind:<10} | {calls:>5} | {wall:8.2f} | {arith:8.2f} | {over:11.2f} "
                             f"| {100 * over / max(wall, 1e-9):7.0f}% | {ops:8.0f} | {ops / max(calls, 1):8.1f} |")
            for kind, calls, *_ in kind_rows(result):
                by_op = result["kinds"].get(kind, {}).get("by_op", {})
                common = sorted(by_op.items(), key=lambda item: -item[1])[:TOP_OPS]
                if common:
                    lines.append(f"{kind} ops per call: " + ", ".join(
                        f"{name} {count / max(calls, 1):.0f}" for name, count in common))
            top = sorted(result["ops"].items(), key=lambda item: -item[1]["self_us"])[:TOP_OPS]
            lines.append("top ops (ms/step, calls/step): " + ", ".join(
                f"{name} {op['self_us'] / 1e3:.2f} ({op['calls']:.0f})" for name, op in top))
    return "\n".join(lines)


def plot(profiles, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a test dependency
        return
    bars = [(f"{label}\n{engine} N={r['n']}", kind_rows(r)) for (label, engine), results in profiles.items()
            for r in results]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(bars)), 4.5))
    colours = dict(zip(KIND_ORDER, ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:gray")))
    for x, (_, rows) in enumerate(bars):
        bottom = 0.0
        for kind, _, wall, arith, over, _ in rows:
            ax.bar(x, arith, bottom=bottom, color=colours[kind], label=f"{kind} arithmetic" if x == 0 else None)
            ax.bar(x, over, bottom=bottom + arith, color=colours[kind], alpha=0.4, hatch="//",
                   label=f"{kind} overhead" if x == 0 else None)
            bottom += wall
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7)
    ax.set_ylabel("ms per decode step")
    ax.set_title("One decode step per layer kind: arithmetic (solid) and overhead (hatched)")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def thread_text(threads):
    """The engine's OpenMP threads, as ``--threads`` set them."""
    if not threads:
        return "torch's default OpenMP threads, unpinned"
    if threads == 1:
        return "1 OpenMP thread pinned to CPU 0"
    return f"{threads} OpenMP threads pinned to CPUs 0-{threads - 1}"


def cpu_name():
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=("tiny24", "real"), default=("tiny24", "real"))
    parser.add_argument("--engines", nargs="+", choices=tuple(ENGINES), default=tuple(ENGINES),
                        help="engines for the real-dims model (tiny24 runs the plugin only)")
    parser.add_argument("--n", nargs="+", type=int, default=None, help="decode rows (real: default 1 8 32)")
    parser.add_argument("--steps", type=int, default=8, help="decode steps timed (and profiled) per N")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--threads", type=int, metavar="N",
                        help="the engine's OpenMP threads, pinned to CPUs 0..N-1 (default: torch's, unpinned)")
    parser.add_argument("--model", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.n = args.n or [1]
        return worker(args)
    for name in ("steps", "prompt_len"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected >= 1; got {getattr(args, name)}")
    usable = len(os.sched_getaffinity(0))
    if args.threads is not None and not 1 <= args.threads <= usable:
        parser.error(f"--threads: expected 1 to {usable} (the CPUs this process may use); got {args.threads}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    start_load = os.getloadavg()
    profiles = {}
    if "tiny24" in args.models:
        profiles[(f"tiny {TINY_LAYERS} layers", "auto")] = run_engine("auto", tiny_checkpoint(), [1], args)
    if "real" in args.models:
        model = real_checkpoint()
        for engine in args.engines:
            profiles[("real dims", engine)] = run_engine(engine, model, args.n or [1, 8, 32], args)
    end_load = os.getloadavg()
    report = (f"{cpu_name()}, {os.cpu_count()} CPUs; load averages (1/5/15 min) "
              f"{'/'.join(f'{x:.2f}' for x in start_load)} at the start, {'/'.join(f'{x:.2f}' for x in end_load)} "
              f"at the end; {args.steps} decode steps per row after a {args.prompt_len}-token prompt; "
              f"{thread_text(args.threads)}; LD_PRELOAD {os.environ.get('LD_PRELOAD') or 'none'}\n"
              + table(profiles) + "\n")
    print(report)
    (RESULTS / "profile_decode.md").write_text(report)
    (RESULTS / "profile_decode.json").write_text(json.dumps(
        {f"{label} | {engine}": results for (label, engine), results in profiles.items()}, indent=1))
    plot(profiles, RESULTS / "profile_decode.png")
    print(f"plot: {RESULTS / 'profile_decode.png'}")


if __name__ == "__main__":
    main()
