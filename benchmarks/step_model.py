"""Pricing of one compiled engine step on a trn2 logical NeuronCore: FLOPs, HBM bytes and time per FX node.

A model, not a measurement. The rates are :class:`vllm_gdn_neuron.kernels.interp.cost.Trn2Spec`'s
(one physical NeuronCore-v3, each with its documented source) times the logical core's
:data:`LNC` = 2 physical cores (trn2's default; the shipped configs' "cores").

Per ATen node of the graph the harness compiles (shapes from the nodes' fake values):

- Matmuls (``mm``, ``addmm``, ``bmm``, ``baddbmm``): ``2 M N K`` FLOPs per batch item;
  TensorE time ``ceil(K / 128) ceil(N / 128) max(M, 64)`` array cycles (the weight tile is
  stationary, the M rows move; an instruction costs at least 64 columns), four passes for
  float32 operands.
- Views (``view``, ``slice``, ``expand``, ...): free.
- Collectives (the stand-in group's ``all_reduce`` / ``all_gather``): a ring,
  ``COLLECTIVE_LATENCY_S + 2 (tp - 1) / tp * bytes / HBM rate`` (an all-gather half the
  traffic term). The latency is an ASSUMPTION, not a published figure.
- Everything else runs on VectorE (ScalarE for transcendental functions) at its elements
  per cycle, at least ``MIN_II`` cycles per node.
- HBM: a graph input (weights, cache pages, step inputs) is read where a node consumes it:
  the rows a gather (``index_select``, ``embedding``, ``gather``, ``index``) takes (DMA: no
  engine time), else the whole tensor; a scatter into a graph input (``index_copy``, ``index_put``,
  ``scatter``) writes the scattered rows, and its result is that input again (an in-place
  write: a cache buffer several layers share is written by each in turn, in HBM). An intermediate stays on chip unless it exceeds
  :data:`SBUF_BYTES`, when it is written and read back once; except the widening of a narrow
  graph input (an FP8 weight, or the rows gathered from one, converted to the activation dtype
  before its matmul, :mod:`vllm_gdn_neuron.shells.neuron.fp8`): ASSUMED converted tile by tile
  as the matmul consumes it (its HBM bytes are the narrow source's, its VectorE time every
  element's), never written back.
- A node's time is the largest of its TensorE, vector engine and HBM times; the step is the
  sum over nodes (no overlap between nodes: an upper bound on a schedule the compiler
  overlaps, a lower bound on one it spills more than this model does).

Categories (the breakdown): ``matmuls`` (weight matmuls of the projections and the dense /
shared MLP), ``experts`` (router, top-k, the routed experts), ``gdn`` (the GatedDeltaNet
core and its state pages), ``attention`` (the attention core and its KV pages),
``collectives``, ``logits`` (final norm, the sampled rows' gather, lm_head), ``other``
(norms, embedding, elementwise glue).
"""

import dataclasses
import math

import torch

from vllm_gdn_neuron.kernels.interp.cost import Trn2Spec

# trn2's default logical NeuronCore: two physical NeuronCore-v3 (the sizing module's LNC = 2).
LNC = 2
SPEC = Trn2Spec()
TENSOR_CLOCK_HZ = SPEC.tensor_clock_hz
HBM_BYTES_PER_S = SPEC.hbm_bytes_per_s * LNC
# On-chip working memory of a logical core: 2 x 24 MiB SBUF (Trainium2 architecture guide).
SBUF_BYTES = LNC * 24 * 2**20
# ASSUMPTION: fixed cost of one intra-chip collective over NeuronLink (CC-cores, ring / mesh
# algorithms of the Neuron runtime docs); the docs give no small-message latency for trn2.
COLLECTIVE_LATENCY_S = 5e-6
CATEGORIES = ("matmuls", "experts", "gdn", "attention", "collectives", "logits", "other")

VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "slice", "select", "expand", "unsqueeze", "squeeze", "transpose", "t",
    "permute", "alias", "detach", "split", "split_with_sizes", "chunk", "diagonal", "lift_fresh_copy", "as_strided",
    "unbind", "empty", "empty_like", "getitem", "_reshape_alias", "unfold", "view_as_real", "view_as_complex",
})
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm"})
GATHER_OPS = frozenset({"index_select", "embedding", "gather", "index"})
SCATTER_OPS = frozenset({"index_copy", "index_put", "scatter", "index_add", "scatter_add", "index_copy_",
                         "index_put_", "slice_scatter", "select_scatter"})
