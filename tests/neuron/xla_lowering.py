"""A second compiler for the harness: each bucket graph lowered to StableHLO and run on XLA's CPU backend.

vllm-neuron hands every bucket's FX graph to a compiler front end that ends in neuronx-cc.
``aot_eager`` runs the ATen graph with torch itself, so an op the front end cannot express (a
custom op, a CPU kernel reached through dispatch, a float64 intermediate, an ATen op without a
lowering) passes it and only fails on a device. :class:`XlaLoweringBackend` is a
``torch.compile`` backend for ``NeuronRunnerStandIn(backend=...)`` (``tests/neuron/runner.py``),
called as the runner's ``torch.compile(..., options=...)`` calls it, with one of two importers:

- ``"torch_mlir"``, the native route's (TorchNeuron: Dynamo, AOTAutograd with the Neuron
  decompositions, torch-mlir's FX importer, StableHLO for neuronx-cc): aot_autograd with
  :func:`neuron_decompositions`, then ``torch_mlir.fx.stateless_fx_import`` through
  torch-mlir's StableHLO pipeline; the module's text is compiled by XLA:CPU.
- ``"torchax"``, a proxy of the deprecated PyTorch/XLA route (ATen lowered to HLO op by op):
  aot_autograd with core-ATen decompositions, every ATen node mapped to torchax's JAX
  lowering under ``jax.jit`` (float64 enabled in JAX, so an f64 in the graph stays f64).

Either way:

1. aot_autograd makes each Dynamo graph functional (cache writes become outputs, which
   aot_autograd's wrapper copies back into the bound pages; a cache input is the runner's
   whole int8 allocation, its dtype views taken in the graph);
2. :func:`analyse` reads the StableHLO module: op counts, custom calls, host callbacks,
   float64 on run-time values (folded constants counted apart), dynamic shapes, and the
   per-op limits the Neuron documentation states (:data:`NEURON_HLO_LIMITS`);
3. each call runs the XLA executable and, on the same inputs, the ATen graph under torch
   (eager); the XLA results go back to the harness, the differences are kept per bucket.

Versions: ``torch-mlir==20261001``; ``torchax==0.0.13`` (installed ``--no-deps``: its
requirements would pull another torch) with ``jax==0.10.2`` beside torch 2.13.0.
:func:`torchax_environment` applies the shims this combination needs.

Dimensions:
    P: pages of a bound cache (its two reserved pages last; the sink is the last one).
    N: bytes of one int8 cache allocation (``P`` pages).
"""

import collections
import dataclasses
import functools
import re
import time

import torch
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._guards import TracingContext
from torch._subclasses.fake_tensor import unset_fake_temporarily

from vllm_gdn_neuron.shells.neuron.contract import reserved_pages

# Per-op limits stated by the Neuron documentation: "TensorFlow Neuron (tensorflow-neuron
# (TF1.x)) Supported operators [XLA]" (release-notes/archive/neuron-cc/neuron-cc-ops/
# neuron-cc-ops-xla, Neuron SDK docs v2.28.1; the same table on "latest"). It is the
# neuron-cc (Inf1) table, the only page of the Neuron docs found that states per-op HLO
# limits; neuronx-cc (trn2) publishes its operator list through `neuronx-cc list-operators`,
# which needs the SDK.
NEURON_HLO_LIMITS = {
    "dynamic_update_slice": "constant start indices only",
    "gather": "start_index_map disjoint from the remapped offset dims",
    "reduce": "Min, Max, Add and Mul computations only; constant init values",
    "power": "exponent a compile-time integer constant",
}

# The NKI kernel boundary: torch-neuronx's custom-call target for an NKI kernel in the HLO
# (neuronx-cc refuses other unknown targets: error NCC_EHCA005, Neuron SDK docs v2.31.0,
# compiler/error-codes). UNVERIFIED target name: read from documentation, not a device.
NKI_CUSTOM_CALL = "AwsNeuronCustomNativeKernel"

IMPORTERS = ("torch_mlir", "torchax")

