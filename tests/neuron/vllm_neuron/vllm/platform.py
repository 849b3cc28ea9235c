"""Stand-in of vllm-neuron's ``NeuronPlatform`` in its CPU mode, with the hooks that touch this plugin.

Read in full: whn09/vllm-neuron @ ``7ea992789fa624ea6b0d7ad4cb0789e784863904``,
``vllm_neuron/vllm/platform.py`` (45,691 characters), and the two helpers it imports for
vision buckets, ``vllm_neuron/utils/bucket_utils.py`` (``next_power_of_2``,
``get_default_num_vision_tokens_buckets``) and ``vllm_neuron/utils/vision_utils.py``
(``get_vision_token_merge_factor``), read in forks of the same line. Facts only; the code
is this project's.

Carried (each as the fork does it):

- device ``cpu`` (the fork's ``VLLM_NEURON_CPU_MODE``), OOT platform, no pinned memory,
  hybrid KV cache supported;
- ``update_block_size_for_backend``: block size 32 unless the user gave one, then vLLM's own
  ``_align_hybrid_block_size`` for hybrid models with a backend stand-in whose only kernel
  block size is ``MultipleOf(32)`` (vLLM would skip the alignment: no vLLM attention
  backend is registered for Neuron);
- ``apply_config_platform_defaults``: optimization level O2 becomes O1 unless
  ``--optimization-level`` is on the command line;
- ``check_and_update_config``: refuses a truthy ``VLLM_USE_V2_MODEL_RUNNER``; reads
  ``neuron_config.enable_structured_outputs`` (a bool, default off); validates quantization
  (compressed-tensors for the KV cache only, unless ``neuron_config.quantization`` names a
  CPU-dequantizing path); worker class ``vllm_neuron.vllm.worker.neuron_worker.NeuronWorker``
  when unset; executor ``mp`` unless ``mp`` or ``uni``; vision buckets resolved (explicit
  ``num_vision_tokens_buckets`` checked against the block size, else generated) where the
  checkpoint has a vision config and some modality is enabled; the per-image embedding
  limit; the Neuron scheduler (``NeuronAsyncScheduler`` under async scheduling) in place of
  vLLM's default ones;
- ``validate_request``: structured outputs refused while they are off; an image whose
  embeddings exceed the largest compiled vision bucket (over the merge factor) refused; and,
  this project's rule rather than the fork's platform (the runner computes logprobs on the
  host only in synchronous mode), logprobs refused under async scheduling. Refusals are
  ``RequestRefused``: on vLLM 0.32 a ``VLLMValidationError`` (its API server answers 400;
  a plain ``ValueError`` from here became a 500 with an empty message), on 0.24 a
  ``ValueError``.

The merge factor comes, as in the fork, from vllm-neuron's own model list: only the
models vllm-neuron ships say theirs, and any other architecture (this plugin's
``VllmGdnNeuron*`` names among them) gets 1, so the per-image limit is the largest bucket
in raw patch tokens, not in merged embeddings.

Left out, and why: the decode-context-parallel patch and checks, component data
parallelism and the KV / encoder-cache connectors (disaggregated serving; this plugin
serves neither), the profiling termination-timeout patch and input snapshots (device
diagnostics), ``max_pixels``-driven vision block sizes (no ``mm_processor_kwargs`` in the
shipped configs), the device count from the Neuron runtime and the collective
communicator (no device: one CPU rank), the Neuron attention backend class (the Neuron
worker never builds vLLM's attention layers), and the synthetic-model registration.
"""

import logging
import os
import sys

from vllm.platforms import Platform, PlatformEnum

logger = logging.getLogger(__name__)

STRUCTURED_OUTPUTS_OFF = (
    "Structured outputs were requested, but this Neuron server was started with "
    "additional_config.neuron_config.enable_structured_outputs=false; restart it with true "
    "to serve them, or send the request without structured outputs."
)
V2_MODEL_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
# vllm-neuron's default KV block size, the only kernel alignment its attention assumes.
KERNEL_BLOCK_ALIGNMENT = 32
# VisionNeuronConfig.vision_attention_block_size's default.
DEFAULT_VISION_BLOCK_SIZE = 2048
# neuron_config.quantization values whose weights are dequantized on the host.
CPU_DEQUANT_QUANTIZATIONS = frozenset({"mxfp8"})
# Architectures of vllm-neuron's own model list (``get_models()``) that declare a vision
# merge factor: none of this plugin's names is among them.
OWN_MERGING_ARCHITECTURES: frozenset[str] = frozenset()
DEFAULT_SCHEDULERS = ("vllm.v1.core.sched.scheduler.Scheduler", "vllm.v1.core.sched.async_scheduler.AsyncScheduler")
WORKER_CLS = "vllm_neuron.vllm.worker.neuron_worker.NeuronWorker"
SCHEDULER_CLS = "vllm_neuron.vllm.core.scheduler.NeuronScheduler"
ASYNC_SCHEDULER_CLS = "vllm_neuron.vllm.core.scheduler.NeuronAsyncScheduler"
EXECUTOR_BACKENDS = ("mp", "uni")


