"""Modeled whole-step trn2 time of every shipped config: TTFT (1024-token prompt) and TPOT, with a breakdown.

MODEL FIGURES, NOT MEASUREMENTS. For each ``configs/trn2/*.yaml``: the Neuron shell is built at
the published checkpoint's real dimensions and the config's tensor-parallel size (weights
never materialised: ``torch.empty`` pages that are never touched) and started by the test
harness's runner stand-in the way the runner starts it (``tests/neuron/runner.py`` and
``serve_config.py``: ``NeuronRunnerStandIn.start()`` with the config's engine settings and
``additional-config`` under its engine config: ``from_configs`` on meta, ``load_weights``,
the runner's ``torch.compile(fullgraph=True, options=...)`` call, the hybrid page alignment,
one int8 buffer per cache tensor with its dtype views, then the warm-up of every bucket on
the runner's synthetic inputs) with a recording ``aot_eager`` backend that runs nothing, and
each bucket's ATen graph is priced node by node (``benchmarks/step_model.py``:
FLOPs, HBM bytes, engine times at the documented NeuronCore-v3 rates, two physical cores
per logical core). Where the NKI kernels replace ops on trn2 (the GatedDeltaNet core:
conv1d and the chunked / recurrent delta rule), the torch ops of ``vllm_gdn_neuron/ops``
are replaced by the kernels' own modeled times (``kernels/interp/cost.py``, as
``bench_kernels_trn2_model.py``).

Traced per config: the prefill bucket of a 1024-token prompt, the shipped decode bucket
(``max-num-seqs`` rows: a batch of 1 pads to it) and a 1-row decode bucket (what batch 1
costs where such a bucket is compiled): the config's ``neuron_config`` with its bucket lists
narrowed to these (every other setting as shipped; the model's own bucket checks still run). The graph is traced with one period of the layer
pattern (3 GatedDeltaNet + 1 attention layers, at full dimensions); each layer's nodes
count ``layers of its kind / 3 or 1`` times (the layers of a kind are the same graph).

HBM floor: the weights one step touches on one core (every weight but the embedding rows
not gathered; for a MoE the expected distinct experts of ``rows * top_k`` uniform picks) over
the core's HBM bandwidth.

``--fp8``: each config also with FP8 weights on the device (``neuron_config.quantization:
"fp8"`` on the published FP8 checkpoint's config, :mod:`vllm_gdn_neuron.shells.neuron.fp8`):
the projections and experts held in FP8 with per-row scales and widened to bf16 before each
matmul (``step_model.py`` states how that widening is priced); its HBM floor counts the FP8
bytes. Configs already on FP8 (a ``quantization: fp8`` in the YAML) are priced as shipped.

    python benchmarks/bench_step_trn2_model.py           # all shipped configs, ~10-20 minutes on 2 cores
    python benchmarks/bench_step_trn2_model.py --configs configs/trn2/qwen3_5-2b.yaml
    python benchmarks/bench_step_trn2_model.py --published-tp --top 12   # + the 2B at TP = 4, the costliest nodes
    python benchmarks/bench_step_trn2_model.py --fp8      # every config in bf16 and with FP8 weights

Writes benchmarks/results/bench_step_trn2_model.png.
"""

import argparse
import contextlib
import functools
import os
import pathlib
import pickle
import sys
import tempfile
import time

os.environ.setdefault("VLLM_GDN_NKI_INTERPRET", "1")  # the kernels' cost model lives in the interpreter
os.environ["VLLM_GDN_BACKEND"] = "torch"  # the traced graph: the torch core, whose kernel-replaced nodes are priced apart

import torch  # noqa: E402
import yaml  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run as a program: the repository root, for benchmarks.* and tests.neuron.*
    sys.path.insert(0, str(ROOT))

from benchmarks import step_model  # noqa: E402
from tests.neuron import serve_config  # noqa: E402
from tests.neuron.runner import GraphRecorder  # noqa: E402
from vllm_gdn_neuron import sizing  # noqa: E402
from vllm_gdn_neuron.model import fp8 as fp8_format  # noqa: E402
from vllm_gdn_neuron.shells.neuron.fp8 import FP8_ON_DEVICE, keep_fp8_on_device  # noqa: E402
from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM  # noqa: E402

