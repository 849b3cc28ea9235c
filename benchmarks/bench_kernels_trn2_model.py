"""Modeled trn2 time of the NKI kernels, from the NKI interpreter's cost model (not a measurement).

Every kernel runs in the CPU interpreter (``kernels/interp``) under ``cost.record()``; the
model (``kernels/interp/cost.py``, constants and their sources in ``docs/kernels/interpreter.md``) schedules the
recorded instructions on one NeuronCore-v3's engines. Printed per kernel: modeled time,
the TensorE and HBM roofline shares (roofline time / modeled time: how close the kernel
comes to the bound that applies to it), TensorE utilisation against the bf16 peak, per-engine
busy shares, and the busiest engine. Then gdn_cte "schur" against "neumann" at
S = 128 .. 4096 next to the project's design targets (schur 1.8x faster at S = 128, ~3.7x
at S >= 2048), and schur's group_size sweep at S = 2048.

Targets (modeled): schur >= 60 % of the TensorE roofline at S >= 2048; conv1d prefill >= 70 %
of the HBM roofline. Each row also gives the program size (instructions the compiler
schedules; device loops counted once) next to the instructions executed.

    python benchmarks/bench_kernels_trn2_model.py            # ~1-2 minutes on 2 cores
    python benchmarks/bench_kernels_trn2_model.py --quick    # smaller shapes, seconds

Writes benchmarks/results/bench_kernels_trn2_model.png.
"""

import argparse
import os
import pathlib

os.environ.setdefault("VLLM_GDN_NKI_INTERPRET", "1")  # the cost model lives in the interpreter

import torch  # noqa: E402

import vllm_gdn_neuron.kernels.interp  # noqa: E402,F401  (the interpreter serves the kernels: opt in first)
from vllm_gdn_neuron.kernels.conv1d import gdn_conv1d_decode, gdn_conv1d_prefill  # noqa: E402
from vllm_gdn_neuron.kernels.gdn2 import gdn2_chunked  # noqa: E402
from vllm_gdn_neuron.kernels.gdn_cte import gdn_cte  # noqa: E402
from vllm_gdn_neuron.kernels.interp import cost  # noqa: E402
from vllm_gdn_neuron.kernels.recurrent_step import gdn_recurrent_step  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")
CLAIM = {128: 1.8, 2048: 3.7, 4096: 3.7}  # the design target for the schur-over-neumann speed-up
DIM = 128


def modeled(fn):
    """Run ``fn`` under the cost recorder; return its ``CostReport``."""
    with cost.record(keep_instructions=False) as recorder:
        fn()
    return recorder.report()


def unit(*shape):
    return torch.nn.functional.normalize(torch.randn(*shape), dim=-1).bfloat16()


def gdn_cte_case(s, algorithm, heads=1, group_size=8):
    q, k = unit(1, heads, s, DIM), unit(1, heads, s, DIM)
    v = torch.randn(1, heads, s, DIM).bfloat16()
    g, beta = -torch.rand(1, heads, s), torch.rand(1, heads, s)
    return lambda: gdn_cte(q, k, v, g, beta, scale=DIM**-0.5, algorithm=algorithm, group_size=group_size)


