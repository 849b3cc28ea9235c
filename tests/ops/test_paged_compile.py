"""The paged ops trace as one static graph: torch.compile(fullgraph=True, dynamic=False) on
aot_eager, no graph break, no recompile across batch compositions of one bucket, no
device-to-host op in the captured graphs, and the same results as eager.

The compiled function builds the step metadata from raw tensors and runs the four ops, as a
model forward under vllm-neuron's runner does. Its backend is ``aot_eager`` with a forward
compiler that records the ATen graph; the Dynamo graph is recorded on the way in.
"""

import pytest
import torch
from torch._dynamo.backends.debugging import aot_eager
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import make_boxed_func

from vllm_gdn_neuron import ops

from .ops_testing import make_gdn_inputs

ROWS, TOKENS, SEQS, PAGES, PAD_PAGE = 4, 40, 3, 9, 0
HK, HV, DK, DV, WIDTH = 1, 2, 8, 8, 4
CHANNELS = 2 * HK * DK + HV * DV

# Batch compositions of the one bucket: (decode pages, prefill lengths, prefill pages, has_state).
COMPOSITIONS = [
    ([3, 5, 0, 0], [5, 33], [1, 2, 0], [True, False, False]),
    ([0, 0, 0, 0], [40], [4, 0, 0], [True, False, False]),
    ([8, 7, 6, 5], [1, 1, 1], [1, 2, 3], [False, True, False]),
    ([2, 0, 4, 0], [], [0, 0, 0], [False, False, False]),
    ([1, 2, 3, 4], [31, 2], [8, 6, 0], [True, True, False]),
]
#: Graph nodes that read device values on the host (or make shapes depend on them).
HOST_READ_METHODS = {"item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__"}
HOST_READ_ATEN = ("_local_scalar_dense", "nonzero", "unique", "_unique2", "unique_dim", "unique_consecutive",
                  "masked_select", "item", "_assert_async")
#: Ops the step avoids by design (comparisons and sums instead), whose Neuron lowering is uncertain.
SORTING_ATEN = ("sort", "argsort", "searchsorted")


def _aten_name(node):
    """``nonzero`` for ``aten.nonzero.default``; None for anything but an ATen op."""
    parts = str(node.target).split(".")
    return parts[1] if node.op == "call_function" and parts[0] == "aten" and len(parts) > 1 else None


def _step(inputs, conv_cache, ssm_cache, weight):
    """One engine step: metadata built in-graph, decode and prefill of conv1d and GDN."""
    dec = ops.DecodeStep.build(inputs["decode_pages"], PAD_PAGE)
    pre = ops.PrefillStep.build(inputs["qsl"], inputs["prefill_pages"], inputs["has_state"], TOKENS)
    y_dec = ops.paged_conv1d_decode(inputs["x_dec"], weight, conv_cache, dec)
    y_pre = ops.paged_conv1d_prefill(inputs["x_pre"], weight, conv_cache, pre)
    names = ("q", "k", "v", "g", "beta")
    o_dec = ops.paged_gdn_decode(*(inputs[f"{n}_dec"] for n in names), ssm_cache, dec, use_qk_l2norm=True)
    o_pre = ops.paged_gdn_prefill(*(inputs[f"{n}_pre"] for n in names), ssm_cache, pre, use_qk_l2norm=True)
    return y_dec, y_pre, o_dec, o_pre


def _inputs(composition, seed):
    decode_pages, lengths, prefill_pages, has_state = composition
    bounds = [0] + torch.tensor(lengths or [0], dtype=torch.int64).cumsum(0).tolist()
    bounds += [bounds[-1]] * (SEQS + 1 - len(bounds))
    gen = torch.Generator().manual_seed(seed)
    inputs = dict(decode_pages=torch.tensor(decode_pages), qsl=torch.tensor(bounds, dtype=torch.int32),
                  prefill_pages=torch.tensor(prefill_pages), has_state=torch.tensor(has_state),
                  x_dec=torch.randn(ROWS, CHANNELS, generator=gen), x_pre=torch.randn(TOKENS, CHANNELS, generator=gen))
    for part, count in (("dec", ROWS), ("pre", TOKENS)):
        x = make_gdn_inputs([count], HK, HV, DK, DV, with_state=False, seed=seed)
        inputs.update({f"{n}_{part}": x[n] for n in ("q", "k", "v", "g", "beta")})
    ops.check_step(PAGES, PAD_PAGE, decode=ops.DecodeStep.build(inputs["decode_pages"], PAD_PAGE),
                   prefill=ops.PrefillStep.build(inputs["qsl"], inputs["prefill_pages"], inputs["has_state"], TOKENS))
    return inputs