RESULTS = HERE / "results"
PROMPT = 1024
# vllm-neuron's own Qwen3.5 port on trn2.3xlarge, TP = 4, 1024 tokens in: (TTFT ms, TPOT ms).
PUBLISHED = {"Qwen/Qwen3.5-2B": (145.0, 3.88), "Qwen/Qwen3.5-27B": (284.0, 48.5),
             "Qwen/Qwen3.5-35B-A3B": (230.0, 36.17)}
# The targets (modeled): TPOT within 1.3x of the HBM floor; these per model.
TARGETS = {"Qwen/Qwen3.5-35B-A3B": ("tpot", 8.0), "Qwen/Qwen3.5-2B": ("ttft", 45.0)}
FLOOR_RATIO = 1.3
PERIOD = 4  # one GatedDeltaNet-GatedDeltaNet-GatedDeltaNet-attention period

# --- the collectives of a tensor-parallel group, as graph nodes --------------------------------

_LIB = torch.library.Library("step_model", "DEF")
_LIB.define("all_reduce(Tensor x, int world) -> Tensor")
_LIB.define("all_gather(Tensor x, int world, int dim) -> Tensor")


@torch.library.impl(_LIB, "all_reduce", "CompositeExplicitAutograd")
def _all_reduce(x, world):
    return x.clone()


@torch.library.impl(_LIB, "all_gather", "CompositeExplicitAutograd")
def _all_gather(x, world, dim):
    return torch.cat([x] * world, dim)


class PricedGroup:
    """A tensor-parallel group of ``world_size`` ranks (this is rank 0) whose collectives stay in the graph."""

    def __init__(self, world_size: int) -> None:
        self.world_size, self.rank_in_group = world_size, 0

    def all_reduce(self, tensor):
        return torch.ops.step_model.all_reduce(tensor, self.world_size)

    def all_gather(self, tensor, dim=-1):
        return torch.ops.step_model.all_gather(tensor, self.world_size, dim)


class ShapeRecorder(GraphRecorder):
    """The harness's recording backend, keeping each ATen graph but running none (outputs are empty)."""

    def _keep(self, gm, example_inputs):
        self.aten_graphs.append(gm)
        (outputs,) = [n.args[0] for n in gm.graph.nodes if n.op == "output"]
        values = [o.meta["val"] if isinstance(o, torch.fx.Node) else None for o in outputs]

        def run(*args):
            return [torch.empty(v.shape, dtype=v.dtype) if v is not None else None for v in values]

        return run


def priced_model_class(tp: int):
    """The Neuron shell on a :class:`PricedGroup` of ``tp`` ranks, its weights untouched pages (no checkpoint)."""

    class PricedQwen3_5(Qwen3_5NeuronForCausalLM):
        @classmethod
        def from_configs(cls, hf_config, neuron_config=None, *, text_neuron_config=None, vision_neuron_config=None):
            # The text decoder (the shipped configs take no images: limit-mm-per-prompt 0).
            return cls(hf_config, neuron_config if neuron_config is not None else text_neuron_config,
                       tp_group=PricedGroup(tp))

        def load_weights(self, model_path, device, download_dir=None):
            if self.fp8_on_device:  # converted on the meta device: no weight is touched
                keep_fp8_on_device(self, {name for name, _ in self.named_parameters()})
            self.to_empty(device=device)

    return PricedQwen3_5


# --- one config ---------------------------------------------------------------------------------


def load_config(path: pathlib.Path) -> dict:
    settings = yaml.safe_load(path.read_text())
    neuron = settings["additional-config"]["neuron_config"]
    return dict(path=path, model=settings["model"], tp=int(settings["tensor-parallel-size"]),
                fp8=neuron.get("quantization") == FP8_ON_DEVICE,
                max_model_len=int(settings["max-model-len"]), max_num_seqs=int(settings["max-num-seqs"]),
                prefill_buckets=list(neuron["num_batched_tokens_buckets"]),
                decode_buckets=list(neuron["num_seqs_buckets"]))


