"""Every bucket graph of the harness lowered to StableHLO and run on XLA's CPU backend, equal to eager.

The runner stand-in (``runner.py``, the runner's own ``torch.compile(model, backend=...,
fullgraph=True, options=...)`` call) compiles each bucket through
:class:`xla_lowering.XlaLoweringBackend` instead of ``aot_eager``. Its native-route importer
(``torch_mlir``: AOTAutograd with the Neuron decompositions, torch-mlir's FX importer and
StableHLO pipeline) lowers every bucket here; torchax's (a proxy of the deprecated HLO route)
the dense model's four buckets. Each module is checked (no float64 on run-time values, no
run-time sizes, no host transfer, no custom call, the Neuron docs' per-op limits) and
compiled for XLA:CPU. Every step of the serving workload (fresh and chunked prompts, a
one-token prompt, full buckets, padded decode batches, requests finishing and handing their
NaN-poisoned pages to the next) runs the XLA executable and, on the same inputs, the ATen
graph under torch; the harness serves on XLA's results. Held: logits and every written cache
page but the sink within 1e-4 of eager (each int8 allocation read through the float32 view
the step takes of it, relative to its largest magnitude; NaNs in the same places), and the
greedy ids equal transformers'. The packed-prefill, verify and vision buckets are lowered
the same way in ``test_packed_prefill.py``, ``test_spec_decode.py`` and ``test_shell_vision.py``.

Each case prints one line per bucket: StableHLO op count, the most frequent ops, the f64
constants folded, and the largest differences seen.
"""

import collections
import functools

import pytest
import torch

from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM

from .runner import NeuronRunnerStandIn
from .test_harness import FAST_WORKLOAD, SLOW_WORKLOAD, check, run_harness, settings_for
from .xla_lowering import LoweringRefused, XlaLoweringBackend, analyse

TOLERANCE = 1e-4


def report(model: str, runner_buckets, backend: XlaLoweringBackend) -> str:
    lines = []
    for label, bucket in zip(runner_buckets, backend.buckets):
        counts = bucket.contents.op_counts
        top = ", ".join(f"{op.split('.')[1]} {n}" for op, n in counts.most_common(6))
        lines.append(f"{model} {label}: {bucket.contents.total_ops} ops ({top}); gather "
                     f"{counts['stablehlo.gather']}, scatter {counts['stablehlo.scatter']}; "
                     f"f64 constants {bucket.contents.float64_constants}; {bucket.calls} steps; "
                     + (f"max diff logits {bucket.max_logits_diff:.2e}, caches {bucket.max_cache_diff:.2e}; "
                        if backend.compare else "not compared; ")
                     + f"lower {bucket.lower_seconds:.1f} s, compile {bucket.compile_seconds:.1f} s")
    return "\n".join(lines)


def bucket_labels(prefill_buckets, decode_buckets, verify_width=None) -> list[str]:
    """The runner warms prefill buckets up first, then decode buckets (compile order); with
    speculative decoding a verify graph of ``verify_width`` tokens a row before each one-token graph."""
    labels = [f"prefill {b}" for b in sorted(prefill_buckets)]
    for b in sorted(decode_buckets):
        labels += ([f"verify {b} x {verify_width}"] if verify_width else []) + [f"decode {b}"]
    return labels


def assert_equal_to_eager(backend: XlaLoweringBackend, buckets: int, warm_up_only=()) -> None:
    """Every bucket within :data:`TOLERANCE` of eager; each serves steps after its warm-up but
    those of ``warm_up_only`` (indices: graphs the workload has no step for)."""
    assert len(backend.buckets) == buckets
    for bucket in backend.buckets:
        assert bucket.calls > (bucket.index not in warm_up_only), f"bucket {bucket.index} served no step after warm-up"
        assert bucket.nan_mismatches == 0
        assert bucket.max_logits_diff <= TOLERANCE, bucket
        assert bucket.max_cache_diff <= TOLERANCE, bucket


def serve_on_xla(model: str, model_dir: str, workload, prefill_buckets, decode_buckets, oracle=True,
                 importer="torch_mlir", **kwargs):
    backend = XlaLoweringBackend(importer)
    result = run_harness(model_dir, workload, prefill_buckets=prefill_buckets, decode_buckets=decode_buckets,
                         backend=backend, **kwargs)
    print("\n" + report(f"{model} ({importer})", bucket_labels(prefill_buckets, decode_buckets), backend))
    assert_equal_to_eager(backend, len(prefill_buckets) + len(decode_buckets))
    if oracle:
        check(result, model_dir, workload)
    return backend