SCALAR_ENGINE_OPS = frozenset({"exp", "sigmoid", "silu", "softplus", "rsqrt", "sqrt", "log", "cos", "sin", "tanh",
                               "pow", "reciprocal", "_softmax", "erf", "log1p", "expm1"})
COLLECTIVE_OPS = frozenset({"all_reduce", "all_gather"})
CONVERT_OPS = frozenset({"_to_copy", "convert_element_type"})


def op_name(node) -> str:
    target = node.target
    packet = getattr(target, "_overloadpacket", None)
    return getattr(packet, "__name__", getattr(target, "__name__", str(target))).rstrip("_") or str(target)


def _values(arg):
    if isinstance(arg, torch.fx.Node):
        yield arg
    elif isinstance(arg, (list, tuple)):
        for item in arg:
            yield from _values(item)


def nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    return 0


def numel(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (list, tuple)):
        return sum(numel(v) for v in value)
    return 0


@dataclasses.dataclass
class OpCost:
    """One node's modeled figures (seconds on one logical core)."""

    op: str
    category: str
    flops: int
    hbm_bytes: int
    tensor_s: float
    engine_s: float
    hbm_s: float
    collective_s: float = 0.0

    @property
    def time_s(self) -> float:
        return max(self.tensor_s, self.engine_s, self.hbm_s) + self.collective_s


def matmul_cost(batch: int, m: int, n: int, k: int, fp32: bool) -> tuple[int, float]:
    """``(FLOPs, TensorE seconds on one logical core)`` of ``batch`` products ``[M, K] @ [K, N]``."""
    tiles = math.ceil(k / SPEC.tensor_rows) * math.ceil(n / SPEC.tensor_cols)
    cycles = batch * tiles * max(m, SPEC.matmul_min_columns) * (SPEC.fp32_passes if fp32 else 1)
    return 2 * batch * m * n * k, cycles / TENSOR_CLOCK_HZ / LNC


def _matmul_dims(name, node):
    """``(batch, M, N, K)`` of a matmul node, from its operands' fake values."""
    if name in ("mm", "addmm"):
        a, b = (node.args[0], node.args[1]) if name == "mm" else (node.args[1], node.args[2])
        (m, k), n = a.meta["val"].shape, b.meta["val"].shape[1]
        return 1, m, n, k
    a, b = (node.args[0], node.args[1]) if name == "bmm" else (node.args[1], node.args[2])
    batch, m, k = a.meta["val"].shape
    return batch, m, b.meta["val"].shape[2], k


def engine_seconds(name: str, elements: int, narrow: bool) -> float:
    """VectorE (ScalarE for transcendental ops) time of ``elements`` on one logical core."""
    if name in SCALAR_ENGINE_OPS:
        clock, per_cycle = SPEC.scalar_clock_hz, SPEC.scalar_elements_per_cycle
    else:
        clock = SPEC.vector_clock_hz
        per_cycle = SPEC.vector_elements_per_cycle_16bit if narrow else SPEC.vector_elements_per_cycle
    return max(SPEC.min_ii_cycles, elements / per_cycle / LNC) / clock


def collective_seconds(name: str, payload_bytes: int, world: int) -> float:
    """Ring all-reduce (all-gather: half its traffic) of ``payload_bytes`` over ``world`` ranks."""
    if world <= 1:
        return 0.0
    traffic = (2 if name == "all_reduce" else 1) * (world - 1) / world * payload_bytes
    return COLLECTIVE_LATENCY_S + traffic / HBM_BYTES_PER_S


def _moved_elements(name: str, node, out) -> int:
    """Elements a non-matmul node processes: a gather its output, a scatter its source rows, others their
    largest operand."""
    if name in GATHER_OPS:
        return numel(out)
    if name in SCATTER_OPS or name == "copy":
        source = node.args[1] if name in ("slice_scatter", "select_scatter", "copy") else node.args[-1]
        if isinstance(source, torch.fx.Node):
            return numel(source.meta.get("val"))
    return max([numel(out)] + [numel(a.meta.get("val")) for a in _values(node.args)])


