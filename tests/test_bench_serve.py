"""``benchmarks/bench_serve.py``'s engine set-up: the environment each ``--layout`` and engine
gets (vLLM's multiprocessing switch, the engine's own variables, ``LD_PRELOAD``) and how the
reports name the layout, the per-round ratios and the plot. Pure logic: no engine starts."""

import argparse

import pytest

from benchmarks import bench_serve as bench
from vllm_gdn_neuron import cpu_preload

#: what this process's environment may already hold: each engine must set or drop it.
INHERITED = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_GDN_NEURON_DISABLE": "1",
             "VLLM_GDN_BACKEND": "nki", "LD_PRELOAD": "/inherited.so", "HOME": "/home/x"}


def _args(**overrides):
    values = dict(layout="served", compare=None, preload=None, compiled=False, mtp=0, model=bench.TRAINED_CHECKPOINT)
    return argparse.Namespace(**dict(values, **overrides))


@pytest.fixture
def fake_libraries(tmp_path, monkeypatch):
    """PRELOAD_CANDIDATES pointed at two files under ``tmp_path``; returns their ``LD_PRELOAD``."""
    paths = {name: tmp_path / f"lib{name}.so" for name in cpu_preload.PRELOAD_CANDIDATES}
    for path in paths.values():
        path.write_bytes(b"")
    monkeypatch.setattr(cpu_preload, "PRELOAD_CANDIDATES", {name: (str(path),) for name, path in paths.items()})
    return ":".join(str(paths[name]) for name in ("tcmalloc", "iomp"))


@pytest.mark.parametrize("layout, multiprocessing", [("served", "1"), ("in-process", "0")])
@pytest.mark.parametrize("engine", ["auto", "auto+mtp", "built-in", "built-in+mtp", "torch"])
def test_layout_sets_vllm_multiprocessing(layout, multiprocessing, engine):
    env = bench.engine_env(engine, _args(layout=layout), dict(INHERITED, VLLM_ENABLE_V1_MULTIPROCESSING="x"))
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == multiprocessing
    assert env["HOME"] == "/home/x"


@pytest.mark.parametrize("engine, variables", [
    ("auto", {}), ("auto+mtp", {}), ("torch", {"VLLM_GDN_BACKEND": "torch"}),
    ("vllm_cpu", {"VLLM_GDN_BACKEND": "vllm_cpu"}), ("built-in", {"VLLM_GDN_NEURON_DISABLE": "1"}),
    ("built-in+mtp@compiled", {"VLLM_GDN_NEURON_DISABLE": "1"})])
def test_engine_variables_replace_inherited_ones(engine, variables):
    env = bench.engine_env(engine, _args(), INHERITED)
    for name in ("VLLM_GDN_BACKEND", "VLLM_GDN_NEURON_DISABLE"):
        assert env.get(name) == variables.get(name), name


@pytest.mark.parametrize("layout", list(bench.LAYOUTS))
def test_preload_reaches_every_engine(fake_libraries, layout):
    """``--preload`` alone: every engine's process (whose environment vLLM's engine core and worker
    inherit) has the libraries in ``LD_PRELOAD``, replacing an inherited value."""
    args = _args(layout=layout, preload=["iomp", "tcmalloc"])
    for engine in ("auto", "built-in@compiled"):
        assert bench.engine_env(engine, args, INHERITED)["LD_PRELOAD"] == fake_libraries


def test_compare_preload_only_the_variant_preloads(fake_libraries):
    args = _args(compare="preload", preload=list(bench.DEFAULT_PRELOAD))
    assert "LD_PRELOAD" not in bench.engine_env("auto", args, INHERITED)
    assert bench.engine_env("auto@preload", args, INHERITED)["LD_PRELOAD"] == fake_libraries


def test_without_preload_the_inherited_value_stays():
    assert bench.engine_env("auto", _args(), INHERITED)["LD_PRELOAD"] == "/inherited.so"