# TorchNeuron's compile-time decomposition table (torch_neuronx/neuron_dynamo_backend/
# decompositions.py, get_compile_decomposition_table, read at parmoham-aws/test-repo-parmoham
# @98154b86, a public copy of the torch-neuronx sources). It takes torch's own decompositions
# of NEURON_DECOMPOSED_OPS, and decomposes NEURON_OWN_DECOMPOSED_OPS with functions of its own,
# which import neuronxcc: for those, torch's decomposition where torch has one (index_copy,
# linalg_vector_norm, ...), else the op is left to torch-mlir. The rest of the graph is
# torch-mlir's to lower.
NEURON_DECOMPOSED_OPS = (
    "logsumexp", "squeeze.dims", "binary_cross_entropy", "native_batch_norm_backward", "nansum", "addr",
    "_unsafe_index", "_unsafe_index_put", "split", "split_with_sizes", "unbind", "replication_pad1d",
    "replication_pad2d", "replication_pad3d", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
    "embedding", "native_layer_norm_backward", "nll_loss_backward", "clamp_min", "clamp_max", "linear_backward",
    "_fused_rms_norm", "_fused_rms_norm_backward", "fill.Scalar", "fill.Tensor", "index_add",
    "native_dropout_backward", "gelu_backward", "threshold_backward", "_log_softmax_backward_data",
    "_softmax_backward_data", "select_backward", "slice_backward", "softplus_backward", "index_select_backward",
    "col2im", "lerp", "elu", "elu_backward", "silu",
)
NEURON_OWN_DECOMPOSED_OPS = (
    "as_strided.default", "topk.default", "_scaled_dot_product_fused_attention_overrideable.default",
    "_scaled_dot_product_fused_attention_overrideable_backward.default", "scalar_tensor.default",
    "index_copy.default", "nonzero_static.default", "linalg_vector_norm.default", "index_put.default",
    "sigmoid_backward.default", "silu_backward.default", "embedding_dense_backward.default", "linear_backward",
    "_foreach_pow.Scalar", "__rshift__.Scalar", "as_strided_scatter.default", "_grouped_mm.default",
    "convolution_backward", "value_selecting_reduction_backward.default", "histc.default", "argsort.default",
    "argsort.stable",
)


def neuron_decompositions() -> dict:
    """torch's decompositions of :data:`NEURON_DECOMPOSED_OPS` and :data:`NEURON_OWN_DECOMPOSED_OPS`
    (an op this torch lacks, or has no decomposition of, is left out)."""
    ops = []
    for name in NEURON_DECOMPOSED_OPS + NEURON_OWN_DECOMPOSED_OPS:
        packet, _, overload = name.partition(".")
        op = getattr(torch.ops.aten, packet, None)
        if op is not None and overload:
            op = getattr(op, overload, None)
        if op is not None:
            ops.append(op)
    return get_decompositions(ops)


# Ops that reach the host from inside an XLA computation.
_HOST_OPS = ("stablehlo.send", "stablehlo.recv", "stablehlo.infeed", "stablehlo.outfeed")
_OP = re.compile(r"(?<![#\w])((?:stablehlo|chlo|arith|tensor)\.[a-z_]+)")  # not attributes (#stablehlo.gather<...>)
_CUSTOM_CALL = re.compile(r"stablehlo\.custom_call\s+@([\w.$-]+)|call_target_name\s*=\s*\"([^\"]+)\"")


@functools.cache
def torchax_environment():
    """``(torchax, its environment, jax)``, imported with the shims torch 2.13 needs.

    - torchax names Dimname overloads torch 2.13 removed (``aten.prod.dim_Dimname``, ...)
      while importing and building its op tables: during that, a missing overload resolves
      to a placeholder no graph node can match (recorded in ``MISSING_OVERLOADS``).
    - torchax registers a "jax" device module that reports itself available; Dynamo then
      treats it as an accelerator and fails: it reports unavailable here.
    - float64 enabled in JAX (else JAX silently narrows an f64 the check must see).

    For the rest of the process, importing torchax also renames torch's PrivateUse1 backend
    to "jax" and turns off ``nn.MultiheadAttention``'s fast path; nothing here uses either.
    """
    import torch._ops as torch_ops

    original = torch_ops.OpOverloadPacket.__getattr__

    def lenient(packet, key):
        try:
            return original(packet, key)
        except AttributeError:
            if key.startswith("__"):
                raise
            name = f"{packet}.{key}"
            MISSING_OVERLOADS.append(name)
            return _MissingOverload(name)

    torch_ops.OpOverloadPacket.__getattr__ = lenient
    try:
        import torchax
        import torchax.device_module

        environment = torchax.default_env()
    finally:
        torch_ops.OpOverloadPacket.__getattr__ = original
    torchax.device_module.is_available = lambda: False
    import jax

    jax.config.update("jax_enable_x64", True)
    _plain_lowerings(environment)
    return torchax, environment, jax


