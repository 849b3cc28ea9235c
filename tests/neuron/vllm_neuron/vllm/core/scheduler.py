"""Stand-in of vllm-neuron's ``NeuronScheduler`` / ``NeuronAsyncScheduler`` on vLLM 0.32's scheduler.

The pinned fork's scheduler (whn09/vllm-neuron @ ``7ea992789fa624ea6b0d7ad4cb0789e784863904``)
is not in that commit's stored snapshot. It was read in full in the same release line:
AWShtokoyo/vllm-neuron @ ``8e6b66ac8fb546cf9ab05c98a1fc2c135018bceb``,
``vllm_neuron/vllm/core/scheduler.py`` (60,552 characters). Facts only; the code is this
project's, written against vLLM 0.32's ``Scheduler`` (whose waiting queues differ from the
vLLM that file targets).

Behaviour carried, each as read:

- **Admission through a holdback queue.** Every ``schedule()`` first moves all waiting
  requests aside, then gives back, in order, those ``can_schedule`` admits, stopping at the
  first refusal (FCFS kept). ``can_schedule`` refuses while the running queue is full
  (``max_num_seqs``), while any running request is still prefilling (its prompt, or a chunk
  of it, not all computed), once one request is already admitted this step
  (``max_prefills_per_batch = 1``), and while the running requests already reach the KV
  cache's worst-case concurrency (vLLM's ``get_max_concurrency_for_kv_cache_config``).
- **Prefill and decode never share a step.** With a prefill chunk in progress the decoding
  requests are hidden from vLLM's scheduler for the step; with a new prompt admitted, every
  running request is hidden; else a decode step of the running requests. The running
  limit is lowered by the hidden count for vLLM's scheduler call and restored after. When a
  prefill-only step comes back empty while decodes were hidden, the step is scheduled again
  as decode-only (the prefill retried next step).
- **Bucket padding recorded on the output.** ``num_scheduled_tokens_padded`` gives each
  prefill request the smallest ``num_batched_tokens_buckets`` entry that holds its chunk and
  each decode request its own count; a step holding both kinds raises.
- **Scheduling policy ``fcfs`` only**; ``num_seqs_buckets`` from ``neuron_config`` or
  ``[max_num_seqs]``.
- **The async variant** runs the same steps over vLLM's ``AsyncScheduler`` (output
  placeholders, next step scheduled before the last one's tokens are back).

Left out (each needs something these tests do not serve): the hybrid-pool admission gate
(worst-case block prediction through the KV manager's coordinator, an API that differs in
vLLM 0.32), the structured-output grammar waiters (the shipped configs keep structured
outputs off, and the platform refuses such requests), the grammar bitmask attached to the
output, the disaggregated-inference and decode-bench connector branches, the encoder-cache
locators, the vision encoder budget cap (text-only configs), the spec-decode placeholder
override of the async variant (no speculative decoding here), Prometheus padding metrics
and diagnostics logging.
"""

import logging
from collections import deque
from enum import Enum

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from tests.neuron import standin_stats

# Under vLLM's logger, so that its handler prints these lines in the engine's log.
logger = logging.getLogger(f"vllm.{__name__}")


class SchedulerState(Enum):
    """What the last ``schedule()`` call scheduled."""

    IDLE = "idle"
    ACTIVE_PREFILL = "prefill"
    ACTIVE_DECODE = "decode"


class MixedStepError(RuntimeError):
    """A step holding prefill and decode requests: the Neuron graphs serve one kind per step."""


def smallest_bucket(count: int, buckets: list[int]) -> int:
    """The smallest bucket holding ``count`` tokens (ValueError past the largest)."""
    for bucket in buckets:
        if bucket >= count:
            return bucket
    raise ValueError(f"{count} tokens exceed the largest bucket {buckets[-1]}")