try:  # vLLM 0.32: its API server answers a VLLMClientError with a 400, any other error with a 500
    from vllm.exceptions import VLLMValidationError as _ClientError
except ImportError:  # vLLM 0.24: a ValueError is the client's
    _ClientError = ValueError


class RequestRefused(*((ValueError,) if _ClientError is ValueError else (_ClientError, ValueError))):
    """A request this Neuron server does not serve: a 4xx with the reason from vLLM's API server."""


LOGPROBS_UNDER_ASYNC = (
    "Logprobs were requested, but this Neuron server runs with async scheduling and samples on the device; "
    "the runner computes logprobs on the host only in synchronous mode: restart it with --no-async-scheduling "
    "to serve them, or send the request without logprobs.")


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def vision_buckets(max_bucket: int, block_size: int) -> list[int]:
    """Powers of two from the block size, then ``max_bucket``."""
    buckets, bucket = [], block_size
    while bucket < max_bucket:
        buckets.append(bucket)
        bucket *= 2
    return buckets + [max_bucket]


def vision_merge_factor(hf_config) -> int:
    if hf_config.architectures[0] in OWN_MERGING_ARCHITECTURES:
        return hf_config.vision_config.spatial_merge_size ** 2
    return 1


def multimodal_inputs_enabled(model_config) -> bool:
    """False when there is no multimodal config or every modality's per-prompt limit is 0."""
    mm_config = getattr(model_config, "multimodal_config", None)
    if mm_config is None:
        return False
    limits = getattr(mm_config, "limit_per_prompt", None) or {}
    counts = [int(getattr(limit, "count", limit)) for limit in limits.values()]
    return not (counts and all(count == 0 for count in counts))


class _MultipleOf32Backend:
    """The methods of vLLM's attention-backend interface that its hybrid alignment reads.

    The fork's stand-in backend has the first two (what vLLM 0.24 reads); vLLM 0.32 also calls
    ``customize_spec``, which vLLM's base backend leaves as the identity, as here.
    """

    @staticmethod
    def get_supported_kernel_block_sizes():
        from vllm.v1.attention.backend import MultipleOf

        return [MultipleOf(KERNEL_BLOCK_ALIGNMENT)]

    @staticmethod
    def get_name() -> str:
        return "neuron"

    @staticmethod
    def customize_spec(spec):
        return spec


class NeuronPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "cpu"
    device_type: str = "cpu"
    dispatch_key: str = "CPU"
    dist_backend: str = "gloo"
    ray_device_key: str = "neuron_cores"
    device_control_env_var: str = "NEURON_VISIBLE_DEVICES"
    supported_quantization: list[str] = ["neuron_quant", "compressed-tensors", "modelopt"]
    # Set by check_and_update_config, read by validate_request (the fork keeps them on the class).
    _enable_structured_outputs: bool = False
    _async_scheduling: bool = False
    _max_embeds_per_image: int | None = None

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return f"neuron:{device_id}"

    @classmethod
    def device_count(cls) -> int:
        return 1

    @classmethod
    def set_device(cls, device) -> None:
        pass

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return True

    @classmethod
    def update_block_size_for_backend(cls, vllm_config) -> None:
        cache_config = vllm_config.cache_config
        if not cache_config.user_specified_block_size:
            cache_config.block_size = KERNEL_BLOCK_ALIGNMENT
        model_config = vllm_config.model_config
        if model_config is not None and getattr(model_config, "is_hybrid", False):
            before = (cache_config.block_size, cache_config.mamba_page_size_padded)
            cls._align_hybrid_block_size(vllm_config, _MultipleOf32Backend)
            after = (cache_config.block_size, cache_config.mamba_page_size_padded)
            if before != after:
                logger.info("Hybrid model: block_size %s -> %s, mamba_page_size_padded %s -> %s",
                            before[0], after[0], before[1], after[1])

    @classmethod
    def apply_config_platform_defaults(cls, vllm_config) -> None:
        from vllm.config.vllm import OptimizationLevel

        if any(arg.startswith("--optimization-level") for arg in sys.argv):
            return
        if vllm_config.optimization_level == OptimizationLevel.O2:
            vllm_config.optimization_level = OptimizationLevel.O1

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        raw = os.environ.get(V2_MODEL_RUNNER_ENV)
        if raw is not None and raw.strip().lower() in ("1", "true", "yes", "on"):
            raise ValueError(f"{V2_MODEL_RUNNER_ENV} is set to {raw!r}, but the Neuron platform has no V2 model "
                             f"runner; unset it or set {V2_MODEL_RUNNER_ENV}=0.")
        model_config = vllm_config.model_config
        if model_config is None:
            return
        neuron_config = vllm_config.additional_config.get("neuron_config", {})
        structured = neuron_config.get("enable_structured_outputs", False)
        if not isinstance(structured, bool):
            raise ValueError(f"enable_structured_outputs must be a boolean, got {structured!r}")
        cls._enable_structured_outputs = structured
        cls._async_scheduling = bool(vllm_config.scheduler_config.async_scheduling)
        cls._validate_quantization(vllm_config)

        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = WORKER_CLS
        if parallel_config.distributed_executor_backend not in EXECUTOR_BACKENDS:
            parallel_config.distributed_executor_backend = "mp"

        hf_config = model_config.hf_config
        if hasattr(hf_config, "vision_config") and multimodal_inputs_enabled(model_config):
            cls._resolve_vision_buckets(vllm_config)
        vision = vllm_config.additional_config.get("vision_neuron_config")
        if vision and vision.get("num_vision_tokens_buckets"):
            cls._max_embeds_per_image = max(vision["num_vision_tokens_buckets"]) // max(vision_merge_factor(hf_config), 1)

        scheduler_config = vllm_config.scheduler_config
        if scheduler_config.scheduler_cls is None or scheduler_config.scheduler_cls in DEFAULT_SCHEDULERS:
            scheduler_config.scheduler_cls = ASYNC_SCHEDULER_CLS if scheduler_config.async_scheduling else SCHEDULER_CLS
        else:
            logger.warning("scheduler_cls is %s: not replaced by the Neuron scheduler", scheduler_config.scheduler_cls)

    @classmethod
    def _validate_quantization(cls, vllm_config) -> None:
        """compressed-tensors for the KV cache only (q/k/v scales), unless a host-dequantizing path is chosen."""
        neuron_config = vllm_config.additional_config.get("neuron_config", {})
        if neuron_config.get("quantization") in CPU_DEQUANT_QUANTIZATIONS:
            return
        quantization = getattr(vllm_config.model_config.hf_config, "quantization_config", None)
        if not quantization or quantization.get("quant_method") != "compressed-tensors":
            return
        for name, group in quantization.get("config_groups", {}).items():
            if group.get("weights"):
                raise ValueError(f"Neuron takes compressed-tensors for KV-cache quantization only; config_groups"
                                 f"[{name!r}] quantizes weights")
            if group.get("output_activations"):
                raise ValueError(f"Neuron takes compressed-tensors for KV-cache quantization only; config_groups"
                                 f"[{name!r}] quantizes output activations")
            if group.get("input_activations") and not any("Attention" in t for t in group.get("targets", [])):
                raise ValueError(f"Neuron takes compressed-tensors for KV-cache quantization only; config_groups"
                                 f"[{name!r}] quantizes input activations outside attention")

    @classmethod
    def _resolve_vision_buckets(cls, vllm_config) -> None:
        """Check explicit vision buckets against the block size, or generate them from ``max_model_len``."""
        vision = vllm_config.additional_config.setdefault("vision_neuron_config", {})
        block_size = vision.get("vision_attention_block_size", DEFAULT_VISION_BLOCK_SIZE)
        if vision.get("num_vision_tokens_buckets"):
            if vision.get("max_vision_seq_len"):
                raise ValueError("vision_neuron_config sets both num_vision_tokens_buckets and max_vision_seq_len; "
                                 "give one")
            largest = max(vision["num_vision_tokens_buckets"])
            if largest < block_size:
                raise ValueError(f"the largest vision bucket ({largest}) is smaller than vision_attention_block_size "
                                 f"({block_size})")
            return
        model_config = vllm_config.model_config
        max_bucket = next_power_of_2(model_config.max_model_len * vision_merge_factor(model_config.hf_config))
        max_seq_len = vision.get("max_vision_seq_len") or block_size
        if max_seq_len < block_size:
            raise ValueError(f"max_vision_seq_len ({max_seq_len}) must be at least vision_attention_block_size "
                             f"({block_size})")
        vision["num_vision_tokens_buckets"] = vision_buckets(min(max_bucket, max_seq_len), block_size)

    @classmethod
    def validate_request(cls, processed_inputs, params) -> None:
        if not cls._enable_structured_outputs and getattr(params, "structured_outputs", None) is not None:
            raise RequestRefused(STRUCTURED_OUTPUTS_OFF)
        if cls._async_scheduling and (getattr(params, "logprobs", None) is not None
                                      or getattr(params, "prompt_logprobs", None) is not None):
            raise RequestRefused(LOGPROBS_UNDER_ASYNC)
        if cls._max_embeds_per_image is None:
            return
        for modality, positions in (processed_inputs.get("mm_placeholders") or {}).items():
            for position in positions:
                embeds = position.get_num_embeds()
                if embeds > cls._max_embeds_per_image:
                    raise RequestRefused(f"A {modality} in this request produces {embeds} embedding tokens, over the "
                                     f"{cls._max_embeds_per_image} the compiled vision encoder takes; send a smaller "
                                     f"image or compile larger num_vision_tokens_buckets.")