def _plain_lowerings(environment) -> None:
    """``index_select``, ``embedding`` as one plain gather, ``topk`` as one ``top_k``,
    ``view.dtype`` as a bitcast, and a truncating division of integers as an integer division.

    torchax lowers the first two with ``jnp.take``'s default out-of-bounds mode, which adds a
    bounds mask (an ``and`` reduction and a select) around every gather; torch refuses such
    indices eagerly, and ``clip`` is XLA's own gather semantics (start indices clamped). Its
    ``topk`` sorts ``top_k``'s already sorted values again and reorders the indices with a
    bounds-checked ``take_along_axis``. It divides integers with ``rounding_mode="trunc"`` in
    float64 and truncates. These helpers are the lowering's, not the model's: the module should
    show what the model asks for.
    """
    import jax
    import jax.numpy as jnp
    from torchax.ops import ops_registry

    def topk(x, k, dim=-1, largest=True, sorted=True):
        dim = dim % x.ndim
        x = jnp.moveaxis(x if largest else -x, dim, -1)
        values, indices = jax.lax.top_k(x, k)  # sorted, largest first
        values = values if largest else -values
        return jnp.moveaxis(values, -1, dim), jnp.moveaxis(indices.astype(jnp.int64), -1, dim)

    def index_select(x, dim, index):
        return jnp.take(x, index, axis=dim, mode="clip")

    def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
        return jnp.take(weight, indices, axis=0, mode="clip")

    from torchax.ops.mappings import t2j_dtype

    def view_dtype(x, dtype):
        target = jnp.dtype(t2j_dtype(dtype))
        ratio_up, ratio_down = target.itemsize // x.dtype.itemsize, x.dtype.itemsize // target.itemsize
        if ratio_up > 1:  # [..., n] narrow -> [..., n / ratio] wide
            return jax.lax.bitcast_convert_type(x.reshape(*x.shape[:-1], x.shape[-1] // ratio_up, ratio_up), target)
        converted = jax.lax.bitcast_convert_type(x, target)  # [..., n] wide -> [..., n, ratio] narrow
        return converted.reshape(*x.shape[:-1], x.shape[-1] * ratio_down) if ratio_down > 1 else converted

    def searchsorted(sorted_sequence, values, *, out_int32=False, right=False, side=None, sorter=None):
        if sorted_sequence.ndim != 1 or sorter is not None:  # torchax's own lacks right= (the routed experts use it)
            raise NotImplementedError("searchsorted: only a 1-D sorted_sequence without sorter is lowered here")
        found = jnp.searchsorted(sorted_sequence, values, side=side or ("right" if right else "left"),
                                 method="compare_all")  # comparisons and a sum: no loop of gathers
        return found.astype(jnp.int32 if out_int32 else jnp.int64)

    aten = torch.ops.aten
    torchax_div = environment._ops[aten.div].func

    def div(x, y, rounding_mode=""):
        integers = [jnp.issubdtype(jnp.result_type(v), jnp.integer) for v in (x, y)]
        if rounding_mode != "trunc" or not all(integers):
            return torchax_div(x, y, rounding_mode=rounding_mode)
        x, y = jnp.broadcast_arrays(jnp.asarray(x, jnp.int64), jnp.asarray(y, jnp.int64))
        return jax.lax.div(x, y)  # integer division rounds toward zero

    environment._ops[aten.div] = ops_registry.Operator(aten.div, div, is_jax_function=True, is_user_defined=True,
                                                       needs_env=False, is_view_op=False)
    environment._ops[aten.searchsorted.Tensor] = ops_registry.Operator(
        aten.searchsorted.Tensor, searchsorted, is_jax_function=True, is_user_defined=True, needs_env=False,
        is_view_op=False)
    environment._ops[aten.view.dtype] = ops_registry.Operator(aten.view.dtype, view_dtype, is_jax_function=True,
                                                              is_user_defined=True, needs_env=False, is_view_op=False)
    for packet, function in ((aten.index_select, index_select), (aten.embedding, embedding), (aten.topk, topk)):
        for op in (packet, packet.default):
            environment._ops[op] = ops_registry.Operator(op, function, is_jax_function=True, is_user_defined=True,
                                                         needs_env=False, is_view_op=False)


MISSING_OVERLOADS: list[str] = []


class _MissingOverload:
    """Stands for an ATen overload this torch no longer has (never equal to a real one)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<missing {self.name}>"


# --- tensors across the boundary --------------------------------------------------------------

def _to_jax(tensor: torch.Tensor):
    """A CPU tensor as a JAX array on XLA:CPU, sharing its memory (DLPack; bfloat16 included)."""
    import jax.dlpack

    return jax.dlpack.from_dlpack(tensor.detach().contiguous())


def _to_torch(array) -> torch.Tensor:
    return torch.from_dlpack(array)


# --- graph contents ---------------------------------------------------------------------------

@dataclasses.dataclass
class LimitViolation:
    """One op of a module outside a limit of :data:`NEURON_HLO_LIMITS`.

    Attributes:
        op: the limit's op (``gather``, ``reduce``, ...).
        line: the op's line in the module.
        function: the module function holding it (``main``, or a helper the lowering made).
        foldable: the offending operand is computed from constants and iotas only (a
            compiler that folds constants first removes the op).
    """

    op: str
    line: str
    function: str
    foldable: bool = False

    @property
    def limit(self) -> str:
        return NEURON_HLO_LIMITS[self.op]


@dataclasses.dataclass
class GraphContents:
    """What one lowered StableHLO module holds.

    Attributes:
        op_counts: op name (``stablehlo.gather``, ``chlo.top_k``, ...) -> occurrences.
        custom_calls: custom-call targets, one entry per call.
        host_ops: send / recv / infeed / outfeed ops and host-callback custom calls.
        float64: the lines computing an f64 from run-time values (arguments, or anything
            computed from one).
        float64_constants: f64 values computed from constants only (torch-mlir writes a Python
            float scalar as an f64 constant and a convert; a compiler folds them).
        dynamic_shapes: the lines holding a tensor of a size known only at run time.
        limit_violations: one :class:`LimitViolation` per op outside :data:`NEURON_HLO_LIMITS`.
    """

    op_counts: collections.Counter
    custom_calls: list[str]
    host_ops: list[str]
    float64: list[str]
    limit_violations: list[LimitViolation]
    float64_constants: int = 0
    dynamic_shapes: list[str] = dataclasses.field(default_factory=list)

    @property
    def total_ops(self) -> int:
        return sum(self.op_counts.values())

    def problems(self, custom_calls: collections.Counter | None = None, accept=lambda violation: False) -> list[str]:
        """What keeps this module off a Neuron device, one line each (empty: nothing found).

        Args:
            custom_calls: the custom-call targets allowed, with how many calls of each
                (the NKI kernel boundary when the nki backend is selected); default none.
            accept: ``accept(violation)`` for a limit violation the caller has accounted for.
        """
        found = []
        if self.float64:
            found.append(f"float64 computed from run-time values ({len(self.float64)} lines): {self.float64[0][:200]}")
        if self.dynamic_shapes:
            found.append(f"run-time tensor sizes ({len(self.dynamic_shapes)} lines): {self.dynamic_shapes[0][:200]}")
        found += [f"host transfer: {op}" for op in self.host_ops]
        found += [f"{op}: not StableHLO, which XLA does not import" for op in self.op_counts if op.startswith("tensor.")]
        calls, allowed = collections.Counter(self.custom_calls), custom_calls or collections.Counter()
        if calls != allowed:
            found.append(f"custom calls {dict(calls)}; allowed {dict(allowed)}")
        found += [f"{v.op} outside the Neuron limit ({v.limit}) in @{v.function}: {v.line[:200]}"
                  for v in self.limit_violations if not accept(v)]
        return found


def analyse(text: str) -> GraphContents:
    """Read a StableHLO module's text (``Lowered.as_text()``, or torch-mlir's module printed)."""
    lines = text.splitlines()
    counts = collections.Counter(m for line in lines for m in _OP.findall(line.split("//")[0]))
    calls = [a or b for line in lines for a, b in _CUSTOM_CALL.findall(line)]
    host = [op for op in _HOST_OPS for line in lines if re.search(rf"\b{re.escape(op)}\b", line)]
    host += [target for target in calls if "callback" in target.lower()]
    runtime, constants = _float64_lines(lines)
    dynamic = [line.strip() for line in lines if _DYNAMIC.search(line.split("//")[0])]
    return GraphContents(op_counts=counts, custom_calls=calls, host_ops=host, float64=runtime,
                         float64_constants=constants, dynamic_shapes=dynamic,
                         limit_violations=_limit_violations(lines))


_F64 = re.compile(r"(?:\dx|<|\s|\()f64\b")
_DYNAMIC = re.compile(r"tensor<(?:[\d?]+x)*\?")


def _float64_lines(lines) -> tuple[list[str], int]:
    """``(lines computing an f64 from run-time values, f64 values computed from constants only)``."""
    folded, runtime, constants = _foldable(lines), [], 0
    for line in lines:
        body = line.split("//")[0]
        if not _F64.search(body):
            continue
        match = _DEFINITION.match(body)
        if match and match.group(1) in folded:
            constants += 1
        else:
            runtime.append(body.strip())
    return runtime, constants


_CONSTANT = re.compile(r"\s*(%[\w#]+)\s*=\s*(?:stablehlo|arith)\.constant\s+dense<([^>]*)>")
_SAME_VALUE = re.compile(r"\s*(%[\w#]+)\s*=\s*stablehlo\.(?:broadcast_in_dim|convert|reshape)\s+(%[\w#]+)")


def _constants(lines) -> dict[str, str]:
    """SSA value -> its literal, for constants and for broadcasts, converts and reshapes of them."""
    literals = {}
    for line in lines:
        if match := _CONSTANT.match(line):
            literals[match.group(1)] = match.group(2)
        elif (match := _SAME_VALUE.match(line)) and match.group(2) in literals:
            literals[match.group(1)] = literals[match.group(2)]
    return literals


def _is_integer_literal(literal: str) -> bool:
    try:
        value = float(literal)
    except ValueError:  # not a splat: a constant array
        return False
    return value.is_integer()


def _operands(body: str, op: str) -> list[str]:
    return re.findall(r"%[\w#]+", body.split(op, 1)[1].split(":")[0])


_DEFINITION = re.compile(r"\s*(%[\w#]+)\s*=\s*(\"?[\w.]+\"?)(.*)")


def _foldable(lines) -> set[str]:
    """SSA values computed from constants and iotas only (no argument, no call): a compiler can
    fold them to constants."""
    folded = set()
    for line in lines:
        match = _DEFINITION.match(line.split("//")[0])
        if not match:
            continue
        name, op, rest = match.groups()
        op = op.strip('"')
        operands = re.findall(r"%[\w#]+", rest.split(":")[0])
        if op in ("stablehlo.constant", "arith.constant", "stablehlo.iota") or (
                op.startswith(("stablehlo.", "arith.")) and operands and all(o in folded for o in operands)):
            folded.add(name)
    return folded


def _limit_violations(lines) -> list["LimitViolation"]:
    constants, folded = _constants(lines), _foldable(lines)
    found, function = [], "main"
    for number, line in enumerate(lines):
        body = line.split("//")[0].strip()
        if header := re.match(r"func\.func\s+(?:public\s+|private\s+)?@([\w$.]+)", body):
            function = header.group(1)
        if "stablehlo.dynamic_update_slice" in body:
            if any(index not in constants for index in _operands(body, "stablehlo.dynamic_update_slice")[2:]):
                found.append(LimitViolation("dynamic_update_slice", body, function))
        elif "stablehlo.gather" in body:
            if not _gather_is_disjoint(body):
                found.append(LimitViolation("gather", body, function))
        elif re.search(r"=\s*stablehlo\.reduce\(", body):
            if not _reduce_is_supported(body, lines[number + 1:number + 12], constants):
                found.append(LimitViolation("reduce", body, function))
        elif re.search(r"=\s*stablehlo\.power\b", body):
            exponent = _operands(body, "stablehlo.power")[1:2]
            if not exponent or not _is_integer_literal(constants.get(exponent[0], "")):
                found.append(LimitViolation("power", body, function, foldable=bool(exponent) and exponent[0] in folded))
    return found


def _dims(body: str, field: str) -> set[int]:
    match = re.search(rf"\b{field}\s*=\s*\[([\d,\s]*)\]", body)
    return {int(d) for d in match.group(1).split(",") if d.strip()} if match else set()


def _gather_is_disjoint(body: str) -> bool:
    """Every operand dimension the indices address is collapsed (or a batching dimension), so
    none of them is also an offset dimension of the result."""
    start = _dims(body, "start_index_map")
    return start <= _dims(body, "collapsed_slice_dims") | _dims(body, "operand_batching_dims")


_REDUCERS = ("stablehlo.add", "stablehlo.maximum", "stablehlo.minimum", "stablehlo.multiply")


def _reduce_is_supported(body: str, following: list[str], constants: dict[str, str]) -> bool:
    """A one-op ``applies`` form with an allowed computation and constant init values."""
    inits = re.findall(r"init:\s*(%[\w#]+)", body)
    if not inits or any(init not in constants for init in inits):
        return False
    applies = re.search(r"applies\s+(stablehlo\.[a-z_]+)", body)
    if applies:
        return applies.group(1) in _REDUCERS
    region = []  # region form: the ops before the region's return
    for line in following:
        if "stablehlo.return" in line:
            break
        region += _OP.findall(line)
    return len(region) == 1 and region[0] in _REDUCERS


# --- the backend ------------------------------------------------------------------------------

@dataclasses.dataclass
class BucketLowering:
    """One bucket graph: its module's contents and how the XLA results compared with eager.

    Attributes:
        index: compile order (the harness warms prefill buckets up first, then decode).
        contents: :class:`GraphContents` of the StableHLO module.
        lower_seconds, compile_seconds: time to lower to StableHLO and to compile on XLA:CPU.
        calls: steps served.
        max_logits_diff, max_cache_diff: the largest ``max |xla - eager| / max |eager|`` over
            the steps, for the logits and for the written caches (every page but the sink).
        nan_mismatches: steps where XLA and eager had NaNs in different places.
    """

    index: int
    contents: GraphContents
    lower_seconds: float
    compile_seconds: float
    calls: int = 0
    max_logits_diff: float = 0.0
    max_cache_diff: float = 0.0
    nan_mismatches: int = 0


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> tuple[float, bool]:
    """``(max |got - want| / max |want| over finite entries, whether the NaN positions agree)``."""
    got, want = got.double(), want.double()
    nan_agree = bool(torch.equal(torch.isnan(got), torch.isnan(want)))
    finite = torch.isfinite(want) & torch.isfinite(got)
    if not finite.any():
        return 0.0, nan_agree
    scale = want[finite].abs().max().clamp_min(torch.finfo(torch.float32).tiny)
    return float((got[finite] - want[finite]).abs().max() / scale), nan_agree


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """How one int8 cache allocation (a graph input the step writes) holds its values.

    Attributes:
        pages: ``P``, from the page-major view the graph takes of it.
        dtypes: every dtype the graph views an allocation of this size as (one for an
            fp32 model: K/V and states float32; two for bf16 K/V beside float32 states).
    """

    pages: int
    dtypes: frozenset

    def pages_of(self, buffer: torch.Tensor) -> torch.Tensor:
        """``[N]`` int8 -> ``[P, N / P / itemsize]`` of the one dtype every page holds.

        Raises:
            ValueError: the allocation is viewed in more than one dtype (a page's dtype then
                depends on which cache group owns its block; compare such runs with ``compare=False``).
        """
        if len(self.dtypes) != 1:
            raise ValueError(f"cache allocation viewed as {sorted(map(str, self.dtypes))}: its pages have no "
                             "one dtype to compare in")
        (dtype,) = self.dtypes
        return buffer.view(dtype).view(self.pages, -1)


_VIEW_OPS = (torch.ops.aten.alias.default, torch.ops.aten.detach.default, torch.ops.aten.view.dtype)


def cache_layouts(gm: torch.fx.GraphModule, mutated: list[int]) -> list[CacheLayout | None]:
    """One :class:`CacheLayout` per mutated input of an ATen graph (None: not an int8 allocation).

    Pages: the first dimension of the first multi-dimensional view of a wider dtype reached from
    the input through aliases, dtype views and views of int8 (the ``[N / itemsize, itemsize]``
    view a dtype view is taken of). Dtypes: every ``view.dtype`` of an int8 tensor of the
    input's size anywhere in the graph (after functionalisation a later view is taken of the
    updated buffer, not of the input itself).
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    views = [n for n in gm.graph.nodes if n.target is torch.ops.aten.view.dtype]
    layouts = []
    for index in mutated:
        value = placeholders[index].meta.get("val")
        if value is None or value.dtype is not torch.int8 or value.dim() != 1:
            layouts.append(None)
            continue
        dtypes = frozenset(n.args[1] for n in views
                           if (source := n.args[0].meta.get("val")) is not None
                           and source.dtype is torch.int8 and source.numel() == value.numel())
        layouts.append(CacheLayout(_pages(placeholders[index]), dtypes))
    return layouts


