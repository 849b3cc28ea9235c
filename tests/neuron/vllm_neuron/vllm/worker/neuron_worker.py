"""Stand-in of vllm-neuron's ``NeuronWorker``: vLLM 0.32's worker interface around the runner stand-in.

The worker file of the pinned fork (whn09/vllm-neuron @
``7ea992789fa624ea6b0d7ad4cb0789e784863904``) is not in that commit's stored snapshot; what
it does is read from the runner it hosts, ``vllm_neuron/vllm/worker/neuron_model_runner.py``
at the same pin (facts only, the code is this project's):

- ``execute_model`` (read from the start of its async guard to its return): before
  ``_update_states`` the previous step's pending async output is materialized; no
  scheduled tokens -> ``EMPTY_MODEL_RUNNER_OUTPUT``; a grammar bitmask while
  ``neuron_config.enable_structured_outputs`` is off raises the platform's message; the
  forward runs and its result is kept as ``ExecuteModelState``; ``execute_model``
  returns None.
- ``sample_tokens``: takes that state, samples (on-device sampling: the ids the graph
  returned), drops the ids of requests whose prompt is not complete (intermediate chunks),
  and returns vLLM's ``ModelRunnerOutput`` (``req_ids`` in the persistent batch's order,
  ``req_id_to_index``, ``sampled_token_ids`` one list per request) in synchronous mode, or
  under async scheduling an ``AsyncModelRunnerOutput`` (``AsyncNeuronModelRunnerOutput``)
  whose ``get_output`` materializes the ids once, under a lock, and writes them into the
  batch state (``_update_batch_state_with_samples``); the worker's next ``execute_model``
  does that materialization first if the executor's output thread has not.
- ``_update_states``: finished requests leave; the encoder-cache entries of vLLM's
  ``free_encoder_mm_hashes`` are freed; new requests join with their vLLM block ids
  and their images (``MultiModalFeatureSpec``: pixels, grid, placeholder range, hash)
  (one list per KV cache group); cached requests append ``new_block_ids`` (replace them
  when resumed after preemption); requests not scheduled this step leave the persistent
  batch (the runner stand-in's ``_schedule``).
- ``get_kv_cache_spec``: a ``FullAttentionSpec`` per attention layer of the shell's
  ``get_kv_spec()``, a ``MambaSpec`` per recurrent layer (block ``max_model_len``, page
  padded to the attention page); ``initialize_kv_cache``: the page-major int8 buffers of
  :mod:`runner_cache`, one per vLLM ``KVCacheTensor`` region, sized by vLLM's ``num_blocks``.
  vLLM 0.32 plans one ``KVCacheTensor`` per layer here (seen with the tiny models: no
  buffer shared across cache groups), where the fork's vLLM 0.24 shares each tensor among one
  layer of every group (``shared_by``); layers vLLM overlays at one offset share a buffer.
- warm-up of every bucket, then every step under
  ``torch.compiler.set_stance("fail_on_recompile")``.

The rest is the runner stand-in's (``tests/neuron/runner.py``): meta ``from_configs``,
``load_weights``, ``torch.compile(fullgraph=True)``, the hybrid page alignment, padded step
inputs, on-device sampling. The steps themselves run through its ``prefill`` (one request,
one chunk, padded to the smallest prefill bucket) and ``decode`` (padded to the smallest
decode bucket).

Still imitation, not the fork's code: ids are read back to the host inside the step (the
stand-in has no device future, so ``get_output`` only defers when the ids reach the request
state and the client); logprobs in synchronous mode are the log-softmax of the logits the
step returned, computed here in vLLM's sampler's layout (the fork's host-side ``_sample``
path was not read; under async scheduling the platform refuses them); no prompt logprobs,
speculative decoding or vision inputs through this worker; one rank (TP 1).

Observability for the tests (:mod:`standin_stats`): after warm-up and after every step the
worker reports graphs traced at warm-up and since, the bucket count, step kinds and the
buckets they used.
"""

import dataclasses
import logging
import threading
import time

import numpy as np
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, AsyncModelRunnerOutput, LogprobsLists, ModelRunnerOutput
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from tests.neuron import runner_cache, runner_vision, standin_stats
from tests.neuron.runner import (EngineSettings, GraphRecorder, NeuronRunnerStandIn, Request, Sampling,
                                 block_table_width, symbolic_graphs)

# Under vLLM's logger, so that its handler prints these lines in the engine's log.
logger = logging.getLogger(f"vllm.{__name__}")

