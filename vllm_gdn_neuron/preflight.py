"""The checks ``vllm-gdn-serve`` runs on a checkpoint before vLLM starts: what it is, and what it costs.

:func:`load_checkpoint` reads ``config.json`` (a local folder, or a Hugging Face repo id
whose config alone is fetched) and refuses, with one :class:`CheckpointError` line, a
checkpoint this plugin cannot serve. The byte counts below are computed from the config
alone (the shapes transformers and this plugin give each tensor), so the same numbers
describe published checkpoints that are not on this machine.

Dimensions (config fields):
    V: ``vocab_size``; H: ``hidden_size``; Hq / Hkv: ``num_attention_heads`` /
    ``num_key_value_heads``; D: ``head_dim``; Hk / Hv: ``linear_num_key_heads`` /
    ``linear_num_value_heads``; Dk / Dv: ``linear_key_head_dim`` / ``linear_value_head_dim``;
    K: ``linear_conv_kernel_dim``; E: ``num_experts``.
"""

import dataclasses
import json
import pathlib
import types

from vllm_gdn_neuron.model.dims import (
    ModelDims,
    config_layer_types,
    count_fp8_weights,
    count_vision_weights,
    count_weights,
)
from vllm_gdn_neuron.plugin import ARCHITECTURES
from vllm_gdn_neuron.units import DTYPE_BYTES

#: The dtypes a checkpoint's weights are served in.
WEIGHT_DTYPES = ("float32", "bfloat16", "float16")
# The recurrent state is float32 in vLLM's CPU cache (its CPU platform forces it).
RECURRENT_STATE_BYTES = DTYPE_BYTES["float32"]


class CheckpointError(ValueError):
    """A checkpoint this plugin cannot serve; the message is one line saying why."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What ``config.json`` says about one checkpoint.

    Attributes:
        source: the folder or repo id as given.
        architecture: the served architecture (one of the plugin's).
        text: the text model's config fields (``text_config`` of a vision-language
            checkpoint, else the top level) as attributes.
        dtype: the weights' dtype name (``"bfloat16"`` when the config names none).
        name: the name to serve it under: the folder's name, or the repo id.
        vision: the vision tower's config fields (``vision_config``) of a vision-language
            checkpoint, else None.
        quantization_config: the checkpoint's ``quantization_config`` (None: unquantized).
    """

    source: str
    architecture: str
    text: types.SimpleNamespace
    dtype: str
    name: str
    vision: dict | None = None
    quantization_config: dict | None = None

    @property
    def quantization(self) -> str | None:
        """The checkpoint's ``quant_method`` (``"fp8"``: block-FP8 weights, which the plugin serves
        through vLLM's FP8 kernels or dequantizes to ``dtype`` at load, :func:`fp8_path`), None
        for an unquantized checkpoint."""
        return (self.quantization_config or {}).get("quant_method")