def _pages(node: torch.fx.Node) -> int:
    frontier = [node]
    while frontier:
        current = frontier.pop(0)
        for user in current.users:
            if user.target in _VIEW_OPS or (user.target is torch.ops.aten.view.default
                                            and user.meta["val"].dtype is torch.int8):
                frontier.append(user)
            elif user.target is torch.ops.aten.view.default and len(user.args[1]) > 1:
                return int(user.args[1][0])
    raise ValueError(f"{node.name}: no page-major view of the cache allocation in the graph")


class LoweringRefused(AssertionError):
    """A bucket's StableHLO module holds something a Neuron device cannot run (:meth:`GraphContents.problems`)."""


def accept_foldable_power(violation: LimitViolation) -> bool:
    """The one known finding: ``theta ** (iota / d)`` of RoPE's inverse frequencies (computed in
    the forward by design, from constants only); every other violation is refused."""
    return violation.op == "power" and violation.foldable


class XlaLoweringBackend:
    """A ``torch.compile`` backend: every bucket lowered to StableHLO, checked, compiled and run on XLA:CPU.

    Args:
        importer: ``"torch_mlir"`` (the native route's: :func:`neuron_decompositions`, torch-mlir's
            FX importer and StableHLO pipeline) or ``"torchax"`` (core-ATen decompositions,
            torchax's JAX lowering: a proxy of the deprecated HLO route).
        compare: also run each ATen graph under torch on the same inputs and keep the
            differences (fp32); False for a smoke run (bf16).
        custom_calls: custom-call targets allowed in every bucket, with their counts.
        accept: limit violations accounted for (:func:`accept_foldable_power` by default).

    Raises:
        ValueError: an unknown ``importer``.
        LoweringRefused (when a bucket compiles): the importer cannot lower an op of the
            graph, or the module has a problem (listed), before XLA compiles it.

    Attributes (the harness reads ``dynamo_graphs`` and ``aten_graphs`` like its recorder's):
        dynamo_graphs, aten_graphs: the graphs compiled, in order.
        buckets: one :class:`BucketLowering` per ATen graph.
    """

    def __init__(self, importer: str = "torch_mlir", compare: bool = True, custom_calls=None,
                 accept=accept_foldable_power) -> None:
        if importer not in IMPORTERS:
            raise ValueError(f"importer must be one of {IMPORTERS}; got {importer!r}")
        self.importer, self.compare, self.custom_calls, self.accept = importer, compare, custom_calls, accept
        self.dynamo_graphs, self.aten_graphs, self.buckets = [], [], []
        decompositions = neuron_decompositions() if importer == "torch_mlir" else core_aten_decompositions()
        self._aot = aot_autograd(fw_compiler=self._compile, decompositions=decompositions)

    def __call__(self, gm, example_inputs, options=None):
        """``options``: the runner's ``torch.compile(options=...)`` (Neuron's; nothing here reads them)."""
        self.dynamo_graphs.append(gm)
        return self._aot(gm, example_inputs)

    def _compile(self, gm, example_inputs):
        self.aten_graphs.append(gm)
        layouts = cache_layouts(gm, TracingContext.get().fw_metadata.mutated_inp_runtime_indices)
        with unset_fake_temporarily():
            start = time.perf_counter()
            lowered = _lower_torch_mlir(gm) if self.importer == "torch_mlir" else _lower(gm, example_inputs)
            lowered_at = time.perf_counter()
            contents = analyse(lowered.as_text())
            problems = contents.problems(self.custom_calls, self.accept)
            if problems:
                raise LoweringRefused(f"bucket {len(self.buckets)} ({self.importer}): " + "; ".join(problems))
            executable = lowered.compile()
        bucket = BucketLowering(len(self.buckets), contents, lowered_at - start, time.perf_counter() - lowered_at)
        self.buckets.append(bucket)

        def run(*args):
            outputs = [_to_torch(o) for o in executable(*[_to_jax(a) for a in args])]
            bucket.calls += 1
            if self.compare:
                _compare(bucket, outputs, gm(*args), layouts)
            return outputs

        return run


