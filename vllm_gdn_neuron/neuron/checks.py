"""Start-up refusals of the Neuron shell: what it cannot serve fails in ``from_configs``.

Each check raises ``ValueError`` naming the config field, what the shell supports and
what was given, before any weight is read, so a bad checkpoint or bucket list never
reaches the first request (and never serves zeros).
"""

from vllm_gdn_neuron.kernels.gdn_cte import MAX_HEAD_DIM
from vllm_gdn_neuron.layers.attention import check_attention_heads
from vllm_gdn_neuron.layers.dims import check_layer_types
from vllm_gdn_neuron.layers.rotary import check_rope_parameters


def check_text_config(config, tp_size: int) -> None:
    """Refuse a text config the shell or the NKI kernels cannot serve at ``tp_size`` ranks."""
    check_layer_types(config)
    if len(config.layer_types) != config.num_hidden_layers:
        raise ValueError(
            f"layer_types must have num_hidden_layers={config.num_hidden_layers} entries; got {len(config.layer_types)}"
        )
    hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
    if hk <= 0 or hv % hk:
        raise ValueError(
            f"linear_num_value_heads must be a positive multiple of linear_num_key_heads; "
            f"got linear_num_value_heads={hv}, linear_num_key_heads={hk}"
        )
    for field in ("linear_key_head_dim", "linear_value_head_dim"):
        size = getattr(config, field)
        if not 1 <= size <= MAX_HEAD_DIM:
            raise ValueError(f"{field} must be in [1, {MAX_HEAD_DIM}] (one NKI partition tile); got {size}")
    if hk % tp_size:
        raise ValueError(
            f"tensor_parallel_size must divide linear_num_key_heads={hk}; got tensor_parallel_size={tp_size}"
        )
    check_attention_heads(config, tp_size)
    if config.linear_conv_kernel_dim < 1:
        raise ValueError(f"linear_conv_kernel_dim must be >= 1; got {config.linear_conv_kernel_dim}")
    if config.hidden_act != "silu":
        raise ValueError(f"hidden_act must be 'silu'; got {config.hidden_act!r}")
    if getattr(config, "attention_bias", False):
        raise ValueError("attention_bias must be False (the Neuron shell loads no attention biases); got True")
    check_rope_parameters(config)
    if getattr(config, "num_experts", 0):
        for field in ("moe_intermediate_size", "shared_expert_intermediate_size"):
            if getattr(config, field) % tp_size:
                raise ValueError(
                    f"tensor_parallel_size must divide {field}={getattr(config, field)}; got {tp_size}"
                )
    if getattr(config, "intermediate_size", None) and config.intermediate_size % tp_size:
        raise ValueError(
            f"tensor_parallel_size must divide intermediate_size={config.intermediate_size}; got {tp_size}"
        )


def check_neuron_config(neuron_config, config, max_model_len: int | None, max_num_seqs: int | None) -> None:
    """Refuse vllm-neuron settings the shell cannot honour.

    Args:
        neuron_config: vllm-neuron's ``NeuronConfig`` (or None).
        config: the text config (``max_position_embeddings`` bounds every prefill bucket).
        max_model_len, max_num_seqs: the engine's limits when known (else not checked).
    """
    if neuron_config is None:
        return
    if getattr(neuron_config, "on_device_sampling_config", None) is not None:
        raise ValueError(
            "neuron_config.on_device_sampling_config must be None: this model returns the logits of "
            "sampling_positions for vLLM's sampler (pass \"on_device_sampling_config\": null in "
            "additional_config.neuron_config); got an on-device sampling config"
        )
    if getattr(neuron_config, "quantization", None) is not None:
        raise ValueError(
            f"neuron_config.quantization must be None (bf16 / fp32 weights); got {neuron_config.quantization!r}"
        )
    token_limit = min(v for v in (max_model_len, config.max_position_embeddings) if v is not None)
    _check_buckets("neuron_config.num_batched_tokens_buckets",
                   getattr(neuron_config, "num_batched_tokens_buckets", None), token_limit,
                   "max_model_len" if max_model_len is not None and max_model_len <= config.max_position_embeddings
                   else "max_position_embeddings")
    _check_buckets("neuron_config.num_seqs_buckets", getattr(neuron_config, "num_seqs_buckets", None),
                   max_num_seqs, "max_num_seqs")


def _check_buckets(name: str, buckets, limit: int | None, limit_name: str) -> None:
    if buckets is None:
        return
    bad = [b for b in buckets if not isinstance(b, int) or isinstance(b, bool) or b < 1]
    if bad:
        raise ValueError(f"{name} must hold integers >= 1; got {list(buckets)}")
    if limit is not None and max(buckets) > limit:
        raise ValueError(f"{name} must not exceed {limit_name}={limit}; got {list(buckets)}")
