"""Start-up refusals of the Neuron shell: what it cannot serve fails in ``from_configs``.

Each check raises ``ValueError`` naming the setting, the value given and what to set
instead, before any weight is read, so a bad checkpoint, bucket list or engine option
never reaches the first request (and never serves zeros).

The engine settings come from vLLM's current config, which vllm-neuron's runner builds
the model under; where none is current (a model built outside an engine) the engine
checks are skipped.
"""

import logging

from vllm_gdn_neuron.kernels.checks import MAX_HEAD_DIM
from vllm_gdn_neuron.model.fp8 import FP8_METHOD, check_fp8_config
from vllm_gdn_neuron.model.checks import check_text_config as check_model_config
from vllm_gdn_neuron.model.mtp import check_mtp_config
from vllm_gdn_neuron.shells.neuron.fp8 import FP8_ON_DEVICE
from vllm_gdn_neuron.shells.neuron.vision_tower import check_vision_layout

logger = logging.getLogger(f"vllm.plugins.{__name__}")

# ``neuron_config.quantization`` values that mean weights in the model dtype on the device (the
# upstream Qwen3.5 recipe sets "bf16"); a block-FP8 checkpoint is then dequantized on the host.
UNQUANTIZED = (None, "bf16")
# Every ``neuron_config.quantization`` value the shell serves (FP8_ON_DEVICE: FP8 weights in HBM, :mod:`.fp8`).
SERVED_QUANTIZATIONS = (*UNQUANTIZED, FP8_ON_DEVICE)
# Checkpoint ``quantization_config.quant_method`` values the shell loads.
SERVED_CHECKPOINT_QUANTIZATIONS = (FP8_METHOD,)

# NeuronConfig parallel layouts beyond tensor parallelism; the shell serves only 1.
_UNSPLIT_LAYOUTS = ("ep_degree", "attention_dp_size", "embedding_dp_size", "lm_head_dp_size", "mlp_dp_size")


def check_text_config(config, tp_size: int) -> None:
    """Refuse a text config the model definition (:func:`vllm_gdn_neuron.model.checks.check_text_config`),
    the shell or the NKI kernels cannot serve at ``tp_size`` ranks."""
    check_model_config(config, tp_size)
    for field in ("linear_key_head_dim", "linear_value_head_dim"):
        size = getattr(config, field)
        if not 1 <= size <= MAX_HEAD_DIM:
            raise ValueError(f"{field} must be in [1, {MAX_HEAD_DIM}] (one NKI partition tile); got {size}")
    if getattr(config, "attention_bias", False):
        raise ValueError("attention_bias must be False (the Neuron shell loads no attention biases); got True")


def check_neuron_config(neuron_config, config, max_model_len: int | None, max_num_seqs: int | None) -> None:
    """Refuse vllm-neuron settings the shell cannot honour.

    Args:
        neuron_config: vllm-neuron's ``NeuronConfig`` (or None).
        config: the text config (``max_position_embeddings`` bounds every prefill bucket).
        max_model_len, max_num_seqs: the engine's limits when known (else not checked).
    """
    if neuron_config is None:
        return
    check_sampling_config(getattr(neuron_config, "on_device_sampling_config", None))
    quantization = getattr(neuron_config, "quantization", None)
    if quantization not in SERVED_QUANTIZATIONS:
        raise ValueError(
            f"neuron_config.quantization must be null or \"bf16\" (weights in the model dtype), or "
            f"\"{FP8_ON_DEVICE}\" (a block-FP8 checkpoint's FP8 weights kept on the device); got {quantization!r}: "
            "remove it from additional_config.neuron_config or set one of those"
        )
    for field in _UNSPLIT_LAYOUTS:
        value = getattr(neuron_config, field, 1)
        if value != 1:
            raise ValueError(
                f"neuron_config.{field} must be 1 (this model splits its layers by tensor parallelism only); "
                f"got {value!r}: remove {field} from additional_config.neuron_config"
            )
    if getattr(neuron_config, "fp8_packed_kv", False):
        raise ValueError(
            "neuron_config.fp8_packed_kv must be false (the KV cache is kept in the model dtype); got True: "
            "remove fp8_packed_kv from additional_config.neuron_config"
        )
    token_limit = min(v for v in (max_model_len, config.max_position_embeddings) if v is not None)
    _check_buckets("neuron_config.num_batched_tokens_buckets",
                   getattr(neuron_config, "num_batched_tokens_buckets", None), token_limit,
                   "max_model_len" if max_model_len is not None and max_model_len <= config.max_position_embeddings
                   else "max_position_embeddings")
    _check_buckets("neuron_config.num_seqs_buckets", getattr(neuron_config, "num_seqs_buckets", None),
                   max_num_seqs, "max_num_seqs")