def load_checkpoint(model: str) -> Checkpoint:
    """Read and check the checkpoint ``model`` (a local folder or a Hugging Face repo id).

    Raises:
        CheckpointError: no such folder / repo, no ``config.json`` or weights in the
            folder, an architecture the plugin does not register, or a config the plugin
            refuses at start-up (see :func:`check_servable`).
    """
    path = pathlib.Path(model).expanduser()
    if path.is_dir():
        config = _read_config(path / "config.json", model)
        if not any(path.glob("*.safetensors")):
            raise CheckpointError(f"MODEL {model!r}: no weights (*.safetensors) in the folder")
        name = path.resolve().name
    elif _looks_like_repo_id(model):
        config = _read_config(_fetch_hub_config(model), model)
        name = model
    else:
        raise CheckpointError(
            f"MODEL {model!r}: no such folder (and not a Hugging Face repo id of the form 'org/name')"
        )
    architectures = config.get("architectures") or []
    served = [arch for arch in architectures if arch in ARCHITECTURES]
    if not served:
        raise CheckpointError(
            f"MODEL {model!r}: architecture {architectures or None} is not served by vllm-gdn-neuron "
            f"(it serves {', '.join(ARCHITECTURES)})"
        )
    fields = config.get("text_config") or config
    rope_parameters = fields.get("rope_parameters") or fields.get("rope_scaling")  # its older name
    text = types.SimpleNamespace(**{**_TEXT_DEFAULTS, **fields, "rope_parameters": rope_parameters})
    dtype = str(fields.get("dtype") or fields.get("torch_dtype") or config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    checkpoint = Checkpoint(source=model, architecture=served[0], text=text, dtype=dtype, name=name,
                            vision=config.get("vision_config") if "text_config" in config else None,
                            quantization_config=config.get("quantization_config"))
    try:
        check_servable(checkpoint, folder=path if path.is_dir() else None)
    except ValueError as error:
        raise CheckpointError(f"MODEL {model!r}: {error}") from None
    return checkpoint


# Config fields some checkpoints leave to the config class's default.
_TEXT_DEFAULTS = dict(
    hidden_act="silu", linear_conv_kernel_dim=4, tie_word_embeddings=False, attention_bias=False,
    decoder_sparse_step=1, mlp_only_layers=[], num_experts=0, full_attention_interval=4,
)


# Vision-config fields a checkpoint may leave to transformers' ``Qwen3_5VisionConfig`` defaults.
_VISION_DEFAULTS = dict(
    hidden_size=1152, intermediate_size=4304, out_hidden_size=3584, in_channels=3, temporal_patch_size=2,
    patch_size=16, num_position_embeddings=2304, spatial_merge_size=2, depth=27,
)


def check_servable(checkpoint: Checkpoint, folder: pathlib.Path | None = None) -> None:
    """The plugin's own start-up refusals, run on the config before vLLM starts: the model
    definition's (:func:`vllm_gdn_neuron.model.checks.check_text_config`, at one rank), the
    GatedDeltaNet cache's on vLLM's defaults (:func:`vllm_gdn_neuron.model.gdn_cache.check_gdn_config`),
    a quantized checkpoint other than block-FP8 or, in a local ``folder``, one whose FP8 scales do
    not match its weights (:func:`vllm_gdn_neuron.model.fp8.check_quantized_checkpoint`), and the
    weights' dtype.

    Raises:
        ValueError: as the plugin would at start-up (the message names the setting).
    """
    from vllm_gdn_neuron.model.checks import check_text_config
    from vllm_gdn_neuron.model.fp8 import check_quantized_checkpoint
    from vllm_gdn_neuron.model.gdn_cache import check_gdn_config

    check_text_config(checkpoint.text, tp_size=1)
    check_gdn_config(checkpoint.text, tp_size=1, num_speculative_tokens=0, mamba_ssm_cache_dtype="auto")
    check_quantized_checkpoint(checkpoint.quantization_config, folder=folder)
    if checkpoint.dtype not in WEIGHT_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(WEIGHT_DTYPES)}; got {checkpoint.dtype!r}")


def _read_config(config_path: pathlib.Path, model: str) -> dict:
    if not config_path.is_file():
        raise CheckpointError(f"MODEL {model!r}: no config.json in the folder (not a Hugging Face checkpoint)")
    try:
        return json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"MODEL {model!r}: config.json is not readable JSON ({error})") from None


def _looks_like_repo_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "~"))


# One request, no retries: a Hub that does not answer within this stops the check.
HUB_PROBE_TIMEOUT_S = 2.0


def _fetch_hub_config(repo_id: str) -> pathlib.Path:
    """``config.json`` of a Hugging Face repo: from the local cache, else fetched from the Hub.

    Before fetching, one request with a ``HUB_PROBE_TIMEOUT_S`` timeout checks that the Hub
    answers at all (``huggingface_hub`` alone retries an unreachable Hub for ~25 s);
    with ``HF_HUB_OFFLINE`` set only the cache is read.
    """
    from huggingface_hub import constants, hf_hub_download, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.utils import get_session

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return pathlib.Path(cached)
    unfetched = f"MODEL {repo_id!r}: not a local folder, and its config.json could not be fetched from the Hugging Face Hub"
    if constants.HF_HUB_OFFLINE:
        raise CheckpointError(f"{unfetched} (HF_HUB_OFFLINE is set and the local cache {constants.HF_HUB_CACHE} "
                              "does not hold it)")
    url = hf_hub_url(repo_id, "config.json")
    try:
        get_session().head(url, timeout=HUB_PROBE_TIMEOUT_S, follow_redirects=False)
    except Exception as error:  # no connection, no name resolution, no answer in time: all end here
        raise CheckpointError(
            f"{unfetched} (no answer from {constants.ENDPOINT} in one try of at most {HUB_PROBE_TIMEOUT_S:.0f} s: "
            f"{type(error).__name__}: {_first_line(error)}); give a local checkpoint folder"
        ) from None
    try:
        return pathlib.Path(hf_hub_download(repo_id, "config.json"))
    except Exception as error:  # unknown repo, gated repo, a failure mid-way: all end the same way
        raise CheckpointError(f"{unfetched} ({type(error).__name__}: {_first_line(error)})") from None


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