# The published block-FP8 checkpoints' quantization_config (the format ``model/fp8.py`` reads).
FP8_QUANTIZATION_CONFIG = {"quant_method": fp8_format.FP8_METHOD, "fmt": fp8_format.SUPPORTED_FMT,
                           "activation_scheme": fp8_format.SUPPORTED_ACTIVATION_SCHEME,
                           "weight_block_size": list(fp8_format.BLOCK_SIZE)}


def hf_config_of(name: str, layers: int | None = None, fp8: bool = False):
    import transformers

    class_name, overrides, _ = sizing.PUBLISHED[name]
    config = getattr(transformers, class_name)(**overrides)
    config.dtype = torch.bfloat16
    if fp8:
        config.quantization_config = dict(FP8_QUANTIZATION_CONFIG)
    if layers is not None:
        config.layer_types = list(config.layer_types[:layers])
        config.num_hidden_layers = layers
    return config


def layer_of(node) -> int | None:
    for path, _ in (node.meta.get("nn_module_stack") or {}).values():
        marker = "layers["
        if marker in path:
            return int(path.split(marker, 1)[1].split("]", 1)[0])
        if ".layers." in path:
            return int(path.split(".layers.", 1)[1].split(".", 1)[0])
    return None


def categorize(node, name, inputs) -> str:
    """The breakdown category of a node, from the source frames and modules it was traced from."""
    stack = node.meta.get("stack_trace") or ""
    modules = " ".join(path for path, _ in (node.meta.get("nn_module_stack") or {}).values())
    if name in step_model.COLLECTIVE_OPS:
        return "collectives"
    if "lm_head" in stack or layer_of(node) is None and "model.norm" in modules + stack:
        return "logits"
    if "routed_experts.py" in stack or "softmax_top_k" in stack or "self.gate(x)" in stack:
        return "experts"
    weight_matmul = name in step_model.MATMUL_OPS and any(a in inputs for a in node.args if isinstance(a, torch.fx.Node))
    is_linear = "torch/nn/modules/linear.py" in stack or ".weight" in stack
    if weight_matmul or (name in step_model.MATMUL_OPS and is_linear):
        return "matmuls"
    if "/ops/" in stack or "gated_deltanet.py" in stack or "shells/neuron/gdn.py" in stack:
        return "gdn"
    if "shells/neuron/attention.py" in stack or "model/attention.py" in stack:
        return "attention"
    return "other"


def is_gdn_core(node) -> bool:
    """A node of the GatedDeltaNet core that an NKI kernel replaces on trn2 (the ops surface's conv / delta rule)."""
    return "vllm_gdn_neuron/ops/backends/torch/" in (node.meta.get("stack_trace") or "")


@functools.lru_cache(maxsize=None)
def nki_gdn_seconds(prefill_tokens: int, rows: int, channels: int, v_heads: int, k_heads: int) -> float:
    """Modeled seconds of one GatedDeltaNet layer's NKI kernels on one physical core, scaled to a logical one.

    Prefill: ``conv1d_prefill`` over ``[1, C, S]`` + ``gdn_cte`` ("schur") of one head times
    ``v_heads``; decode: ``conv1d_decode`` of ``rows`` + ``gdn_recurrent_step``.
    """
    import bench_kernels_trn2_model as kernels_bench
    from vllm_gdn_neuron.kernels.conv1d import gdn_conv1d_decode, gdn_conv1d_prefill
    from vllm_gdn_neuron.kernels.recurrent_step import gdn_recurrent_step

    d = kernels_bench.DIM
    weight = torch.randn(channels, 4).bfloat16()
    if prefill_tokens:
        mixed = torch.randn(1, channels, prefill_tokens).bfloat16()
        conv = kernels_bench.modeled(lambda: gdn_conv1d_prefill(mixed, weight)).modeled_time_s
        cte = kernels_bench.modeled(kernels_bench.gdn_cte_case(prefill_tokens, "schur")).modeled_time_s * v_heads
        return (conv + cte) / step_model.LNC
    x, state = torch.randn(rows, channels, 1).bfloat16(), torch.randn(rows, channels, 4).bfloat16()
    conv = kernels_bench.modeled(lambda: gdn_conv1d_decode(x, state, weight)).modeled_time_s
    q, k = kernels_bench.unit(rows, k_heads, d), kernels_bench.unit(rows, k_heads, d)
    v, cache = torch.randn(rows, v_heads, d).bfloat16(), torch.randn(rows, v_heads, d, d)
    step = kernels_bench.modeled(lambda: gdn_recurrent_step(
        q, k, v, -torch.rand(rows, v_heads), torch.rand(rows, v_heads), cache, list(range(rows)), d**-0.5)).modeled_time_s
    return (conv + step) / step_model.LNC