class NeuronScheduler(Scheduler):
    """vLLM's scheduler under the Neuron constraints (module docstring)."""

    max_prefills_per_batch = 1

    def __init__(self, vllm_config, kv_cache_config, structured_output_manager, block_size: int,
                 hash_block_size: int | None = None, mm_registry=None, include_finished_set: bool = False,
                 log_stats: bool = False) -> None:
        kwargs = {} if mm_registry is None else {"mm_registry": mm_registry}
        super().__init__(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                         structured_output_manager=structured_output_manager, block_size=block_size,
                         hash_block_size=hash_block_size, include_finished_set=include_finished_set,
                         log_stats=log_stats, **kwargs)
        scheduler_config = vllm_config.scheduler_config
        if scheduler_config.policy != "fcfs":
            raise ValueError(f"the Neuron scheduler supports the 'fcfs' scheduling policy only, got "
                             f"{scheduler_config.policy!r}")
        self.max_num_seqs = scheduler_config.max_num_seqs
        neuron_config = (vllm_config.additional_config or {}).get("neuron_config", {})
        buckets = neuron_config.get("num_batched_tokens_buckets") or [scheduler_config.max_num_batched_tokens]
        self.num_batched_tokens_buckets = sorted(int(b) for b in buckets)
        seqs = neuron_config.get("num_seqs_buckets") or [self.max_num_seqs]
        self.num_seqs_buckets = sorted(int(b) for b in seqs)
        if self.num_seqs_buckets[-1] < self.max_num_seqs:
            raise ValueError(f"num_seqs_buckets {self.num_seqs_buckets}: the largest must hold max_num_seqs = "
                             f"{self.max_num_seqs}")
        self.holdback_queue: deque = deque()
        self.state = SchedulerState.IDLE
        self._max_kv_concurrent = self._kv_concurrency(vllm_config, kv_cache_config)
        self.stats = dict(scheduler=type(self).__name__, prefill_steps=0, decode_steps=0, most_prefills_in_a_step=0,
                          most_decodes_in_a_step=0, most_held_back=0, steps_hiding_decodes=0)
        self._write_stats()
        logger.info("Neuron scheduler stand-in: %s, one prefill per step, prefill buckets %s, decode buckets %s, "
                    "KV concurrency %d", type(self).__name__, self.num_batched_tokens_buckets, self.num_seqs_buckets,
                    self._max_kv_concurrent)

    def _kv_concurrency(self, vllm_config, kv_cache_config) -> int:
        """Requests the cache holds at ``max_model_len`` each (``max_num_seqs`` when it cannot tell)."""
        if kv_cache_config.kv_cache_groups:
            from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

            concurrent = int(get_max_concurrency_for_kv_cache_config(vllm_config, kv_cache_config))
        else:
            concurrent = 0
        if 0 < concurrent < self.max_num_seqs:
            logger.warning("max_num_seqs (%d) exceeds the KV cache's worst-case capacity (%d requests at "
                           "max_model_len): at most %d run at once", self.max_num_seqs, concurrent, concurrent)
        return concurrent if concurrent > 0 else self.max_num_seqs

    # --- admission ----------------------------------------------------------------------------

    @staticmethod
    def is_prefill(request) -> bool:
        return request.num_computed_tokens < request.num_prompt_tokens

    @property
    def at_capacity(self) -> bool:
        return len(self.running) >= self.max_num_seqs

    @property
    def has_prefill_in_running(self) -> bool:
        return any(self.is_prefill(r) for r in self.running)

    def can_schedule(self, request) -> bool:
        """Whether ``request`` may leave the holdback queue this step."""
        return not (self.at_capacity or self.has_prefill_in_running
                    or len(self.waiting) >= self.max_prefills_per_batch
                    or len(self.running) >= self._max_kv_concurrent)

    # --- one step -----------------------------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False):
        while self.waiting:
            self.holdback_queue.append(self.waiting.pop_request())
        while self.holdback_queue and self.can_schedule(self.holdback_queue[0]):
            self.waiting.add_request(self.holdback_queue.popleft())

        hidden: list = []
        if self.has_prefill_in_running:  # a prompt's next chunk: decodes wait
            hidden = [r for r in self.running if not self.is_prefill(r)]
            self.running = [r for r in self.running if self.is_prefill(r)]
        elif self.waiting and not self.at_capacity and len(self.running) < self._max_kv_concurrent:
            hidden, self.running = self.running, []  # a new prompt: every running request waits
        output = self._schedule_hiding(hidden, throttle_prefills)

        if not output.total_num_scheduled_tokens and hidden:
            # The prefill could not be scheduled (no blocks, say): decode the hidden requests instead.
            logger.warning("prefill-only step scheduled nothing; scheduling a decode-only step of %d requests",
                           len(hidden))
            deferred = [r for r in self.running if self.is_prefill(r)]
            self.running = [r for r in self.running if not self.is_prefill(r)] + hidden
            hidden = deferred
            while self.waiting:
                self.holdback_queue.append(self.waiting.pop_request())
            output = self._schedule_hiding(hidden, throttle_prefills)

        self.running = self.running + hidden
        while self.holdback_queue:
            self.waiting.add_request(self.holdback_queue.popleft())
        self._pad(output)
        self._update_state(output)
        self._count(output, hidden)
        return output

    def _count(self, output, hidden: list) -> None:
        """Step counts for the tests (:mod:`standin_stats`)."""
        if not output.num_scheduled_tokens:
            return
        stats = self.stats
        requests = len(output.num_scheduled_tokens)
        kind = "prefill" if self.state == SchedulerState.ACTIVE_PREFILL else "decode"
        stats[f"{kind}_steps"] += 1
        stats[f"most_{kind}s_in_a_step"] = max(stats[f"most_{kind}s_in_a_step"], requests)
        stats["most_held_back"] = max(stats["most_held_back"], len(self.waiting) if kind == "prefill" else 0)
        stats["steps_hiding_decodes"] += bool(hidden) and kind == "prefill"
        self._write_stats()

    def _write_stats(self) -> None:
        standin_stats.report("scheduler", self.stats)

    def _schedule_hiding(self, hidden: list, throttle_prefills: bool):
        """vLLM's scheduling of what is left visible, its running limits lowered by the hidden count."""
        limits = (self.max_num_running_reqs, self.max_num_active_reqs)
        self.max_num_running_reqs -= len(hidden)
        self.max_num_active_reqs -= len(hidden)
        try:
            return self._call_base_schedule(throttle_prefills)
        finally:
            self.max_num_running_reqs, self.max_num_active_reqs = limits

    def _call_base_schedule(self, throttle_prefills: bool):
        return Scheduler.schedule(self, throttle_prefills)

    @staticmethod
    def _computed_before_step(output) -> dict[str, int]:
        """Each scheduled request's computed tokens before this step (the output's, not the request's)."""
        computed = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
        cached = output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        return computed

    def _pad(self, output) -> None:
        """``num_scheduled_tokens_padded`` per request; a mixed step raises."""
        computed = self._computed_before_step(output)
        padded, prefills, decodes = {}, 0, 0
        for req_id, count in output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            if computed.get(req_id, request.num_computed_tokens) < request.num_prompt_tokens:
                prefills += 1
                padded[req_id] = smallest_bucket(count, self.num_batched_tokens_buckets)
            else:
                decodes += 1
                padded[req_id] = count
        if prefills and decodes:
            raise MixedStepError(f"Neuron constraint violated: {prefills} prefill and {decodes} decode requests in "
                                 f"one step")
        if prefills > self.max_prefills_per_batch:
            raise MixedStepError(f"Neuron constraint violated: {prefills} prefill requests in one step (at most "
                                 f"{self.max_prefills_per_batch})")
        output.num_scheduled_tokens_padded = padded

    def _update_state(self, output) -> None:
        if not self.waiting and not self.running:
            self.state = SchedulerState.IDLE
        elif output.num_scheduled_tokens:
            computed = self._computed_before_step(output)
            prefill = any(computed.get(r, 0) < self.requests[r].num_prompt_tokens
                          for r in output.num_scheduled_tokens if r in self.requests)
            self.state = SchedulerState.ACTIVE_PREFILL if prefill else SchedulerState.ACTIVE_DECODE


class NeuronAsyncScheduler(NeuronScheduler, AsyncScheduler):
    """The same steps over vLLM's ``AsyncScheduler`` (its ``_update_after_schedule`` through the MRO)."""

    def _call_base_schedule(self, throttle_prefills: bool):
        return AsyncScheduler.schedule(self, throttle_prefills)
