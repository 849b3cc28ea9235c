"""The stand-in Neuron scheduler's step rules on hand-built scheduler outputs (no engine).

What ``test_engine_serving.py`` cannot provoke through a server, because the scheduler never
builds such a step: a step mixing prefill and decode requests, or holding two prefills, is
refused; and each prefill request's padded count is the smallest prefill bucket holding its
chunk, a decode request's its own count.
"""

import types

import pytest

from vllm_neuron.vllm.core.scheduler import MixedStepError, NeuronScheduler, smallest_bucket

BUCKETS = [64, 256]


def _scheduler(prompts: dict[str, int]):
    """The attributes ``_pad`` reads: requests by id (prompt lengths), the prefill buckets, one prefill a step."""
    requests = {r: types.SimpleNamespace(num_prompt_tokens=n, num_computed_tokens=0) for r, n in prompts.items()}
    return types.SimpleNamespace(requests=requests, num_batched_tokens_buckets=BUCKETS, max_prefills_per_batch=1,
                                 _computed_before_step=NeuronScheduler._computed_before_step)


def _output(scheduled: dict[str, int], computed: dict[str, int]):
    """A scheduler output: every request a cached one with ``computed`` tokens before the step."""
    cached = types.SimpleNamespace(req_ids=list(computed), num_computed_tokens=list(computed.values()))
    return types.SimpleNamespace(num_scheduled_tokens=scheduled, scheduled_new_reqs=[], scheduled_cached_reqs=cached)


def test_a_prefill_pads_to_the_smallest_bucket_and_decodes_keep_their_count():
    scheduler = _scheduler({"a": 100, "b": 10, "c": 10})
    prefill = _output({"a": 65}, {"a": 0})
    NeuronScheduler._pad(scheduler, prefill)
    assert prefill.num_scheduled_tokens_padded == {"a": 256}
    decode = _output({"b": 1, "c": 1}, {"b": 10, "c": 12})
    NeuronScheduler._pad(scheduler, decode)
    assert decode.num_scheduled_tokens_padded == {"b": 1, "c": 1}
    assert [smallest_bucket(n, BUCKETS) for n in (1, 64, 65, 256)] == [64, 64, 256, 256]
    with pytest.raises(ValueError, match="exceed the largest bucket 256"):
        smallest_bucket(257, BUCKETS)


@pytest.mark.parametrize("scheduled, computed, problem", [
    ({"a": 30, "b": 1}, {"a": 0, "b": 10}, "1 prefill and 1 decode"),
    ({"a": 30, "b": 5}, {"a": 0, "b": 0}, "2 prefill requests"),
])
def test_a_step_mixing_kinds_or_holding_two_prefills_is_refused(scheduled, computed, problem):
    scheduler = _scheduler({"a": 100, "b": 10})
    with pytest.raises(MixedStepError, match=problem):
        NeuronScheduler._pad(scheduler, _output(scheduled, computed))