def trace(config: dict, prefill_bucket: int, decode_buckets: list[int]):
    """``{("prefill", T) | ("decode", rows): aten graph}`` of one period of the layer pattern, as the
    runner's start-up compiles them under the config's settings (bucket lists narrowed to these)."""
    settings = yaml.safe_load(config["path"].read_text())
    settings["tensor-parallel-size"] = config["tp"]
    neuron = settings["additional-config"]["neuron_config"]
    neuron["num_batched_tokens_buckets"] = [prefill_bucket]
    neuron["num_seqs_buckets"] = sorted(decode_buckets)
    if config["fp8"]:
        neuron["quantization"] = FP8_ON_DEVICE
    recorder = ShapeRecorder()
    with tempfile.TemporaryDirectory() as model_dir:
        hf_config_of(config["model"], PERIOD, config["fp8"]).save_pretrained(model_dir)
        serve_config.start(priced_model_class(config["tp"]), settings, model_dir, backend=recorder)
    labels = [("prefill", prefill_bucket)] + [("decode", rows) for rows in sorted(decode_buckets)]
    if len(recorder.aten_graphs) != len(labels):
        raise RuntimeError(f"warm-up compiled {len(recorder.aten_graphs)} graphs for the {len(labels)} buckets {labels}")
    return dict(zip(labels, recorder.aten_graphs))


def weights_touched_bytes(config: dict, rows: int) -> float:
    """Bytes of weights one decode step of ``rows`` reads on one core (the HBM floor's numerator)."""
    with torch.device("meta"):
        model = Qwen3_5NeuronForCausalLM(hf_config_of(config["model"], fp8=config["fp8"]), None,
                                         tp_group=PricedGroup(config["tp"]))
        if config["fp8"]:
            keep_fp8_on_device(model, {name for name, _ in model.named_parameters()})
    text = model.config
    total = 0.0
    for name, parameter in model.named_parameters():
        size = parameter.numel() * parameter.element_size()
        if name == "model.embed_tokens.weight":
            size = rows * parameter.shape[1] * parameter.element_size()
        elif ".mlp.experts." in name:
            experts, top_k = text.num_experts, text.num_experts_per_tok
            size *= 1 - (1 - top_k / experts) ** rows  # expected distinct experts / E
        total += size
    return total