STRUCTURED_OUTPUTS_OFF = ("Structured outputs were requested, but neuron_config.enable_structured_outputs is off "
                          "on this server.")


def shell_class(model_config):
    """The class vLLM's registry resolves for the served architecture: one whose ``from_configs`` builds the model."""
    from vllm.model_executor.models.registry import ModelRegistry

    model_cls, arch = ModelRegistry.resolve_model_cls(model_config.architectures, model_config=model_config)
    if not hasattr(model_cls, "from_configs"):
        raise TypeError(f"{arch} resolves to {model_cls.__module__}.{model_cls.__qualname__}, which is not a Neuron "
                        f"model (no from_configs): serve a VllmGdnNeuron* architecture on the Neuron platform")
    return model_cls


def engine_settings(vllm_config) -> EngineSettings:
    """The runner stand-in's settings from vLLM's engine config."""
    model_config, cache_config = vllm_config.model_config, vllm_config.cache_config
    scheduler_config = vllm_config.scheduler_config
    return EngineSettings(
        model=model_config.model, dtype=str(model_config.dtype).removeprefix("torch."),
        max_model_len=model_config.max_model_len, max_num_seqs=scheduler_config.max_num_seqs,
        block_size=cache_config.block_size if cache_config.user_specified_block_size else None,
        num_gpu_blocks_override=cache_config.num_gpu_blocks_override or 0,
        async_scheduling=bool(scheduler_config.async_scheduling), max_logprobs=model_config.max_logprobs,
        enable_prompt_embeds=bool(model_config.enable_prompt_embeds), uses_mrope=bool(model_config.uses_mrope),
        multimodal=bool(model_config.supports_multimodal_inputs), architectures=list(model_config.architectures),
        download_dir=vllm_config.load_config.download_dir, additional_config=dict(vllm_config.additional_config or {}))


def image_feature(spec) -> runner_vision.ImageFeature:
    """vLLM's ``MultiModalFeatureSpec`` of an image as the runner stand-in reads it (processor output:
    ``pixel_values``, ``image_grid_thw``; its placeholder range; its hash)."""
    if spec.modality != "image" or spec.data is None:
        raise NotImplementedError(f"the Neuron worker stand-in serves images with their pixels, got a "
                                  f"{spec.modality} item{' without data' if spec.data is None else ''}")
    grid = tuple(int(n) for n in spec.data["image_grid_thw"].data.reshape(-1).tolist())
    return runner_vision.ImageFeature(spec.identifier, spec.mm_position.offset, grid, spec.mm_position.length,
                                      pixel_values=spec.data["pixel_values"].data)


def sampling_of(params) -> Sampling:
    return Sampling(temperature=params.temperature, top_k=params.top_k or -1, top_p=params.top_p)


@dataclasses.dataclass
class ExecuteModelState:
    """What ``execute_model`` hands to ``sample_tokens``."""

    req_ids: list[str]
    sampled: list[list[int]]  # per request, [] for an intermediate prefill chunk
    logprobs: LogprobsLists | None = None


class AsyncNeuronOutputStandIn(AsyncModelRunnerOutput):
    """One step's output whose ids reach the request states and the engine when first asked for."""

    def __init__(self, worker: "NeuronWorker", state: ExecuteModelState) -> None:
        self._worker = worker
        self._state = state
        self._lock = threading.Lock()
        self._output: ModelRunnerOutput | None = None

    def get_output(self) -> ModelRunnerOutput:
        with self._lock:
            if self._output is None:
                self._output = self._worker._commit(self._state)
            return self._output