@pytest.mark.slow
@pytest.mark.parametrize("importer", ["torch_mlir", "torchax"])
def test_dense_model_four_buckets_on_xla_equal_eager_and_transformers(tiny_model, importer):
    serve_on_xla("qwen3_5-dense", tiny_model("qwen3_5-dense"), SLOW_WORKLOAD, (8, 64), (2, 4),
                 importer=importer, num_gpu_blocks_override=40)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3_5-moe", "qwen3-next", "qwen3_5-vl", "qwen3_5-moe-vl"])
def test_every_tiny_model_on_xla_equals_eager_and_transformers(tiny_model, model):
    backend = serve_on_xla(model, tiny_model(model), FAST_WORKLOAD, (32,), (4,), num_gpu_blocks_override=24)
    if "moe" in model or model == "qwen3-next":  # routing: top-k (torch-mlir: a sort) and the experts' order
        assert all(b.contents.op_counts["stablehlo.sort"] > 0 for b in backend.buckets)


@pytest.mark.slow
def test_bf16_buckets_lower_and_run_on_xla(tiny_model):
    """Smoke: bf16 buckets lower, pass the content checks, compile and serve (no numeric claim:
    XLA keeps float32 intermediates where torch rounds to bf16)."""
    backend = XlaLoweringBackend(compare=False)
    result = run_harness(tiny_model("qwen3_5-moe"), FAST_WORKLOAD[:3], dtype="bfloat16", prefill_buckets=(32,),
                         decode_buckets=(4,), num_gpu_blocks_override=24, backend=backend)
    print("\n" + report("qwen3_5-moe bf16", bucket_labels((32,), (4,)), backend))
    assert [b.calls > 1 for b in backend.buckets] == [True, True]
    assert all(len(ids) == n for ids, (_, n, _) in zip(result["ids"], FAST_WORKLOAD[:3]))


@pytest.mark.slow
def test_real_dims_2b_buckets_on_xla_equal_eager(tiny_model):
    """Hidden 2048, heads of 128 and 256, the 248,320-token vocabulary: equal to eager (the
    transformers oracle at these dims is ``tests/e2e/test_real_dims.py``'s)."""
    workload = [(1, 3, 0), (40, 3, 0), (16, 2, 1)]
    serve_on_xla("qwen3_5-2b-real", tiny_model("qwen3_5-2b-real"), workload, (16,), (2,), oracle=False,
                 vocab_size=248_320, num_gpu_blocks_override=16)


# --- the check fails when something a device cannot run enters a bucket ---------------------

@functools.cache
def opaque_scale():
    """A custom op (CPU kernel only, no XLA lowering), as an op reached through dispatch would be."""
    @torch.library.custom_op("xla_lowering_test::opaque_scale", mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 1.0

    @scale.register_fake
    def _(x):
        return torch.empty_like(x)

    return scale


def _decode_bucket_with(model_dir, change_norm, importer="torch_mlir"):
    """Serve one decode bucket whose final norm output passes through ``change_norm``."""
    runner = NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM,
                                 settings_for(model_dir, "float32", (8,), (2,), num_gpu_blocks_override=8),
                                 backend=XlaLoweringBackend(importer))
    runner.load_model()  # compiles lazily: the change below is in the traced step
    norm = runner.model.model.norm
    forward = norm.forward
    norm.forward = lambda hidden, residual: (change_norm(forward(hidden, residual)[0]), residual)
    runner.initialize_kv_cache(runner.get_kv_cache_spec())
    runner.warm_up()


# What the refusal of each injection names.
REFUSALS = {"custom op": "xla_lowering_test", "float64 round trip": "float64 computed from run-time values",
            "data-dependent shape": "run-time tensor sizes"}


def injection(name):
    """The change of the final norm's output ``name`` stands for."""
    if name == "custom op":
        return opaque_scale()  # registered outside the traced step
    if name == "float64 round trip":
        return lambda h: h.double().float()
    return lambda h: h + h[h > 0].sum()  # a boolean-mask selection: its size depends on the values


@pytest.mark.slow
@pytest.mark.parametrize("injected", list(REFUSALS))
def test_check_refuses_a_bucket_with_an_injected_op(tiny_model, injected):
    """torch-mlir: the custom op is left as an op it cannot lower, the f64 and the run-time size
    reach the module and the content check refuses them (the size through Dynamo's capture of
    data-dependent shapes, else Dynamo itself refuses the graph)."""
    change = injection(injected)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), pytest.raises(Exception) as refused:
        _decode_bucket_with(tiny_model("qwen3_5-dense"), change)
    text = "".join(str(e) for e in _chain(refused.value))
    assert REFUSALS[injected] in text, text[-2000:]
    assert any(isinstance(e, LoweringRefused) for e in _chain(refused.value))


def _chain(error):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


# --- the content checks on small modules of known content ------------------------------------

def _module(function, *shapes, dtype="float32"):
    import jax

    with jax.enable_x64(True):  # as for the buckets: an f64 stays f64
        return jax.jit(function).lower(*[jax.ShapeDtypeStruct(s, dtype) for s in shapes]).as_text()