def check_quantization(quantization_config, neuron_quantization) -> bool:
    """Refuse a checkpoint quantization the shell cannot load, or FP8 on the device without FP8 weights.

    Served: an unquantized checkpoint (no ``quantization_config``), and the block-FP8 format
    (``quant_method: "fp8"``, :func:`vllm_gdn_neuron.model.fp8.check_fp8_config`), dequantized
    on the host unless ``neuron_config.quantization`` is :data:`.fp8.FP8_ON_DEVICE`.

    Args:
        quantization_config: the checkpoint config's ``quantization_config`` (a dict) or None.
        neuron_quantization: ``neuron_config.quantization`` (checked by :func:`check_neuron_config`).

    Returns:
        Whether the checkpoint's FP8 projections are kept in FP8 on the device.

    Raises:
        ValueError: naming the method and what is supported, or the setting and what to set.
    """
    method = None if not quantization_config else quantization_config.get("quant_method", "unknown")
    if method is not None and method not in SERVED_CHECKPOINT_QUANTIZATIONS:
        raise ValueError(
            f"the checkpoint's quantization_config.quant_method is {method!r}: the Neuron shell loads unquantized "
            f"checkpoints and block-FP8 ones (quant_method {list(SERVED_CHECKPOINT_QUANTIZATIONS)}, "
            "weight_block_size [128, 128]); use the model's bf16 or FP8 release"
        )
    if method == FP8_METHOD:
        check_fp8_config(quantization_config)
    if neuron_quantization == FP8_ON_DEVICE and method != FP8_METHOD:
        raise ValueError(
            f"neuron_config.quantization is \"{FP8_ON_DEVICE}\" (keep the checkpoint's FP8 weights on the device), "
            f"but the checkpoint is not block-FP8 (quant_method {method!r}); serve an FP8 checkpoint or set "
            "neuron_config.quantization to null or \"bf16\""
        )
    return neuron_quantization == FP8_ON_DEVICE


def check_sampling_config(sampling_config) -> None:
    """Refuse an ``on_device_sampling_config`` the shell's sampler (:mod:`.sampling`) cannot honour.

    None (host sampling) is accepted, and so is any config with ``max_top_k`` an integer
    ``>= 1`` (a window wider than the vocabulary is the vocabulary), ``sampling_dp_degree`` 1
    and ``capture_topk`` off; ``all_greedy`` and ``deterministic`` are honoured.

    Raises:
        ValueError: naming the ``on_device_sampling_config`` field, its value and what to set.
    """
    if sampling_config is None:
        return
    name = "neuron_config.on_device_sampling_config"
    max_top_k = getattr(sampling_config, "max_top_k", None)
    if not isinstance(max_top_k, int) or isinstance(max_top_k, bool) or max_top_k < 1:
        raise ValueError(f"{name}.max_top_k must be an integer >= 1 (the sampler's candidate window); "
                         f"got {max_top_k!r}")
    degree = getattr(sampling_config, "sampling_dp_degree", 1)
    if degree != 1:
        raise ValueError(f"{name}.sampling_dp_degree must be 1 (every rank samples the all-gathered logits); "
                         f"got {degree!r}: remove sampling_dp_degree")
    if getattr(sampling_config, "capture_topk", False):
        raise ValueError(f"{name}.capture_topk must be false (the shell's sampler captures no tensors); got True")