class NeuronWorker(WorkerBase):
    """vLLM's worker interface over :class:`runner.NeuronRunnerStandIn` (module docstring)."""

    def init_device(self) -> None:
        from vllm.utils.torch_utils import set_random_seed
        from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

        if self.parallel_config.world_size != 1:
            raise ValueError(f"the Neuron worker stand-in runs one rank, got a world size of "
                             f"{self.parallel_config.world_size} (set tensor-parallel-size 1)")
        self.device = torch.device("cpu")
        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, "gloo")
        set_random_seed(self.model_config.seed)
        self.settings = engine_settings(self.vllm_config)
        self.recorder = GraphRecorder()
        self.model_runner = NeuronRunnerStandIn(shell_class(self.model_config), self.settings, backend=self.recorder)
        self.requests: dict[str, Request] = {}
        self._state: ExecuteModelState | None = None
        self._pending: AsyncNeuronOutputStandIn | None = None
        self._lock = threading.Lock()
        vision = self.model_runner.vision_neuron_config
        vision_buckets = len(vision.num_vision_tokens_buckets) if vision is not None and self.settings.multimodal else 0
        self.stats = dict(buckets=len(self.model_runner.prefill_buckets) + len(self.model_runner.decode_buckets),
                          vision_buckets=vision_buckets, images=0,
                          warm_graphs=None, graphs=0, symbolic=0, prefill_steps=0, decode_steps=0,
                          prefill_buckets_used=[], decode_buckets_used=[], async_outputs=0)

    # --- start-up -----------------------------------------------------------------------------

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        if load_dummy_weights:
            raise ValueError("the Neuron worker stand-in loads the checkpoint's weights only")
        self.model_runner.load_model()
        kv_spec = self.model_runner.model.get_kv_spec()
        self.block_size, self.page_padded = runner_cache.align_hybrid_pages(kv_spec, self.settings.block_size,
                                                                            self.model_runner.model_dtype)
        platform_padded = self.cache_config.mamba_page_size_padded
        if kv_spec.recurrent_layers and platform_padded not in (None, self.page_padded):
            raise ValueError(f"the platform padded the state page to {platform_padded} bytes, the runner's alignment "
                             f"to {self.page_padded}: they must agree")

    def get_model(self):
        return self.model_runner.model

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["LBNHC"]  # one page-major region per layer

    def get_kv_cache_spec(self) -> dict:
        """vLLM's specs for the shell's cache needs (the runner's ``get_kv_cache_spec``)."""
        kv_spec = self.model_runner.model.get_kv_spec()
        dtype = self.model_runner.model_dtype
        specs = {layer.name: FullAttentionSpec(block_size=self.block_size, num_kv_heads=layer.num_kv_heads,
                                               head_size=layer.head_size, dtype=dtype)
                 for layer in kv_spec.layers}
        for layer in kv_spec.recurrent_layers:
            specs[layer.name] = MambaSpec(block_size=self.settings.max_model_len, shapes=tuple(map(tuple, layer.shapes)),
                                          dtypes=tuple(layer.dtypes), page_size_padded=self.page_padded)
        return specs

    def determine_available_memory(self) -> int:
        """Bytes for ``num_gpu_blocks_override`` blocks of every layer (the trn2 configs all set it)."""
        blocks = self.cache_config.num_gpu_blocks_override
        if not blocks:
            raise ValueError("the Neuron worker stand-in sizes its cache from num-gpu-blocks-override; set it")
        specs = self.get_kv_cache_spec()
        return (blocks + 1) * sum(spec.page_size_bytes for spec in specs.values())

    def initialize_from_config(self, kv_cache_config) -> None:
        """The runner's page-major int8 buffers for vLLM's groups and tensors, ``num_blocks`` pages each."""
        runner = self.model_runner
        num_blocks = kv_cache_config.num_blocks
        groups = []
        for group in kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            if isinstance(spec, MambaSpec):
                ours = runner_cache.StateSpec(tuple(spec.shapes), tuple(spec.dtypes), spec.block_size,
                                              spec.page_size_padded)
            else:
                ours = runner_cache.AttentionSpec(spec.block_size, spec.num_kv_heads, spec.head_size, spec.dtype)
            groups.append(runner_cache.CacheGroup(ours, list(group.layer_names)))
        page_bytes = groups[0].spec.page_size_bytes
        tensors = []
        for tensor in kv_cache_config.kv_cache_tensors:
            for names in self._shared_regions(tensor, page_bytes, num_blocks):
                tensors.append(runner_cache.CacheTensor(page_bytes * num_blocks, names))
        runner.groups, runner.cache_tensors = groups, tensors
        runner.caches = runner_cache.initialize_kv_cache(runner.model, groups, tensors)
        runner.block_size = self.block_size
        runner.free_blocks = []  # vLLM's scheduler hands out the blocks
        runner.widths = [block_table_width(self.settings.max_model_len, g.spec.block_size) for g in groups]
        runner.tables = [np.zeros((self.settings.max_num_seqs, w), dtype=np.int32) for w in runner.widths]
        runner.batch = []
        self.num_blocks = num_blocks
        logger.info("Neuron worker stand-in: %d blocks, %d groups, %d shared buffers", num_blocks, len(groups),
                    len(tensors))

    @staticmethod
    def _shared_regions(tensor, page_bytes: int, num_blocks: int) -> list[list[str]]:
        """The layer sets of one vLLM ``KVCacheTensor`` that share one page-major region each: layers at
        one offset alias one region (vLLM's cache groups overlaid), layers at different offsets do not."""
        if tensor.block_stride != page_bytes or tensor.offset:
            raise NotImplementedError(f"{tensor}: expected page-major regions ({page_bytes}-byte blocks from "
                                      f"offset 0)")
        by_offset: dict[int, list[str]] = {}
        for index, name in enumerate(tensor.layers):
            by_offset.setdefault(index * tensor.layer_stride, []).append(name)
        if len(by_offset) > 1 and tensor.layer_stride < page_bytes * num_blocks:
            raise NotImplementedError(f"{tensor}: layers interleaved within a block, expected layer-outermost")
        return list(by_offset.values())

    def compile_or_warm_up_model(self) -> CompilationTimes:
        start = time.perf_counter()
        self.model_runner.warm_up()
        elapsed = time.perf_counter() - start
        self.stats["warm_graphs"] = len(self.recorder.dynamo_graphs)
        self._write_stats()
        logger.info("Neuron worker stand-in: warm-up traced %d graphs for %d buckets in %.1f s",
                    self.stats["warm_graphs"], self.stats["buckets"], elapsed)
        return CompilationTimes(language_model=elapsed, encoder=0.0)

    # --- steps --------------------------------------------------------------------------------

    def _update_states(self, scheduler_output) -> None:
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
        for mm_hash in scheduler_output.free_encoder_mm_hashes:  # vLLM's encoder cache manager freed them
            if self.settings.multimodal and self.model_runner.encoder_cache.contains(mm_hash):
                self.model_runner.encoder_cache.free(mm_hash)
        for new in scheduler_output.scheduled_new_reqs:
            request = Request(list(new.prompt_token_ids), new.sampling_params.max_tokens,
                              sampling_of(new.sampling_params))
            request.computed = new.num_computed_tokens
            request.blocks = {g: list(ids) for g, ids in enumerate(new.block_ids)}
            request.num_logprobs = new.sampling_params.logprobs  # None: none asked for
            request.mm_features = [image_feature(spec) for spec in new.mm_features or ()]
            self.requests[new.req_id] = request
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, block_ids, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            request = self.requests[req_id]
            if req_id in cached.resumed_req_ids:
                request.blocks = {g: list(ids) for g, ids in enumerate(block_ids or ())}
                request.computed = computed
            elif block_ids is not None:
                for g, ids in enumerate(block_ids):
                    request.blocks.setdefault(g, []).extend(ids)
            if request.computed != computed:
                raise RuntimeError(f"request {req_id}: the scheduler counts {computed} computed tokens, the worker "
                                   f"{request.computed}")

    def execute_model(self, scheduler_output):
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.get_output()  # the previous step's ids into the request states first
        self._update_states(scheduler_output)
        scheduled = scheduler_output.num_scheduled_tokens
        if not scheduled:
            return EMPTY_MODEL_RUNNER_OUTPUT
        requests = {req_id: self.requests[req_id] for req_id in scheduled}
        padded = getattr(scheduler_output, "num_scheduled_tokens_padded", None)
        if padded is None:
            raise RuntimeError("the scheduler output carries no num_scheduled_tokens_padded: the Neuron scheduler "
                               "did not schedule this step")
        prefills = [r for r, req in requests.items() if req.computed < len(req.prompt)]
        runner = self.model_runner
        with torch.compiler.set_stance("fail_on_recompile"):
            if prefills:
                if len(prefills) != len(requests) or len(prefills) != 1:
                    raise RuntimeError(f"prefill step of {len(requests)} requests ({len(prefills)} prefilling): the "
                                       f"Neuron runner takes one prompt per prefill step")
                (req_id,) = prefills
                chunk = scheduled[req_id]
                bucket = next(b for b in runner.prefill_buckets if b >= chunk)
                if padded[req_id] != bucket:
                    raise RuntimeError(f"the scheduler padded {chunk} tokens to {padded[req_id]}, the runner's bucket "
                                       f"is {bucket}")
                if requests[req_id].computed == 0:
                    self.stats["images"] += len(requests[req_id].mm_features)
                token = runner.prefill(requests[req_id], chunk)
                sampled = {req_id: [] if token is None else [token]}
                self.stats["prefill_steps"] += 1
                self.stats["prefill_buckets_used"] = sorted({*self.stats["prefill_buckets_used"], bucket})
            else:
                if any(n != 1 for n in scheduled.values()):
                    raise NotImplementedError(f"decode step with {dict(scheduled)} tokens per request: the worker "
                                              f"stand-in decodes one token per request (no speculative decoding)")
                order = list(requests)
                ids = runner.decode([requests[r] for r in order])
                sampled = {r: [t] for r, t in zip(order, ids)}
                self.stats["decode_steps"] += 1
                bucket = next(b for b in runner.decode_buckets if b >= len(order))
                self.stats["decode_buckets_used"] = sorted({*self.stats["decode_buckets_used"], bucket})
        self.stats["graphs"] = len(self.recorder.dynamo_graphs)
        self.stats["symbolic"] = symbolic_graphs(self.recorder)
        by_request = {id(req): req_id for req_id, req in requests.items()}
        order = [by_request[id(req)] for req in runner.batch]  # the persistent batch's rows
        self._state = ExecuteModelState(order, [sampled[r] for r in order],
                                        self._logprobs([requests[r] for r in order], [sampled[r] for r in order]))
        return None

    def _logprobs(self, requests: list[Request], sampled: list[list[int]]) -> LogprobsLists | None:
        """vLLM's sampled-token logprobs (raw logits' log-softmax: the sampled id, its rank, the top ones)
        from the logits the step returned, for a step where some request asks for them. The runner reads
        logits back only in synchronous mode (the platform refuses logprobs under async scheduling)."""
        wanted = [getattr(r, "num_logprobs", None) for r in requests]
        if all(k is None for k in wanted):
            return None
        output = self.model_runner.outputs[-1][0]
        logits = output[1] if self.model_runner.on_device_sampling else output
        if logits is None:
            raise RuntimeError("logprobs asked for, but the step returned no logits (neuron_config.max_logprobs 0)")
        logprobs = torch.log_softmax(logits[:len(requests)].float(), dim=-1)
        top = max(k for k in wanted if k is not None)
        top = logprobs.shape[-1] if top == -1 else top
        chosen = torch.tensor([ids[0] if ids else 0 for ids in sampled], dtype=torch.int64)[:, None]
        chosen_logprobs = logprobs.gather(-1, chosen)
        top_logprobs, top_ids = torch.topk(logprobs, top, dim=-1)
        return LogprobsLists(logprob_token_ids=torch.cat([chosen, top_ids], 1).numpy(),
                             logprobs=torch.cat([chosen_logprobs, top_logprobs], 1).numpy(),
                             sampled_token_ranks=(logprobs >= chosen_logprobs).sum(-1).numpy())

    def sample_tokens(self, grammar_output):
        if grammar_output is not None and getattr(grammar_output, "grammar_bitmask", None) is not None and \
                not self.model_runner.neuron_config.enable_structured_outputs:
            raise ValueError(STRUCTURED_OUTPUTS_OFF)
        state, self._state = self._state, None
        if state is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        if not self.settings.async_scheduling:
            return self._commit(state)
        output = AsyncNeuronOutputStandIn(self, state)
        with self._lock:
            self._pending = output
        self.stats["async_outputs"] += 1
        return output

    def _commit(self, state: ExecuteModelState) -> ModelRunnerOutput:
        """The step's ids into their requests' states (those still served) and vLLM's output."""
        for req_id, ids in zip(state.req_ids, state.sampled):
            request = self.requests.get(req_id)
            if request is not None:
                request.output.extend(ids)
        self._write_stats()
        return ModelRunnerOutput(req_ids=list(state.req_ids),
                                 req_id_to_index={r: i for i, r in enumerate(state.req_ids)},
                                 sampled_token_ids=[list(ids) for ids in state.sampled], logprobs=state.logprobs)

    def take_draft_token_ids(self):
        return None

    def _write_stats(self) -> None:
        standin_stats.report("worker", self.stats)

    # --- the rest of the interface ------------------------------------------------------------

    def check_health(self) -> None:
        return

    def add_lora(self, lora_request) -> bool:
        raise ValueError("the Neuron worker stand-in serves no LoRA adapters")

    def remove_lora(self, lora_id: int) -> bool:
        return False

    def pin_lora(self, lora_id: int) -> bool:
        return False

    def list_loras(self) -> set[int]:
        return set()

    def shutdown(self) -> None:
        return