def parameter_count(text) -> int:
    """Parameters of the text model (embeddings, lm_head unless tied, every layer, final norm):
    ``layers.dims.count_weights`` of its dimensions.

    Multi-token-prediction (``mtp.*``) and vision-tower tensors are not counted: the
    served model does not load them.
    """
    return count_weights(_text_dims(text)).total


def _text_dims(text) -> ModelDims:
    return ModelDims.from_hf(text, name="checkpoint", source="config.json")


# Bytes of one FP8 weight, and of one block scale as vLLM's FP8 layers hold it (float32).
FP8_WEIGHT_BYTES = 1
FP8_SCALE_BYTES = 4


def weight_bytes(text, dtype: str, fp8_block_size: tuple[int, int] | None = None) -> int:
    """Bytes of the served text model's weights in ``dtype``; with ``fp8_block_size`` (a block-FP8
    checkpoint held in FP8, :func:`fp8_path`), the quantized projections at one byte each plus
    their block scales (``model.dims.count_fp8_weights``)."""
    dims = _text_dims(text)
    total = count_weights(dims).total * DTYPE_BYTES[dtype]
    if fp8_block_size is None:
        return total
    elements, blocks = count_fp8_weights(dims, fp8_block_size)
    return total - elements * (DTYPE_BYTES[dtype] - FP8_WEIGHT_BYTES) + blocks * FP8_SCALE_BYTES


def fp8_path(checkpoint: Checkpoint, dtype: str, tp_size: int):
    """How the CPU shell will serve a block-FP8 checkpoint in ``dtype`` over ``tp_size`` ranks
    (:func:`vllm_gdn_neuron.plugin.fp8_path`: through vLLM's FP8 kernels, or dequantized at load);
    None for an unquantized checkpoint."""
    import torch

    from vllm_gdn_neuron.plugin import fp8_path as plugin_fp8_path

    if not checkpoint.quantization_config:
        return None
    return plugin_fp8_path(checkpoint.text, checkpoint.quantization_config, getattr(torch, dtype), tp_size)


def vision_weight_bytes(checkpoint: Checkpoint, dtype: str) -> int:
    """Bytes of the vision tower's weights in ``dtype`` (0 for a text-only checkpoint):
    ``model.dims.count_vision_weights`` of its ``vision_config``."""
    if checkpoint.vision is None:
        return 0
    return count_vision_weights({**_VISION_DEFAULTS, **checkpoint.vision}) * DTYPE_BYTES[dtype]


def kv_bytes_per_token(text, dtype: str) -> int:
    """Key + value cache bytes one token costs over all full-attention layers."""
    attention_layers = config_layer_types(text).count("full_attention")
    return attention_layers * 2 * text.num_key_value_heads * text.head_dim * DTYPE_BYTES[dtype]


def state_bytes_per_sequence(text, dtype: str) -> int:
    """GatedDeltaNet conv + recurrent state bytes of one sequence over all GDN layers (any length)."""
    from vllm_gdn_neuron.model.gdn_cache import gdn_state_shapes

    (kernel, channels), (hv, dk, dv) = gdn_state_shapes(text, tp_size=1)
    per_layer = channels * kernel * DTYPE_BYTES[dtype] + hv * dk * dv * RECURRENT_STATE_BYTES
    return config_layer_types(text).count("linear_attention") * per_layer
