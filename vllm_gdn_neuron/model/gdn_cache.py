"""Shapes, dtypes and start-up checks of the GatedDeltaNet states in vLLM's mamba cache.

One cache slot per sequence holds two states (see ``docs/gdn-math.md``):

- the conv state: the last K raw (pre-conv) inputs of the q|k|v channels,
  ``C = (2 * Hk * Dk + Hv * Dv) / tp``, K = ``linear_conv_kernel_dim``, stored ``[K, C]``
  (channel-fast: the layout vLLM's own GDN conv state has, and the one its CPU conv kernels
  read in place); the ops take it as the ``[C, K]`` view :func:`conv_state_view` makes;
- the recurrent state ``[Hv / tp, Dk, Dv]`` (K-major), float32 unless the user asks
  for another dtype with ``--mamba-ssm-cache-dtype`` (or the checkpoint's
  ``mamba_ssm_dtype``).

The model classes and the layer both read these functions, so the page size vLLM
plans from the config and the views the layer gets always agree.
"""

import torch

from vllm_gdn_neuron.model.checks import check_gdn_heads
from vllm_gdn_neuron.model.dims import GDNDims
from vllm_gdn_neuron.model.dtypes import DTYPES
from vllm_gdn_neuron.model.fp8 import check_quantization_method

_SUPPORTED_SSM_DTYPES = ("auto", "float32", "bfloat16")


def gdn_state_shapes(text_config, tp_size: int) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """The per-slot ``(conv_state, recurrent_state)`` storage shapes on one tensor-parallel rank.

    Args:
        text_config: the Hugging Face text config (``linear_*`` fields).
        tp_size: tensor-parallel world size; must divide both head counts.

    Returns:
        ``((K, C), (Hv_local, Dk, Dv))``.
    """
    dims = GDNDims.from_config(text_config, tp_size)
    return (dims.conv_kernel, dims.conv_dim), (dims.num_v_heads, dims.head_k_dim, dims.head_v_dim)


def conv_state_view(conv_pages: torch.Tensor) -> torch.Tensor:
    """The ops' ``[P, C, K]`` view of conv state pages stored ``[P, K, C]`` (no copy: stride 1 along C)."""
    return conv_pages.transpose(-1, -2)


def gdn_state_dtypes(
    model_dtype: torch.dtype, mamba_cache_dtype: str, mamba_ssm_cache_dtype: str
) -> tuple[torch.dtype, torch.dtype]:
    """The ``(conv_state, recurrent_state)`` dtypes.

    Args:
        model_dtype: the activation dtype; the conv state follows it unless
            ``mamba_cache_dtype`` names another.
        mamba_cache_dtype: vLLM's ``--mamba-cache-dtype`` ("auto" or a dtype name).
        mamba_ssm_cache_dtype: vLLM's ``--mamba-ssm-cache-dtype``; "auto" means float32.
    """
    conv = model_dtype if mamba_cache_dtype == "auto" else DTYPES[mamba_cache_dtype]
    ssm = torch.float32 if mamba_ssm_cache_dtype == "auto" else DTYPES[mamba_ssm_cache_dtype]
    return conv, ssm


def check_gdn_config(
    text_config, tp_size: int, num_speculative_tokens: int, mamba_ssm_cache_dtype: str, quantization: str | None = None,
    prefix_caching: bool = False,
) -> None:
    """Refuse, at start-up, a configuration the GatedDeltaNet layer cannot serve on vLLM: its heads
    (:func:`~vllm_gdn_neuron.model.checks.check_gdn_heads`) and the engine's cache settings.

    Speculative decoding is served (the layer verifies ``1 + num_speculative_tokens`` tokens per
    request, one state slot per draft position), except with prefix caching (vLLM's mamba
    ``align`` mode): vLLM 0.32 carries the states of speculative steps between prefix blocks
    with a Triton GPU kernel its CPU platform has no CPU version of.

    Raises:
        ValueError: naming the setting, what is supported and what was given.
    """
    check_gdn_heads(text_config, tp_size)
    if num_speculative_tokens and prefix_caching:
        raise ValueError(
            "speculative decoding with prefix caching is not supported by the vllm-gdn-neuron GatedDeltaNet "
            "layer on CPU (vLLM moves speculative GatedDeltaNet states between prefix blocks with Triton GPU "
            "kernels); turn one off: --no-enable-prefix-caching, or no --speculative-config; got "
            f"num_speculative_tokens={num_speculative_tokens}, enable_prefix_caching={prefix_caching}"
        )
    check_quantization_method(quantization)
    if mamba_ssm_cache_dtype not in _SUPPORTED_SSM_DTYPES:
        raise ValueError(
            f"mamba_ssm_cache_dtype must be one of {_SUPPORTED_SSM_DTYPES}; got {mamba_ssm_cache_dtype!r}"
        )