@pytest.mark.parametrize("layout, stem", [("served", ""), ("in-process", "-in-process")])
def test_reports_name_the_layout(layout, stem):
    args = _args(layout=layout, compiled=True)
    assert bench.setup_text(args, {"auto": [12.0]}, {"auto": [2**30]}).startswith(f"layout {layout} (")
    assert bench.setup_stem(args) == stem + "-compiled"


def test_the_engine_started_first_rotates_from_start_to_start(monkeypatch, tmp_path):
    # Where a process's memory lands stays with it, and the engine started second decoded
    # 5-8 % faster at real dims: with --starts, each engine starts first in turn.
    started = []

    class FakeEngine:
        def __init__(self, name, args, log, model):
            started.append(name)
            self.started = 0.0

        def reply(self):
            return {"resident": 0}

        def close(self):
            pass

    monkeypatch.setattr(bench, "Engine", FakeEngine)
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    monkeypatch.setattr(bench, "scenarios", lambda args: [])
    monkeypatch.setattr(bench, "measure_read_bandwidth", lambda: 0.0)
    bench.run_benchmark(_args(engines=["auto", "built-in", "torch"], starts=4, rounds=1), [])
    assert started == ["auto", "built-in", "torch", "built-in", "torch", "auto", "torch", "auto", "built-in",
                       "auto", "built-in", "torch"]


def _prefill_rounds(tokens_per_s):
    """``run_benchmark``'s rounds of one prefill row: engine -> tokens/s in each round."""
    return {("prefill", 8, name): [dict(tokens_per_s=value, round=rnd, load=(1.0, 1.0, 1.0),
                                       latency_ms={f"p{p}": 1.0 for p in bench.PERCENTILES})
                                  for rnd, value in enumerate(values)]
            for name, values in tokens_per_s.items()}


def test_per_round_ratios_say_which_engine_started_first():
    # 2 starts x 2 rounds: auto starts first in start 0 (rounds 0, 1), built-in in start 1.
    args = _args(engines=["auto", "built-in"], starts=2, rounds=2)
    rounds = _prefill_rounds({"auto": [90.0, 96.0, 110.0, 105.0], "built-in": [100.0, 100.0, 100.0, 100.0]})
    ratios = bench.round_ratios(args, rounds, "prefill", 8, "auto", "built-in")
    assert [(r["round"], r["ratio"], r["started_first"]) for r in ratios] == [
        (0, 0.9, True), (1, 0.96, True), (2, 1.1, False), (3, 1.05, False)]
    assert bench._paired(ratios) == pytest.approx(1.005)
    assert bench.round_ratios(args, rounds, "prefill", 8, "auto", "torch") == [] and bench._paired([]) is None


def test_the_table_and_plot_show_every_round_and_only_the_phases_run(monkeypatch, tmp_path):
    args = _args(engines=["auto", "built-in"], starts=2, rounds=2)
    monkeypatch.setattr(bench, "scenarios", lambda args: [("prefill", 8)])
    rounds = _prefill_rounds({"auto": [90.0, 96.0, 110.0, 104.0], "built-in": [100.0, 100.0, 100.0, 100.0]})
    text, rows = bench.table(args, rounds, bandwidth=1e10)
    assert "| prefill | 8 | 110.0 | 100.0 | - | 1.10x (1.00x) |" in text
    assert [r["ratio"] for r in rows[0]["per_round"]["auto / built-in"]] == pytest.approx([0.9, 0.96, 1.1, 1.04])
    figure = bench.plot(rows, tmp_path / "plot.png")
    assert [ax.get_title() for ax in figure.axes] == ["prefill", "every round: filled = the first engine started first"]
    dots = figure.axes[1]
    filled, hollow = (collection.get_offsets()[:, 1].tolist() for collection in dots.collections)
    assert filled == pytest.approx([0.9, 0.96]) and hollow == pytest.approx([1.1, 1.04])
    assert (tmp_path / "plot.png").stat().st_size > 0
