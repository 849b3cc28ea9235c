"""A second compiler for the harness: each bucket graph lowered to StableHLO and run on XLA's CPU backend.

vllm-neuron lowers every bucket's FX graph to XLA HLO for neuronx-cc. ``aot_eager`` runs the
ATen graph with torch itself, so an op XLA cannot express (a custom op, a CPU kernel reached
through dispatch, a float64 intermediate, an ATen op without an XLA lowering) passes it and
only fails on a device. :class:`XlaLoweringBackend` is a ``torch.compile`` backend for
``NeuronRunnerStandIn(backend=...)``
(``tests/neuron/runner.py``), called as the runner's ``torch.compile(..., options=...)`` calls it:

1. aot_autograd with core-ATen decompositions makes each Dynamo graph functional (cache
   writes become outputs, which aot_autograd's wrapper copies back into the bound pages;
   a cache input is the runner's whole int8 allocation, its dtype views taken in the graph);
2. every ATen node is mapped to torchax's JAX lowering under ``jax.jit``, ``.lower()`` gives
   the StableHLO module and ``.compile()`` an XLA:CPU executable (float64 enabled in JAX,
   so an f64 in the graph stays f64 in the module);
3. :func:`analyse` reads the module: op counts, custom calls, host callbacks, float64, and
   the per-op limits the Neuron documentation states (:data:`NEURON_HLO_LIMITS`);
4. each call runs the XLA executable and, on the same inputs, the ATen graph under torch
   (eager); the XLA results go back to the harness, the differences are kept per bucket.

Versions: ``torchax==0.0.13`` (installed ``--no-deps``: its requirements would pull another
torch) with ``jax==0.10.2`` beside torch 2.13.0. :func:`torchax_environment` applies the
shims this combination needs.

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
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._guards import TracingContext
from torch._subclasses.fake_tensor import unset_fake_temporarily

from vllm_gdn_neuron.neuron.contract import reserved_pages

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

# Ops that reach the host from inside an XLA computation.
_HOST_OPS = ("stablehlo.send", "stablehlo.recv", "stablehlo.infeed", "stablehlo.outfeed")
_OP = re.compile(r"(?<![#\w])((?:stablehlo|chlo)\.[a-z_]+)")  # not attributes (#stablehlo.gather<...>)
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
    """``index_select``, ``embedding`` as one plain gather, ``topk`` as one ``top_k``, and
    ``view.dtype`` as a bitcast.

    torchax lowers the first two with ``jnp.take``'s default out-of-bounds mode, which adds a
    bounds mask (an ``and`` reduction and a select) around every gather; torch refuses such
    indices eagerly, and ``clip`` is XLA's own gather semantics (start indices clamped). Its
    ``topk`` sorts ``top_k``'s already sorted values again and reorders the indices with a
    bounds-checked ``take_along_axis``. These helpers are the lowering's, not the model's:
    the module should show what the model asks for.
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
        float64: whether any value is f64.
        limit_violations: one :class:`LimitViolation` per op outside :data:`NEURON_HLO_LIMITS`.
    """

    op_counts: collections.Counter
    custom_calls: list[str]
    host_ops: list[str]
    float64: bool
    limit_violations: list[LimitViolation]

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
            found.append("float64 values in the module")
        found += [f"host transfer: {op}" for op in self.host_ops]
        calls, allowed = collections.Counter(self.custom_calls), custom_calls or collections.Counter()
        if calls != allowed:
            found.append(f"custom calls {dict(calls)}; allowed {dict(allowed)}")
        found += [f"{v.op} outside the Neuron limit ({v.limit}) in @{v.function}: {v.line[:200]}"
                  for v in self.limit_violations if not accept(v)]
        return found


def analyse(text: str) -> GraphContents:
    """Read a StableHLO module's text (``Lowered.as_text()``)."""
    lines = text.splitlines()
    counts = collections.Counter(m for line in lines for m in _OP.findall(line.split("//")[0]))
    calls = [a or b for line in lines for a, b in _CUSTOM_CALL.findall(line)]
    host = [op for op in _HOST_OPS for line in lines if re.search(rf"\b{re.escape(op)}\b", line)]
    host += [target for target in calls if "callback" in target.lower()]
    return GraphContents(op_counts=counts, custom_calls=calls, host_ops=host,
                         float64=re.search(r"(?:\dx|<|\s|\()f64\b", text) is not None,
                         limit_violations=_limit_violations(lines))


_CONSTANT = re.compile(r"\s*(%[\w#]+)\s*=\s*stablehlo\.constant\s+dense<([^>]*)>")
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
        if op in ("stablehlo.constant", "stablehlo.iota") or (
                op.startswith("stablehlo.") and operands and all(o in folded for o in operands)):
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


_VIEW_OPS = (torch.ops.aten.alias.default, torch.ops.aten.view.dtype)


def cache_layouts(gm: torch.fx.GraphModule, mutated: list[int]) -> list[CacheLayout | None]:
    """One :class:`CacheLayout` per mutated input of an ATen graph (None: not an int8 allocation).

    Pages: the first dimension of the first multi-dimensional view of the input reached
    through dtype views and aliases. Dtypes: every ``view.dtype`` of an int8 tensor of the
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
                           and source.dtype is torch.int8 and tuple(source.shape) == tuple(value.shape))
        layouts.append(CacheLayout(_pages(placeholders[index]), dtypes))
    return layouts


def _pages(node: torch.fx.Node) -> int:
    frontier = [node]
    while frontier:
        current = frontier.pop(0)
        for user in current.users:
            if user.target in _VIEW_OPS:
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
        compare: also run each ATen graph under torch on the same inputs and keep the
            differences (fp32); False for a smoke run (bf16).
        custom_calls: custom-call targets allowed in every bucket, with their counts.
        accept: limit violations accounted for (:func:`accept_foldable_power` by default).

    Raises (when a bucket compiles):
        LoweringRefused: the module has a problem (listed), before XLA compiles it.

    Attributes (the harness reads ``dynamo_graphs`` and ``aten_graphs`` like its recorder's):
        dynamo_graphs, aten_graphs: the graphs compiled, in order.
        buckets: one :class:`BucketLowering` per ATen graph.
    """

    def __init__(self, compare: bool = True, custom_calls=None, accept=accept_foldable_power) -> None:
        self.compare, self.custom_calls, self.accept = compare, custom_calls, accept
        self.dynamo_graphs, self.aten_graphs, self.buckets = [], [], []
        self._aot = aot_autograd(fw_compiler=self._compile, decompositions=core_aten_decompositions())

    def __call__(self, gm, example_inputs, options=None):
        """``options``: the runner's ``torch.compile(options=...)`` (Neuron's; nothing here reads them)."""
        self.dynamo_graphs.append(gm)
        return self._aot(gm, example_inputs)

    def _compile(self, gm, example_inputs):
        self.aten_graphs.append(gm)
        layouts = cache_layouts(gm, TracingContext.get().fw_metadata.mutated_inp_runtime_indices)
        with unset_fake_temporarily():
            start = time.perf_counter()
            lowered = _lower(gm, example_inputs)
            lowered_at = time.perf_counter()
            contents = analyse(lowered.as_text())
            problems = contents.problems(self.custom_calls, self.accept)
            if problems:
                raise LoweringRefused(f"bucket {len(self.buckets)}: " + "; ".join(problems))
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
