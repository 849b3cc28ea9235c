"""Preemption: a KV cache too small for the load changes no output.

One server for the module: the README's serve command with a 2 MiB KV + state cache
(room for a few of the long prompts at a time while up to 16 sequences may run), so
the scheduler must preempt running sequences, drop their KV blocks and GatedDeltaNet
states, and recompute them later. Float32, as in ``test_load.py``: the ids must equal
those of the same requests sent alone.
"""

import pytest

from tests.support.serving import Server, all_at_once, generated_ids, metric, mixed_requests, running_server

SMALL_CACHE_BYTES = 2 * 2**20
MAX_MODEL_LEN = 2048


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    flags = ("--kv-cache-memory-bytes", str(SMALL_CACHE_BYTES), "--max-model-len", str(MAX_MODEL_LEN),
             "--dtype", "float32")
    with running_server(tmp_path_factory.mktemp("preemption") / "server.log", *flags) as running:
        yield running


@pytest.mark.slow
def test_preemption_changes_no_output(server):
    batch = mixed_requests(48, seed=7, max_prompt=1500)
    alone = [generated_ids(server, request) for request in batch]
    preempted_before = metric(server, "vllm:num_preemptions_total")
    together = all_at_once(server, batch, workers=len(batch))
    preemptions = metric(server, "vllm:num_preemptions_total") - preempted_before
    assert preemptions > 0, "the cache was large enough: nothing was preempted, nothing was tested"
    for request, want, got in zip(batch, alone, together):
        assert got == want, (len(request["prompt"]), request["stream"])