def kernel_cases(quick):
    s = 512 if quick else 2048
    channels = 1024 if quick else 8192  # Qwen3.5: 2 * 16 * 128 + 32 * 128 conv channels
    batch = 8 if quick else 64
    heads = 4 if quick else 32
    t2 = 128 if quick else 256
    mixed = torch.randn(1, channels, s).bfloat16()
    weight = torch.randn(channels, 4).bfloat16()
    x_dec, conv_state = torch.randn(batch, channels, 1).bfloat16(), torch.randn(batch, channels, 4).bfloat16()
    n_dec = 8
    q_dec, k_dec = unit(n_dec, heads // 2, DIM), unit(n_dec, heads // 2, DIM)
    v_dec = torch.randn(n_dec, heads, DIM).bfloat16()
    cache = torch.randn(n_dec, heads, DIM, DIM)
    q2, k2 = unit(t2, 1, DIM), unit(t2, 1, DIM)
    v2 = torch.randn(t2, 1, DIM).bfloat16()
    return [
        (f"gdn_cte schur    S={s} H=1 D={DIM} bf16", gdn_cte_case(s, "schur")),
        (f"gdn_cte neumann  S={s} H=1 D={DIM} bf16", gdn_cte_case(s, "neumann")),
        (f"conv1d prefill   C={channels} T={s} K=4 bf16", lambda: gdn_conv1d_prefill(mixed, weight)),
        (f"conv1d decode    B={batch} C={channels} K=4 bf16", lambda: gdn_conv1d_decode(x_dec, conv_state, weight)),
        (f"recurrent step   N={n_dec} Hv={heads} Hk={heads // 2} D={DIM}",
         lambda: gdn_recurrent_step(q_dec, k_dec, v_dec, -torch.rand(n_dec, heads), torch.rand(n_dec, heads),
                                    cache, list(range(n_dec)), DIM**-0.5)),
        (f"gdn2             T={t2} H=1 D={DIM} bf16",
         lambda: gdn2_chunked(q2, k2, v2, -torch.rand(t2, 1, DIM), torch.rand(t2, 1, DIM), None, [0, t2],
                              scale=DIM**-0.5)),
    ]


def kernel_table(cases):
    print("Per kernel (modeled trn2, one NeuronCore-v3; shares = roofline time / modeled time)")
    header = (f"{'kernel':<44} {'modeled us':>10} {'TensorE rf':>10} {'HBM rf':>7} {'TE util':>7}  "
              + " ".join(f"{e:>6}" for e in ENGINES) + "  limiter  instr (program)")
    print(header)
    rows = []
    for name, fn in cases:
        r = modeled(fn)
        busiest = max(ENGINES, key=lambda e: r.engine_busy_s[e])
        rows.append((name, r))
        print(f"{name:<44} {r.modeled_time_s * 1e6:10.2f} {r.tensor_roofline_s / r.modeled_time_s:10.1%} "
              f"{r.hbm_roofline_s / r.modeled_time_s:7.1%} {r.tensor_utilisation:7.1%}  "
              + " ".join(f"{r.engine_busy_share[e]:6.1%}" for e in ENGINES)
              + f"  {busiest:<7}  {r.instructions} ({r.static_instructions})")
    return rows


def schur_vs_neumann(lengths):
    print("\ngdn_cte schur vs neumann (modeled trn2, H=1, D=128, bf16; speed-up = neumann / schur)")
    print(f"{'S':>6} {'schur us':>10} {'neumann us':>11} {'speed-up':>9} {'target':>6} {'schur TensorE rf':>17}")
    rows = []
    for s in lengths:
        schur, neumann = modeled(gdn_cte_case(s, "schur")), modeled(gdn_cte_case(s, "neumann"))
        ratio = neumann.modeled_time_s / schur.modeled_time_s
        claim = f"{CLAIM[s]:.1f}x" if s in CLAIM else "-"
        rows.append((s, schur.modeled_time_s, neumann.modeled_time_s, ratio))
        print(f"{s:6d} {schur.modeled_time_s * 1e6:10.2f} {neumann.modeled_time_s * 1e6:11.2f} {ratio:8.2f}x "
              f"{claim:>6} {schur.tensor_roofline_s / schur.modeled_time_s:17.1%}")
    return rows


def group_sweep(s, sizes):
    print(f"\ngdn_cte schur group_size sweep at S={s} (modeled trn2)")
    print(f"{'group_size':>10} {'modeled us':>11} {'TensorE rf':>11}")
    for size in sizes:
        r = modeled(gdn_cte_case(s, "schur", group_size=size))
        print(f"{size:10d} {r.modeled_time_s * 1e6:11.2f} {r.tensor_roofline_s / r.modeled_time_s:11.1%}")


def targets(kernel_rows, quick):
    """The modeled targets, each with the figure reached (the quick shapes are too small to judge)."""
    print("\nTargets (modeled)" + ("  [--quick shapes: not representative]" if quick else ""))
    shares = {name.split()[0] + " " + name.split()[1]: r for name, r in kernel_rows}
    schur = shares["gdn_cte schur"]
    checks = [
        ("gdn_cte schur >= 60 % of the TensorE roofline at S >= 2048", schur.tensor_roofline_s / schur.modeled_time_s,
         0.60),
        ("conv1d prefill >= 70 % of the HBM roofline", shares["conv1d prefill"].hbm_roofline_s
         / shares["conv1d prefill"].modeled_time_s, 0.70),
    ]
    for what, reached, bound in checks:
        print(f"  {what:<60} {reached:6.1%}  {'met' if reached >= bound else 'NOT met'}")


def plot(kernel_rows, ratio_rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    lengths = [r[0] for r in ratio_rows]
    left.plot(lengths, [r[1] * 1e6 for r in ratio_rows], "o-", label="schur (modeled)")
    left.plot(lengths, [r[2] * 1e6 for r in ratio_rows], "s-", label="neumann (modeled)")
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("S (tokens)")
    left.set_ylabel("modeled trn2 time (us)")
    twin = left.twinx()
    twin.plot(lengths, [r[3] for r in ratio_rows], "k--", label="speed-up (modeled)")
    twin.plot(list(CLAIM), list(CLAIM.values()), "r*", markersize=10, label="design target")
    twin.set_ylabel("neumann / schur")
    left.legend(loc="upper left")
    twin.legend(loc="lower right")
    left.set_title("gdn_cte schur vs neumann, H=1 D=128 bf16")
    names = [name.split("  ")[0].strip() for name, _ in kernel_rows]
    x = range(len(names))
    right.bar([i - 0.2 for i in x], [r.tensor_roofline_s / r.modeled_time_s for _, r in kernel_rows], 0.4,
              label="TensorE roofline share")
    right.bar([i + 0.2 for i in x], [r.hbm_roofline_s / r.modeled_time_s for _, r in kernel_rows], 0.4,
              label="HBM roofline share")
    right.set_xticks(list(x), names, rotation=20, ha="right")
    right.set_ylabel("roofline time / modeled time")
    right.set_title("per kernel (modeled trn2)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"\nplot: {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes, a smoke run")
    args = parser.parse_args()
    torch.manual_seed(0)
    print("All figures are MODELED trn2 times from the NKI interpreter's cost model, not measurements.\n")
    kernel_rows = kernel_table(kernel_cases(args.quick))
    targets(kernel_rows, args.quick)
    lengths = (128, 256, 512) if args.quick else (128, 256, 512, 1024, 2048, 4096)
    ratio_rows = schur_vs_neumann(lengths)
    group_sweep(512 if args.quick else 2048, (1, 3, 8, 16))
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(kernel_rows, ratio_rows, RESULTS / "bench_kernels_trn2_model.png")


if __name__ == "__main__":
    main()