# The speculative methods whose drafts the shell verifies (vLLM names every model's MTP head "mtp").
SERVED_SPEC_METHODS = ("mtp",)


def check_speculative_config(speculative_config, neuron_config, text_config, *, async_scheduling: bool,
                             max_num_seqs: int | None, max_num_batched_tokens: int | None) -> None:
    """Refuse a ``speculative-config`` whose verify steps the shell cannot serve (:mod:`.spec_decode`).

    Served: ``method: "mtp"`` on a checkpoint with its MTP head, ``num_speculative_tokens`` N >= 1,
    on-device sampling on (the drafts are judged in the step's graph, the GatedDeltaNet state
    kept at the last accepted token), synchronous scheduling, and decode buckets whose
    ``(1 + N) * rows`` tokens fit the runner's ``max_num_batched_tokens`` (its slot-mapping
    buffer; the runner raises it to the largest prefill bucket). Which drafter proposes the
    tokens is the runner's: the pinned one builds none for ``mtp`` (``docs/neuron-mtp.md``).

    Args:
        speculative_config: vLLM's ``SpeculativeConfig`` or None.
        neuron_config: vllm-neuron's ``NeuronConfig`` or None.
        text_config: the checkpoint's text config (its MTP head).
        async_scheduling: the engine's ``async-scheduling``.
        max_num_seqs, max_num_batched_tokens: the engine's limits (None where unknown).

    Raises:
        ValueError: naming the setting, what is served and what was given.
    """
    if speculative_config is None:
        return
    method = getattr(speculative_config, "method", None)
    if method not in SERVED_SPEC_METHODS:
        reason = {"eagle3": "the runner's EAGLE3 path needs the target's auxiliary hidden states "
                            "(SupportsEagle3), which this model does not return",
                  "ngram": "the pinned runner builds a drafter for eagle3 only"}.get(
            method, "the shell verifies the drafts of the checkpoint's own MTP head only")
        raise ValueError(f"speculative-config method must be one of {list(SERVED_SPEC_METHODS)}; got {method!r} "
                         f"({reason}): set {{\"method\": \"mtp\"}} or remove speculative-config")
    check_mtp_config(text_config)
    num_drafts = getattr(speculative_config, "num_speculative_tokens", None)
    if not isinstance(num_drafts, int) or isinstance(num_drafts, bool) or num_drafts < 1:
        raise ValueError(f"speculative-config num_speculative_tokens must be an integer >= 1; got {num_drafts!r}")
    if neuron_config is not None and getattr(neuron_config, "on_device_sampling_config", None) is None:
        raise ValueError(
            "speculative-config needs on-device sampling: the drafts are judged in the verify step's graph, where "
            "each GatedDeltaNet state is kept at the last accepted token (the runner passes the model no "
            "acceptance); got neuron_config.on_device_sampling_config null: remove that key"
        )
    if async_scheduling:
        raise ValueError(
            "speculative-config with async-scheduling: the runner then advances positions as if every draft were "
            "accepted and corrects them inside a model decorated for it (async_speculative_decoding), which this "
            "model is not; pass --no-async-scheduling (in a --config file: no-async-scheduling: true)"
        )
    seq_buckets = getattr(neuron_config, "num_seqs_buckets", None) if neuron_config is not None else None
    rows = max(seq_buckets) if seq_buckets else max_num_seqs
    token_buckets = getattr(neuron_config, "num_batched_tokens_buckets", None) if neuron_config is not None else None
    limit = max([v for v in (max_num_batched_tokens, *(token_buckets or ())) if v is not None], default=None)
    if rows is not None and limit is not None and (1 + num_drafts) * rows > limit:
        raise ValueError(
            f"speculative-config num_speculative_tokens={num_drafts}: the largest decode bucket's verify step takes "
            f"(1 + {num_drafts}) * {rows} = {(1 + num_drafts) * rows} tokens, more than max_num_batched_tokens="
            f"{limit} holds; expected num_speculative_tokens <= {limit // rows - 1}, or raise max-num-batched-tokens "
            f"or lower neuron_config.num_seqs_buckets"
        )


