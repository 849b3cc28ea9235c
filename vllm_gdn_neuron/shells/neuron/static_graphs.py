"""One static graph per bucket under vllm-neuron's own ``torch.compile`` call.

The runner compiles the model with ``torch.compile(model, backend=..., fullgraph=True,
options=...)`` and no ``dynamic=`` (whn09/vllm-neuron ``neuron_model_runner.py`` at
``7ea99278``, ``load_model``). Under that default Dynamo compiles the first bucket with
static shapes and, when the second bucket arrives with other sizes, recompiles with the
changed sizes symbolic ("automatic dynamic shapes"): the warm-up of four buckets then
leaves three graphs, two of them symbolic, and a symbolic graph is not what a
one-NEFF-per-bucket backend is known to take. The model cannot change the runner's call,
so it turns automatic dynamic shapes off for its process when its caches are bound (after
``load_model``'s compile, before the first warm-up step): every bucket is then traced once
with its own static sizes.

This is a process-wide Dynamo setting. In the runner's worker the model (and a drafter the
shell does not support) is the only compiled module.
"""

import logging

import torch

logger = logging.getLogger(__name__)


def require_static_graphs() -> None:
    """Make Dynamo trace every new input size as a static graph of its own (idempotent)."""
    if torch._dynamo.config.automatic_dynamic_shapes:
        torch._dynamo.config.automatic_dynamic_shapes = False
        logger.info("vllm-gdn-neuron: Dynamo automatic dynamic shapes off (one static graph per bucket)")