def price(graph, config: dict, kind: str, size: int) -> dict:
    """Seconds per category of one bucket's step on one logical core, the layer counts applied."""
    dims = sizing.published_dims(config["model"])
    counts = {"linear_attention": dims.num_gdn_layers / 3, "full_attention": dims.num_attention_layers / 1}
    kinds = hf_config_of(config["model"], PERIOD).layer_types
    totals = dict.fromkeys(step_model.CATEGORIES, 0.0)
    flops = hbm = 0.0
    gdn_layers_seen = set()
    heaviest = []
    for node, cost in step_model.price_graph(graph, categorize):
        layer = layer_of(node)
        scale = 1.0 if layer is None else counts[kinds[layer]]
        if is_gdn_core(node):
            gdn_layers_seen.add(layer)
            continue  # replaced by the NKI kernels' modeled time below
        totals[cost.category] += cost.time_s * scale
        heaviest.append((cost.time_s * scale, cost.category, cost.op, str(tuple(node.meta["val"].shape))
                         if isinstance(node.meta.get("val"), torch.Tensor) else "", layer))
        flops += cost.flops * scale
        hbm += cost.hbm_bytes * scale
    tp = config["tp"]
    per_layer = nki_gdn_seconds(size if kind == "prefill" else 0, size if kind == "decode" else 0,
                                dims.conv_channels // tp, dims.linear_num_value_heads // tp,
                                dims.linear_num_key_heads // tp)
    totals["gdn"] += per_layer * dims.num_gdn_layers
    heaviest.sort(key=lambda item: -item[0])
    return dict(seconds=totals, total=sum(totals.values()), flops=flops, hbm_bytes=hbm,
                gdn_kernel_layers=len(gdn_layers_seen), heaviest=heaviest)


def model_config(path: pathlib.Path, tp: int | None = None, fp8: bool = False) -> dict:
    config = load_config(path)
    if tp is not None:
        config["tp"] = tp
    config["fp8"] = config["fp8"] or fp8
    prefill_bucket = next(b for b in config["prefill_buckets"] if b >= PROMPT)
    decode = sorted(set(config["decode_buckets"]) | {1})
    started = time.time()
    graphs = trace(config, prefill_bucket, decode)
    traced = time.time() - started
    rows = {}
    for (kind, size), graph in graphs.items():
        rows[(kind, size)] = price(graph, config, kind, size)
    floors = {r: weights_touched_bytes(config, r) / step_model.HBM_BYTES_PER_S for r in decode}
    return dict(config=config, prefill_bucket=prefill_bucket, rows=rows, floors=floors, trace_s=traced)


# --- report -------------------------------------------------------------------------------------


def model_label(config: dict) -> str:
    """The checkpoint's short name, ``-FP8`` where its weights are FP8 on the device."""
    name = config["model"].split("/")[-1]
    return name + "-FP8" if config["fp8"] and not name.endswith("-FP8") else name


def published_anchor(config: dict):
    """vllm-neuron's published (TTFT, TPOT) of the config's model in bf16 (None for FP8 rows: no such figure)."""
    return None if config["fp8"] else PUBLISHED.get(config["model"])


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f}"


def report(results: list[dict]) -> None:
    print("MODELED trn2 figures (one logical NeuronCore = 2 x NeuronCore-v3, LNC = 2), not measurements.\n")
    print(f"{'config':<22} {'TP':>2} {'step':<14} {'modeled ms':>10} {'floor ms':>8} {'x floor':>7} "
          f"{'published':>9}  " + " ".join(f"{c:>11}" for c in step_model.CATEGORIES))
    for result in results:
        config = result["config"]
        name = model_label(config)
        published = published_anchor(config)
        shipped = max(config["decode_buckets"])
        for (kind, size), row in result["rows"].items():
            if kind == "prefill":
                label, floor, pub = f"TTFT T={size}", None, published[0] if published else None
            else:
                label = f"TPOT rows={size}" + (" (shipped)" if size == shipped else "")
                floor = result["floors"][size]
                pub = published[1] if published and size == shipped else None
            ratio = f"{row['total'] / floor:7.2f}" if floor else f"{'-':>7}"
            print(f"{name:<22} {config['tp']:>2} {label:<14} {_ms(row['total']):>10} "
                  f"{_ms(floor) if floor else '       -':>8} {ratio} {pub if pub else '-':>9}  "
                  + " ".join(f"{_ms(row['seconds'][c]):>11}" for c in step_model.CATEGORIES))
    print("\nTargets (modeled)")
    for result in results:
        config = result["config"]
        name = model_label(config)
        for rows_, floor in result["floors"].items():
            total = result["rows"][("decode", rows_)]["total"]
            verdict = "met" if total <= FLOOR_RATIO * floor else "NOT met"
            print(f"  {name} TPOT rows={rows_} within {FLOOR_RATIO}x of the HBM floor: "
                  f"{total / floor:.2f}x  {verdict}")
        target = TARGETS.get(config["model"])
        if target and config["tp"] == 4 and not config["fp8"]:
            kind, bound = target
            if kind == "tpot":
                checks = [(f"TPOT rows={rows_}", result["rows"][("decode", rows_)]["total"]) for rows_ in result["floors"]]
            else:
                checks = [(f"TTFT({PROMPT})", result["rows"][("prefill", result["prefill_bucket"])]["total"])]
            for label, total in checks:
                print(f"  {name} TP={config['tp']} {label} <= {bound} ms: {total * 1e3:.2f} ms  "
                      f"{'met' if total * 1e3 <= bound else 'NOT met'}")


