"""Per-call host overhead of one GDN layer's decode: the public ops against the paged ops.

A decode step of one GDN layer is ``conv1d_decode`` + ``gdn_decode``. Timed per call, eager,
on CPU, round-robin (the best of many rounds, so load bursts from elsewhere hit all alike):

  public   ops.conv1d_decode + ops.gdn_decode: per call they validate the slot indices on the host
           (a CPU copy, torch.unique) and g <= 0 (g.max())
  paged    ops.paged_conv1d_decode + ops.paged_gdn_decode on a DecodeStep: shape checks only;
           the values are checked once per engine step by check_step (timed on its own row)
  backend  the torch backend's conv1d_decode + gdn_decode with no checks at all (the floor)

overhead = time - backend time. The table prints µs per call; a PNG goes to
benchmarks/results/bench_step_overhead.png.

    python benchmarks/bench_step_overhead.py
"""

import pathlib
import time

import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.ops.backends.torch import conv1d as torch_conv1d
from vllm_gdn_neuron.ops.backends.torch import recurrent

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
# (rows N, Hk, Hv, D): tiny heads (host overhead dominates) and Qwen3.5's 16/32 x 128.
SHAPES = ((1, 2, 4, 16), (8, 2, 4, 16), (1, 16, 32, 128), (8, 16, 32, 128))
CALLS, ROUNDS = 10, 10


def _inputs(rows, num_k_heads, num_v_heads, dim):
    gen = torch.Generator().manual_seed(0)
    channels = 2 * num_k_heads * dim + num_v_heads * dim
    pages = rows + 2
    return dict(
        x=torch.randn(rows, channels, generator=gen, dtype=torch.float32).bfloat16(),
        weight=torch.randn(channels, 4, generator=gen).bfloat16(),
        conv=torch.zeros(pages, channels, 4, dtype=torch.bfloat16),
        q=torch.randn(rows, num_k_heads, dim, generator=gen).bfloat16(),
        k=torch.randn(rows, num_k_heads, dim, generator=gen).bfloat16(),
        v=torch.randn(rows, num_v_heads, dim, generator=gen).bfloat16(),
        g=-torch.rand(rows, num_v_heads, generator=gen), beta=torch.rand(rows, num_v_heads, generator=gen),
        ssm=torch.zeros(pages, num_v_heads, dim, dim), slots=torch.arange(1, rows + 1),
    )


def _runs(a):
    step = ops.DecodeStep.build(a["slots"], pad_page=0)
    gdn = (a["q"], a["k"], a["v"], a["g"], a["beta"], a["ssm"])
    scale = a["q"].shape[-1] ** -0.5

    def public():
        ops.conv1d_decode(a["x"], a["weight"], a["conv"], a["slots"])
        ops.gdn_decode(*gdn, a["slots"], use_qk_l2norm=True)

    def paged():
        ops.paged_conv1d_decode(a["x"], a["weight"], a["conv"], step)
        ops.paged_gdn_decode(*gdn, step, use_qk_l2norm=True)

    def backend():
        torch_conv1d.conv1d_decode(a["x"], a["weight"], a["conv"], a["slots"], "silu")
        recurrent.gdn_decode(*gdn, a["slots"], scale, True)

    def check_step():
        ops.check_step(a["ssm"].shape[0], 0, decode=step)

    return dict(public=public, paged=paged, backend=backend, check_step=check_step)


def race(runs):
    """Best µs per call of each run, round-robin over ROUNDS rounds of CALLS calls."""
    best = {name: float("inf") for name in runs}
    for fn in runs.values():
        fn()
    for _ in range(ROUNDS):
        for name, fn in runs.items():
            start = time.perf_counter()
            for _ in range(CALLS):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / CALLS * 1e6)
    return best


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)  # host overhead is single-threaded; one thread keeps load from others out
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; bf16 activations, fp32 state; µs per call")
    header = f"{'N':>3} {'Hk/Hv x D':>11} {'public':>8} {'paged':>8} {'backend':>8} " \
             f"{'public ovh':>10} {'paged ovh':>9} {'check_step':>10}"
    print(header)
    rows = []
    for rows_n, hk, hv, dim in SHAPES:
        t = race(_runs(_inputs(rows_n, hk, hv, dim)))
        over_public, over_paged = t["public"] - t["backend"], t["paged"] - t["backend"]
        rows.append((f"N={rows_n} {hk}/{hv}x{dim}", over_public, over_paged, t["check_step"]))
        print(f"{rows_n:>3} {f'{hk}/{hv} x {dim}':>11} {t['public']:8.0f} {t['paged']:8.0f} {t['backend']:8.0f} "
              f"{over_public:10.0f} {over_paged:9.0f} {t['check_step']:10.0f}")
    _plot(rows)


def _plot(rows):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a test dependency
        return
    RESULTS.mkdir(exist_ok=True)
    labels = [r[0] for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    for shift, (index, name) in zip((-0.27, 0.0, 0.27), ((1, "public ops"), (2, "paged ops"), (3, "check_step"))):
        ax.bar([x + shift for x in xs], [r[index] for r in rows], width=0.27, label=name)
    ax.set_xticks(list(xs), labels, rotation=20, fontsize=8)
    ax.set_ylabel("µs per layer call over the unchecked backend")
    ax.set_title("GDN decode: host overhead per layer (check_step: once per engine step)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "bench_step_overhead.png", dpi=120)


if __name__ == "__main__":
    main()