def _compare(bucket: BucketLowering, outputs, eager, layouts: list[CacheLayout | None]) -> None:
    """Fold one step's differences into ``bucket``: the first ``len(layouts)`` outputs are the
    written caches (compared page by page in their dtype, without the sink page), the rest the logits."""
    for position, (got, want) in enumerate(zip(outputs, eager)):
        if position < len(layouts):
            layout = layouts[position]
            if layout is not None:
                got, want = layout.pages_of(got), layout.pages_of(want)
            if not want.is_floating_point():
                continue
            _, sink = reserved_pages(want.shape[0])
            keep = torch.arange(want.shape[0]) != sink
            diff, nan_agree = relative_difference(got[keep], want[keep])
            bucket.max_cache_diff = max(bucket.max_cache_diff, diff)
        else:
            if not want.is_floating_point():
                continue
            diff, nan_agree = relative_difference(got, want)
            bucket.max_logits_diff = max(bucket.max_logits_diff, diff)
        bucket.nan_mismatches += not nan_agree


class _TorchaxInterpreter(torch.fx.Interpreter):
    """Runs an ATen graph on torchax tensors: constants become JAX arrays, factory ops make
    tensors on torchax's device instead of the CPU."""

    def __init__(self, gm, environment, device) -> None:
        super().__init__(gm)
        self.environment, self.device = environment, device

    def get_attr(self, target, args, kwargs):
        return self.environment._move_one_value(super().get_attr(target, args, kwargs))

    def call_function(self, target, args, kwargs):
        if "device" in kwargs:
            kwargs = dict(kwargs, device=self.device)
        return target(*args, **kwargs)