def heaviest(results: list[dict], top: int) -> None:
    """The costliest nodes of each step (time with the layer count applied), to read the breakdown by."""
    for result in results:
        name = model_label(result["config"])
        for (kind, size), row in result["rows"].items():
            print(f"\n{name} TP={result['config']['tp']} {kind} {size}: costliest nodes (modeled ms, all layers)")
            for seconds, category, op, shape, layer in row["heaviest"][:top]:
                print(f"  {seconds * 1e3:8.3f}  {category:<11} {op:<16} {shape:<28} layer {layer}")


def plot(results: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    for ax, kind in zip(axes, ("prefill", "decode")):
        labels, bottoms = [], []
        bars = {c: [] for c in step_model.CATEGORIES}
        markers = []
        for result in results:
            name = model_label(result["config"])
            published = published_anchor(result["config"])
            for (k, size), row in result["rows"].items():
                if k != kind:
                    continue
                labels.append(f"{name}\n{'T' if k == 'prefill' else 'rows'}={size}")
                for c in step_model.CATEGORIES:
                    bars[c].append(row["seconds"][c] * 1e3)
                floor = result["floors"].get(size) if k == "decode" else None
                shipped = k == "prefill" or size == max(result["config"]["decode_buckets"])
                pub = (published[0] if k == "prefill" else published[1]) if published and shipped else None
                markers.append((floor, pub))
        x = range(len(labels))
        bottoms = [0.0] * len(labels)
        for c in step_model.CATEGORIES:
            ax.bar(list(x), bars[c], bottom=bottoms, label=c)
            bottoms = [b + v for b, v in zip(bottoms, bars[c])]
        for i, (floor, pub) in enumerate(markers):
            if floor:
                ax.plot([i - 0.4, i + 0.4], [floor * 1e3] * 2, "k--")
            if pub:
                ax.plot(i, pub, "r*", markersize=11)
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("modeled ms per step (log)")
        ax.set_title(("TTFT, 1024-token prompt" if kind == "prefill" else "TPOT")
                     + " (modeled trn2; dashes: HBM floor, stars: vllm-neuron published)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="*", type=pathlib.Path,
                        default=sorted((ROOT / "configs" / "trn2").glob("*.yaml")))
    parser.add_argument("--published-tp", action="store_true",
                        help="also model each config whose TP differs from the published figures' TP = 4 at TP = 4")
    parser.add_argument("--top", type=int, default=0, help="print the N costliest nodes of every step")
    parser.add_argument("--fp8", action="store_true",
                        help="also model each bf16 config with FP8 weights on the device (neuron_config.quantization fp8)")
    parser.add_argument("--save", type=pathlib.Path, help="also write the results (pickle) here")
    parser.add_argument("--load", nargs="*", type=pathlib.Path, default=[],
                        help="report saved results instead of tracing (runs of configs in parallel processes)")
    args = parser.parse_args()
    torch.manual_seed(0)
    results = [r for path in args.load for r in pickle.loads(path.read_bytes())]
    for path in [] if args.load else args.configs:
        shipped = load_config(path)
        for tp in [None] + ([4] if args.published_tp and shipped["tp"] != 4 else []):
            for fp8 in [False] + ([True] if args.fp8 and not shipped["fp8"] else []):
                result = model_config(path, tp, fp8)
                print(f"[traced {path.name} at TP={result['config']['tp']}{' with FP8 weights' if fp8 else ''} in "
                      f"{result['trace_s']:.0f} s]", flush=True)
                results.append(result)
    if args.save:
        args.save.write_bytes(pickle.dumps(results))
    report(results)
    if args.top:
        heaviest(results, args.top)
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(results, RESULTS / "bench_step_trn2_model.png")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
