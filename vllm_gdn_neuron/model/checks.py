"""Start-up refusals of the model definition: configs neither shell can serve.

:func:`check_text_config` is the one set of model-level checks both shells run before any
weight is read (the vLLM shell from the plugin's config hook, the Neuron shell in
``from_configs``); each shell's engine-specific refusals sit beside it
(:func:`vllm_gdn_neuron.model.gdn_cache.check_gdn_config` for vLLM's cache settings,
:mod:`vllm_gdn_neuron.shells.neuron.checks` for vllm-neuron's). Each raises ``ValueError``
naming the config field, what is supported and what was given.
"""

from vllm_gdn_neuron.model.attention import check_attention_heads
from vllm_gdn_neuron.model.dims import check_layer_types, config_layer_types
from vllm_gdn_neuron.model.rotary import check_rope_parameters


def check_gdn_heads(config, tp_size: int) -> None:
    """Refuse GatedDeltaNet head counts, conv width or activation the GDN layer cannot serve at ``tp_size`` ranks."""
    hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
    if hk <= 0 or hv % hk:
        raise ValueError(
            f"linear_num_value_heads must be a positive multiple of linear_num_key_heads; "
            f"got linear_num_value_heads={hv}, linear_num_key_heads={hk}"
        )
    if hk % tp_size:
        raise ValueError(
            f"tensor_parallel_size must divide linear_num_key_heads={hk}; got tensor_parallel_size={tp_size}"
        )
    if config.linear_conv_kernel_dim < 1:
        raise ValueError(f"linear_conv_kernel_dim must be >= 1; got {config.linear_conv_kernel_dim}")
    if config.hidden_act != "silu":
        raise ValueError(f"hidden_act must be 'silu'; got {config.hidden_act!r}")


def check_feed_forward(config, tp_size: int) -> None:
    """Refuse feed-forward sizes the tensor-parallel split cannot serve."""
    fields = ("moe_intermediate_size", "shared_expert_intermediate_size") if getattr(config, "num_experts", 0) else ()
    if getattr(config, "intermediate_size", None):
        fields += ("intermediate_size",)
    for field in fields:
        if getattr(config, field) % tp_size:
            raise ValueError(f"tensor_parallel_size must divide {field}={getattr(config, field)}; got {tp_size}")


def check_text_config(config, tp_size: int) -> None:
    """Refuse a text config the model definition cannot serve at ``tp_size`` tensor-parallel ranks:
    the layer kinds, the GatedDeltaNet and attention heads, RoPE and the feed-forward sizes."""
    check_layer_types(config)
    layer_types = config_layer_types(config)
    if len(layer_types) != config.num_hidden_layers:
        raise ValueError(
            f"layer_types must have num_hidden_layers={config.num_hidden_layers} entries; got {len(layer_types)}"
        )
    check_gdn_heads(config, tp_size)
    check_attention_heads(config, tp_size)
    check_rope_parameters(config)
    check_feed_forward(config, tp_size)