def _lower(gm, example_inputs):
    """``jax.jit(<the ATen graph through torchax>).lower(<input shapes and dtypes>)``."""
    torchax, environment, jax = torchax_environment()
    from torchax.ops.mappings import t2j_dtype

    device = torch.device("jax")

    def graph(*arrays):
        with environment:
            outputs = _TorchaxInterpreter(gm, environment, device).run(*environment.j2t_iso(arrays))
            return environment.t2j_iso(tuple(outputs))

    specs = [jax.ShapeDtypeStruct(tuple(t.shape), t2j_dtype(t.dtype)) for t in example_inputs]
    return jax.jit(graph).lower(*specs)


# --- the native route's importer: torch-mlir ----------------------------------------------------

_RUN_TIME_SIZE = re.compile(r"!torch\.vtensor<\[[^\]]*\?")
_BACKEND_PIPELINE = ("builtin.module(func.func(torch-match-quantized-custom-ops), "
                     "torchdynamo-export-to-torch-backend-pipeline{ extra-library=})")
_STABLEHLO_PIPELINE = "builtin.module(torch-backend-to-stablehlo-backend-pipeline{allow-non-finites=True})"


@functools.cache
def _xla_cpu():
    """``(jax, the XLA:CPU backend)``, int64 kept (the graphs' indices and positions are int64)."""
    import jax
    import jax.extend.backend

    jax.config.update("jax_enable_x64", True)
    return jax, jax.extend.backend.get_backend("cpu")