def test_contents_check_finds_float64_callbacks_custom_calls_and_limit_breaches():
    import jax
    import jax.numpy as jnp
    import numpy as np

    clean = analyse(_module(lambda x: jnp.take(x, jnp.array([2, 0]), axis=0, mode="clip").sum(0)
                            + (x ** 2).sum(0), (4, 3)))
    assert clean.problems() == [] and clean.op_counts["stablehlo.gather"] == 1

    f64 = analyse(_module(lambda x: x.astype(jnp.float64).astype(jnp.float32), (4,)))
    assert len(f64.float64) == 2 and f64.float64_constants == 0
    assert [p.split(" (")[0] for p in f64.problems()] == ["float64 computed from run-time values"]
    folded = analyse(_module(lambda x: x * (jnp.float64(0.5) * 3).astype(jnp.float32), (4,)))
    assert folded.float64 == [] and folded.float64_constants >= 1 and folded.problems() == []

    empty = analyse("    %0 = tensor.empty() : tensor<4xf32>\n")
    assert empty.problems() == ["tensor.empty: not StableHLO, which XLA does not import"]
    sized = analyse("  func.func @main(%arg0: tensor<?x4xf32>) -> tensor<?x4xf32> {\n")
    assert [p.split(" (")[0] for p in sized.problems()] == ["run-time tensor sizes"]

    callback = analyse(_module(lambda x: jax.pure_callback(np.sin, jax.ShapeDtypeStruct((4,), "float32"), x), (4,)))
    assert callback.host_ops and any("host transfer" in p for p in callback.problems())

    kernel = analyse(_module(lambda x: jax.ffi.ffi_call("AwsNeuronCustomNativeKernel",
                                                         jax.ShapeDtypeStruct((4,), "float32"))(x), (4,)))
    assert kernel.custom_calls == ["AwsNeuronCustomNativeKernel"]
    assert kernel.problems(collections.Counter({"AwsNeuronCustomNativeKernel": 1})) == []
    assert kernel.problems() != []

    def breaches(x, i):
        window = jax.lax.dynamic_update_slice(x, jnp.ones((1, 3), x.dtype), (i[0].astype(jnp.int32), jnp.int32(0)))  # traced index
        rows = jax.lax.gather(x, i.astype(jnp.int32).reshape(1, 1),
                              jax.lax.GatherDimensionNumbers(offset_dims=(0, 1), collapsed_slice_dims=(),
                                                             start_index_map=(0,)), slice_sizes=(2, 3))
        return window.sum() + rows.sum() + jnp.argmax(x[0]) + (x ** x).sum()

    found = collections.Counter(v.op for v in analyse(_module(breaches, (4, 3), (1,))).limit_violations)
    assert found["dynamic_update_slice"] == 1 and found["gather"] == 1 and found["power"] == 1
    assert found["reduce"] >= 1  # argmax: a two-value reduction (compare and select)

    rope = analyse(_module(lambda p: p * 10000.0 ** (jnp.arange(4, dtype=jnp.float32) / 8), (4,)))
    assert [(v.op, v.foldable) for v in rope.limit_violations] == [("power", True)]
    assert rope.problems() == [] or rope.problems(accept=lambda v: v.foldable) == []


class _SmallStep(torch.nn.Module):
    """A matmul, SiLU, a cumulative sum, a softmax, a Python float scalar, a tensor constant built
    while tracing (an index table) and an in-place state update."""

    def forward(self, x, state):
        y = torch.nn.functional.silu(x @ x.T) * 0.125
        state.add_(y.sum(0))
        order = torch.tensor([3, 1, 2, 0, 7, 5, 6, 4])
        return y.cumsum(0).softmax(-1).index_select(1, order)


@pytest.mark.slow
def test_torch_mlir_lowers_a_small_step_with_folded_f64_constants_equal_to_eager():
    backend = XlaLoweringBackend("torch_mlir")
    step = torch.compile(_SmallStep(), backend=backend, fullgraph=True)
    x, state = torch.randn(8, 8), torch.zeros(8)
    want_state = torch.nn.functional.silu(x @ x.T).mul(0.125).sum(0)
    got = step(x, state)
    torch.testing.assert_close(got, _SmallStep()(x, torch.zeros(8)), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state, want_state, rtol=1e-5, atol=1e-6)
    (bucket,) = backend.buckets
    assert bucket.contents.float64 == [] and bucket.contents.float64_constants >= 1  # the 0.125
    assert bucket.max_logits_diff <= TOLERANCE and bucket.contents.op_counts["stablehlo.dot_general"] == 1
    with pytest.raises(ValueError, match="importer must be one of"):
        XlaLoweringBackend("torch-xla")
