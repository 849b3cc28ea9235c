"""Under the runner's compile call (no ``dynamic=``) a new bucket size is a static graph of its own
once the shell has bound its caches (``shells/neuron/static_graphs.py``), and a symbolic one otherwise."""

import types

import torch

from vllm_gdn_neuron.shells.neuron.static_graphs import require_static_graphs

from .runner import symbolic_graphs


def _graphs_of_two_buckets() -> list:
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs, options=None):
        graphs.append(gm)
        return gm.forward

    step = torch.compile(lambda ids, slots: ids * 2 + slots, backend=backend, fullgraph=True, options={})
    for bucket in (8, 32):
        step(torch.ones(bucket), torch.arange(bucket))
    return graphs


def test_the_second_bucket_is_static_only_with_automatic_dynamic_shapes_off():
    # config.patch restores the setting afterwards; pytest's monkeypatch on Dynamo's config
    # module left the option hidden ("does not exist") for every later test of the process.
    with torch._dynamo.config.patch(automatic_dynamic_shapes=True):  # Dynamo's default
        graphs = _graphs_of_two_buckets()
        assert len(graphs) == 2 and symbolic_graphs(types.SimpleNamespace(dynamo_graphs=graphs)) == 1
        require_static_graphs()
        graphs = _graphs_of_two_buckets()
        assert len(graphs) == 2 and symbolic_graphs(types.SimpleNamespace(dynamo_graphs=graphs)) == 0
    torch._dynamo.reset()