class MlirLowered:
    """A torch-mlir StableHLO module, with ``as_text()`` and ``compile()`` as JAX's ``Lowered`` has."""

    def __init__(self, text: str) -> None:
        self.text = text

    def as_text(self) -> str:
        return self.text

    def compile(self):
        """An XLA:CPU executable: ``run(*arrays) -> [arrays]``."""
        jax, backend = _xla_cpu()
        executable = backend.compile_and_load(self.text, backend.devices()[:1],
                                              jax.extend.backend.get_compile_options(1, 1))
        return lambda *arrays: executable.execute(list(arrays))


def _lower_torch_mlir(gm) -> MlirLowered:
    """The ATen graph through torch-mlir's FX importer, its Torch backend pipeline and its StableHLO pipeline.

    Raises:
        LoweringRefused: a pipeline failed; the message names the ATen ops the module still held.
    """
    from torch_mlir import fx as mlir_fx
    from torch_mlir.compiler_utils import OutputType, TorchMlirCompilerError, run_pipeline_with_repro_report

    _xla_cpu()
    try:
        module = mlir_fx.stateless_fx_import(gm, output_type=OutputType.RAW)
    except Exception as error:  # the importer's own refusals: NotImplementedError, KeyError, ...
        raise LoweringRefused(f"torch-mlir's FX importer refused the graph: {type(error).__name__}: {error}") from error
    for pipeline, stage in ((_BACKEND_PIPELINE, "Torch backend IR"), (_STABLEHLO_PIPELINE, "StableHLO")):
        try:
            run_pipeline_with_repro_report(module, pipeline, f"ATen graph -> {stage}")
        except TorchMlirCompilerError:
            text = str(module)
            left = sorted(set(re.findall(r'(?:name = |torch\.operator\s+)"(torch\.[\w.]+)"', text)))  # ops it does not know
            left = left or sorted(set(re.findall(r"torch\.aten\.[\w.]+", text)))
            raise LoweringRefused(f"torch-mlir could not lower the graph to {stage}; ATen ops left: {left}") from None
        if stage == "Torch backend IR" and (sized := _RUN_TIME_SIZE.search(text := str(module))):
            line = text[text.rfind("\n", 0, sized.start()) + 1:].split("\n", 1)[0]
            raise LoweringRefused(f"run-time tensor sizes in the graph: {line.strip()[:300]}")
    return MlirLowered(inline_resources(str(module)))


_RESOURCES = re.compile(r"\{-#\s*dialect_resources:.*?#-\}", re.S)
_BLOB = re.compile(r"([\w.$-]+):\s*\"0x([0-9A-Fa-f]*)\"")


def inline_resources(text: str) -> str:
    """The module with every ``dense_resource<blob>`` constant written out as ``dense<"0x...">``.

    torch-mlir keeps a tensor constant of the graph (an index table built on the host while
    tracing) as a resource blob at the end of the module; XLA's importer takes dense elements
    only. A blob's hex is a 4-byte alignment, then the elements' raw bytes.
    """
    resources = _RESOURCES.search(text)
    if resources is None:
        return text
    blobs = {name: data[8:] for name, data in _BLOB.findall(resources.group(0))}
    body = text[:resources.start()] + text[resources.end():]

    def dense(match):
        name = match.group(1)
        if name not in blobs:
            raise ValueError(f"dense_resource<{name}> has no blob in the module")
        return f'dense<"0x{blobs[name]}">'

    return re.sub(r"dense_resource<([\w.$-]+)>", dense, body)
