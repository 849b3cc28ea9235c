"""What the vLLM shell's layers are told about quantization: a lookup from a module's name to
vLLM's quantization config for it (built by ``qwen3_5.VllmDecoderParts.quant_config``)."""

from collections.abc import Callable

from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

#: A module's name (the shell's, e.g. ``model.layers.0.self_attn.qkv_proj``) -> vLLM's
#: quantization config for it, or None where the module is served unquantized.
QuantConfigFor = Callable[[str], QuantizationConfig | None]


def unquantized(module: str) -> None:
    """The lookup of a model served unquantized: no module has a quantization config."""
    return None