def _caches(seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(PAGES, CHANNELS, WIDTH, generator=gen), torch.randn(PAGES, HV, DK, DV, generator=gen)


@pytest.fixture(scope="module")
def compiled():
    """The compiled step and the graphs its backend saw (Dynamo-level and ATen-level)."""
    dynamo_graphs, aten_graphs = [], []

    def record_aten(gm, example_inputs):
        aten_graphs.append(gm)
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        dynamo_graphs.append(gm)
        return aot_eager(gm, example_inputs, fw_compiler=record_aten)

    torch._dynamo.reset()
    counters.clear()
    return torch.compile(_step, fullgraph=True, dynamic=False, backend=backend), dynamo_graphs, aten_graphs


def test_compiled_step_equals_eager_over_compositions_without_recompiling(compiled):
    step_fn, dynamo_graphs, _ = compiled
    weight = torch.randn(CHANNELS, WIDTH, generator=torch.Generator().manual_seed(9))
    for index, composition in enumerate(COMPOSITIONS):
        inputs = _inputs(composition, seed=index)
        conv, ssm = _caches(seed=index)
        conv_eager, ssm_eager = conv.clone(), ssm.clone()
        if index == 0:
            got = step_fn(inputs, conv, ssm, weight)
        else:
            with torch.compiler.set_stance("fail_on_recompile"):
                got = step_fn(inputs, conv, ssm, weight)
        want = _step(inputs, conv_eager, ssm_eager, weight)
        for name, a, b in zip(("y_dec", "y_pre", "o_dec", "o_pre"), got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=f"composition {index}: {name}")
        # The pad page's content is unspecified; every other page matches eager.
        live = [p for p in range(PAGES) if p != PAD_PAGE]
        torch.testing.assert_close(conv[live], conv_eager[live], rtol=0, atol=1e-5)
        torch.testing.assert_close(ssm[live], ssm_eager[live], rtol=0, atol=1e-5)
    assert len(dynamo_graphs) == 1
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1


def test_captured_graphs_have_no_host_reads_and_no_sort(compiled):
    step_fn, dynamo_graphs, aten_graphs = compiled
    if not dynamo_graphs:
        step_fn(_inputs(COMPOSITIONS[0], seed=0), *_caches(seed=0), torch.randn(CHANNELS, WIDTH))
    assert dynamo_graphs and aten_graphs
    bad = []
    for gm in dynamo_graphs:
        for node in gm.graph.nodes:
            if node.op == "call_method" and node.target in HOST_READ_METHODS:
                bad.append(node.format_node())
            if node.op == "call_method" and node.target == "to" and any(
                    isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu"
                    for a in list(node.args[1:]) + [node.kwargs.get("device")] if a is not None):
                bad.append(node.format_node())
    for gm in aten_graphs:
        for node in gm.graph.nodes:
            if _aten_name(node) in HOST_READ_ATEN + SORTING_ATEN:
                bad.append(node.format_node())
            if _aten_name(node) in ("index", "index_put", "index_put_"):
                for index in (node.args[1] if len(node.args) > 1 and isinstance(node.args[1], (list, tuple)) else []):
                    if index is not None and index.meta["val"].dtype == torch.bool:
                        bad.append(node.format_node())
    assert not bad, "\n".join(bad)
    # The caches are written back in place (functionalised: one copy_ into each cache input).
    copies = [n for n in aten_graphs[0].graph.nodes if n.op == "call_function" and "copy_" in str(n.target)]
    assert len(copies) == 2