def _widens_weight(name: str, node, inputs: frozenset) -> bool:
    """A dtype conversion to a wider type of a graph input, or of rows gathered from one."""
    if name not in CONVERT_OPS or not isinstance(node.args[0], torch.fx.Node):
        return False
    source = node.args[0]
    from_input = source in inputs or (op_name(source) in GATHER_OPS and source.args[0] in inputs)
    source_value, out = source.meta.get("val"), node.meta.get("val")
    return from_input and isinstance(out, torch.Tensor) and out.element_size() > source_value.element_size()


def price_node(node, category: str, inputs: frozenset) -> OpCost | None:
    """The cost of one ``call_function`` node, or None for a free view."""
    name = op_name(node)
    out = node.meta.get("val")
    if name in VIEW_OPS:
        return None
    read_inputs = [a for a in _values(node.args) if a in inputs]
    if name in COLLECTIVE_OPS:
        world = node.args[1]
        payload = nbytes(node.args[0].meta["val"])
        return OpCost(name, "collectives", 0, 0, 0.0, 0.0, 0.0, collective_seconds(name, payload, world))
    hbm = 0
    if name in GATHER_OPS:
        source = node.args[0]
        hbm += nbytes(out) if source in inputs else 0
        hbm += sum(nbytes(a.meta["val"]) for a in read_inputs if a is not source)
    elif name in SCATTER_OPS and node.args[0] in inputs:
        hbm += nbytes(out) if name in ("slice_scatter", "select_scatter") else 0
        hbm += sum(nbytes(a.meta["val"]) for a in read_inputs if a is not node.args[0])
        if name not in ("slice_scatter", "select_scatter"):
            hbm += nbytes(node.args[-1].meta["val"]) if isinstance(node.args[-1], torch.fx.Node) else 0
    elif name == "copy" and node.args[0] in inputs:
        hbm += 0  # the functional graph's write-back of a mutated input: its rows were charged at the scatter
    else:
        hbm += sum(nbytes(a.meta["val"]) for a in read_inputs)
    if nbytes(out) > SBUF_BYTES and node not in inputs and not _widens_weight(name, node, inputs):
        hbm += 2 * nbytes(out)  # spilled (a written input stays where it is)
    flops, tensor_s, engine_s = 0, 0.0, 0.0
    if name in MATMUL_OPS:
        batch, m, n, k = _matmul_dims(name, node)
        flops, tensor_s = matmul_cost(batch, m, n, k, out.dtype == torch.float32)
    elif not (name in GATHER_OPS and node.args[0] in inputs):  # a gather from HBM is DMA: its bytes price it
        elements = _moved_elements(name, node, out)
        narrow = isinstance(out, torch.Tensor) and out.element_size() <= 2
        engine_s = engine_seconds(name, elements, narrow) if elements else 0.0
    return OpCost(name, category, flops, hbm, tensor_s, engine_s, hbm / HBM_BYTES_PER_S)


def price_graph(graph_module, categorize) -> list[tuple[object, OpCost]]:
    """``[(node, OpCost)]`` of every priced node; ``categorize(node, name, inputs) -> category``.

    Views of a graph input count as the input (``t`` of a weight read by ``mm``), and so does
    the result of a scatter into one: the functional graph's form of an in-place write, which
    stays in the input's HBM buffer (the layers that share one cache allocation write it in
    turn, each into the previous layer's result).
    """
    inputs = set()
    for node in graph_module.graph.nodes:  # graph inputs, their views (a weight's transpose), written inputs
        if node.op == "placeholder" or (node.op == "call_function"
                                        and op_name(node) in VIEW_OPS | SCATTER_OPS
                                        and isinstance(node.args[0], torch.fx.Node) and node.args[0] in inputs):
            inputs.add(node)
    inputs = frozenset(inputs)
    priced = []
    for node in graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        cost = price_node(node, categorize(node, op_name(node), inputs), inputs)
        if cost is not None:
            priced.append((node, cost))
    return priced