def _check_buckets(name: str, buckets, limit: int | None, limit_name: str) -> None:
    if buckets is None:
        return
    bad = [b for b in buckets if not isinstance(b, int) or isinstance(b, bool) or b < 1]
    if bad:
        raise ValueError(f"{name} must hold integers >= 1; got {list(buckets)}")
    if limit is not None and max(buckets) > limit:
        raise ValueError(f"{name} must not exceed {limit_name}={limit}; got {list(buckets)}")


def check_vision_neuron_config(vision_neuron_config, vision_config, image_limit: int | None,
                               video_limit: int | None) -> bool:
    """Whether the shell serves images: a ``vision_neuron_config`` is given, the checkpoint has a
    vision tower and the engine takes images; what it cannot serve is refused.

    vllm-neuron's runner passes the vision config whenever ``additional_config`` has one (the
    shipped configs state it so that the platform's vision auto-configuration stays bounded);
    with ``limit-mm-per-prompt`` image 0 it is unused. Images are encoded by the shell's tower
    (:mod:`.vision_tower`); videos are not served (their M-RoPE positions and per-frame
    placeholders are not implemented, ``docs/neuron-vision.md``).

    Args:
        vision_neuron_config: vllm-neuron's ``VisionNeuronConfig`` or None.
        vision_config: the checkpoint's ``vision_config`` or None (a text checkpoint).
        image_limit, video_limit: the engine's ``limit-mm-per-prompt`` for image and video
            (0 where the model takes no multimodal input), or None where no engine config
            is current (then images are served if the checkpoint has a tower).

    Raises:
        ValueError: naming ``limit-mm-per-prompt`` or the ``vision_neuron_config`` field, the
            value given and what to set instead.
    """
    if vision_neuron_config is None:
        return False
    if video_limit:
        raise ValueError(
            f"limit-mm-per-prompt allows video={video_limit}: the Neuron shell serves images, not videos "
            "(video M-RoPE positions and per-frame placeholders are not implemented); set limit-mm-per-prompt "
            f"{{\"image\": {image_limit or 0}, \"video\": 0}}")
    if image_limit == 0:
        logger.info("vision_neuron_config is not used: limit-mm-per-prompt is image=0, video=0 (text only)")
        return False
    if vision_config is None:
        if image_limit is None:
            logger.info("vision_neuron_config is not used: the checkpoint has no vision_config (a text model)")
            return False
        raise ValueError(
            f"additional_config.vision_neuron_config is given and limit-mm-per-prompt allows image={image_limit}, "
            "but the checkpoint has no vision tower (no vision_config); set limit-mm-per-prompt "
            "{\"image\": 0, \"video\": 0} (or remove vision_neuron_config and serve text only)")
    check_vision_layout(vision_neuron_config, vision_config)
    return True


def check_engine_config(vllm_config) -> None:
    """Refuse engine options the shell cannot serve (``vllm_config``: vLLM's ``VllmConfig``, or None).

    Raises:
        ValueError: naming the ``vllm serve`` option, its value and what to set instead.
    """
    if vllm_config is None:
        return
    cache = vllm_config.cache_config
    if getattr(cache, "enable_prefix_caching", False):
        raise ValueError(
            "enable-prefix-caching is true: a GatedDeltaNet layer keeps one state per sequence, not one per "
            "cached prefix, so a prefix-cache hit would continue from another request's state; "
            "pass --no-enable-prefix-caching (in a --config file: no-enable-prefix-caching: true)"
        )
    cache_dtype = str(getattr(cache, "cache_dtype", "auto"))
    if cache_dtype != "auto":
        raise ValueError(
            f"kv-cache-dtype must be 'auto' (the KV cache is kept in the model dtype); got {cache_dtype!r}: "
            "set kv-cache-dtype: auto"
        )
    pipeline = vllm_config.parallel_config.pipeline_parallel_size
    if pipeline != 1:
        raise ValueError(
            f"pipeline-parallel-size must be 1 (every rank holds every layer); got {pipeline}: "
            "set pipeline-parallel-size: 1 and split with tensor-parallel-size"
        )
