"""Block-FP8 checkpoints: the format, its quantization, dequantization and checks (no engine).

The published FP8 Qwen3.5 / Qwen3-Next checkpoints say, in ``config.json``::

    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128], "modules_to_not_convert": [...]}

Each quantized weight ``W`` [N, K] is stored as ``float8_e4m3fn`` beside ``W_scale_inv``
[ceil(N / 128), ceil(K / 128)] (float32 or bfloat16), one value per 128 x 128 block, the
blocks on the last rows / columns clipped to what is left. The weight is
``W[i, j] = fp8[i, j] * scale_inv[i // 128, j // 128]``. Activations are not quantized
in the checkpoint (``dynamic``: an FP8 kernel quantizes them itself, per token).

Quantized (:data:`QUANTIZED_PROJECTIONS`): the GatedDeltaNet ``in_proj_qkv``, ``in_proj_z``
(Qwen3-Next: the packed ``in_proj_qkvz``) and ``out_proj``, the attention ``q/k/v/o_proj``, the
dense MLP, the shared expert and every routed expert (one tensor per expert,
``mlp.experts.{e}.{gate,up,down}_proj.weight``). Everything else stays in bf16: embeddings,
``lm_head``, the router ``mlp.gate``, ``shared_expert_gate``, ``conv1d``, ``in_proj_a`` /
``in_proj_b`` (``in_proj_ba``), ``A_log``, ``dt_bias``, the norms, the vision tower.

Dimensions:
    N, K: a weight's rows (outputs) and columns (inputs); Bn, Bk: the block's rows and columns.
"""

import re
from collections.abc import Iterable, Iterator, Mapping

import torch

from vllm_gdn_neuron.model.checkpoint import text_tensor_name

FP8_METHOD = "fp8"
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max
BLOCK_SIZE = (128, 128)
SCALE_SUFFIX = "_scale_inv"
SCALE_DTYPES = (torch.float32, torch.bfloat16)
# The quantization_config values the published block-FP8 checkpoints carry and this plugin reads.
SUPPORTED_FMT = "e4m3"
SUPPORTED_ACTIVATION_SCHEME = "dynamic"
# safetensors' dtype names of the tensors a block-FP8 checkpoint holds.
SAFETENSORS_FP8 = "F8_E4M3"
SAFETENSORS_SCALE_DTYPES = ("F32", "BF16")

#: Module-name endings (before ``.weight``) of the projections a block-FP8 checkpoint quantizes.
QUANTIZED_PROJECTIONS = (
    "linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_qkvz", "linear_attn.out_proj",
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    "shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj",
)
# A routed expert's projection: ``mlp.experts.{e}.{gate,up,down}_proj``.
_EXPERT_PROJECTION = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj$")
# Checkpoint-name prefixes never quantized (the vision tower of a vision-language checkpoint).
UNQUANTIZED_PREFIXES = ("model.visual.", "visual.")


def scale_name(weight_name: str) -> str:
    """The checkpoint name of a quantized weight's block scales (``...weight`` -> ``...weight_scale_inv``)."""
    return weight_name + SCALE_SUFFIX


def is_scale_name(name: str) -> bool:
    return name.endswith(".weight" + SCALE_SUFFIX)


def is_quantized_weight(name: str, modules_to_not_convert: Iterable[str] = ()) -> bool:
    """Whether the block-FP8 format quantizes the checkpoint tensor ``name``.

    A projection of :data:`QUANTIZED_PROJECTIONS` (a routed expert's too:
    ``mlp.experts.{e}.gate_proj``), outside the vision tower and outside every module
    of ``modules_to_not_convert`` (full checkpoint module names, or their prefixes).
    """
    if not name.endswith(".weight") or name.startswith(UNQUANTIZED_PREFIXES):
        return False
    module = name[: -len(".weight")]
    if not (module.endswith(QUANTIZED_PROJECTIONS) or _EXPERT_PROJECTION.search(module)):
        return False
    return not any(module == skipped or module.startswith(skipped + ".") for skipped in modules_to_not_convert)


def module_is_quantized(checkpoint_modules: Iterable[str], modules_to_not_convert: Iterable[str] = ()) -> bool:
    """Whether a module loaded from the checkpoint modules ``checkpoint_modules`` (a merged projection's
    parts; text-decoder names, ``model.layers.N...`` or ``mtp.layers.N...``) is stored in block-FP8:
    :func:`is_quantized_weight` of every part, ``modules_to_not_convert`` read in the same names
    (a vision-language checkpoint's ``model.language_model.`` wrapper dropped).

    Raises:
        ValueError: some parts quantized and others not (one module holds one format).
    """
    skipped = [text_tensor_name(name) or name for name in modules_to_not_convert]
    quantized = {module: is_quantized_weight(module + ".weight", skipped) for module in checkpoint_modules}
    if len(set(quantized.values())) > 1:
        raise ValueError(f"a merged projection's parts must all be block-FP8 or none; got {quantized} "
                         f"(quantization_config.modules_to_not_convert lists some of them)")
    return any(quantized.values())


def scale_shape(weight_shape: Iterable[int], block_size: tuple[int, int] = BLOCK_SIZE) -> tuple[int, int]:
    """The shape of a 2-D weight's block scales: ``(ceil(N / Bn), ceil(K / Bk))``."""
    rows, cols = tuple(weight_shape)
    block_rows, block_cols = block_size
    return -(-rows // block_rows), -(-cols // block_cols)


def _expand_blocks(scale: torch.Tensor, shape: tuple[int, int], block_size: tuple[int, int]) -> torch.Tensor:
    """One block value per element of a [N, K] weight (edge blocks clipped)."""
    block_rows, block_cols = block_size
    expanded = scale.repeat_interleave(block_rows, dim=0).repeat_interleave(block_cols, dim=1)
    return expanded[: shape[0], : shape[1]]


def quantize_blocks(
    weight: torch.Tensor, block_size: tuple[int, int] = BLOCK_SIZE, scale_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-quantize a float weight as the published checkpoints store it.

    Each Bn x Bk block (clipped at the edges) is scaled so its largest magnitude maps to
    e4m3fn's largest value; an all-zero block gets scale 1.

    Args:
        weight: [N, K] float.
        block_size: (Bn, Bk).
        scale_dtype: float32 or bfloat16, the dtype the scales are stored in.

    Returns:
        (fp8 [N, K] float8_e4m3fn, scale_inv [ceil(N / Bn), ceil(K / Bk)] ``scale_dtype``),
        such that :func:`dequantize_blocks` gives the weight back to e4m3fn's precision.
    """
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [N, K]; got shape {tuple(weight.shape)}")
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype must be one of {list(SCALE_DTYPES)}; got {scale_dtype}")
    shape = tuple(weight.shape)
    grid = scale_shape(shape, block_size)
    block_rows, block_cols = block_size
    padded = torch.zeros(grid[0] * block_rows, grid[1] * block_cols, dtype=torch.float32)
    padded[: shape[0], : shape[1]] = weight.float()
    amax = padded.reshape(grid[0], block_rows, grid[1], block_cols).abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)).to(scale_dtype)
    # Divide by the scale as stored, so the stored pair dequantizes to the nearest e4m3fn values.
    scaled = weight.float() / _expand_blocks(scale.float(), shape, block_size)
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def dequantize_blocks(
    fp8: torch.Tensor, scale_inv: torch.Tensor, block_size: tuple[int, int] = BLOCK_SIZE, name: str = "weight",
) -> torch.Tensor:
    """``fp8 * scale_inv`` in float32, each scale over its Bn x Bk block (clipped at the edges).

    Args:
        fp8: [N, K] float8_e4m3fn.
        scale_inv: [ceil(N / Bn), ceil(K / Bk)] float32 or bfloat16.
        name: the weight's name, for the error message.

    Returns:
        [N, K] float32.
    """
    check_scale(name, tuple(fp8.shape), tuple(scale_inv.shape), block_size)
    if fp8.dtype != FP8_DTYPE:
        raise ValueError(f"{name}: a block-quantized weight must be {FP8_DTYPE}; got {fp8.dtype}")
    return fp8.float() * _expand_blocks(scale_inv.float(), tuple(fp8.shape), block_size)


def check_scale(
    name: str, weight_shape: tuple[int, ...], scale_shape_: tuple[int, ...] | None, block_size: tuple[int, int] = BLOCK_SIZE,
) -> None:
    """Refuse a quantized weight whose block scales are missing (``scale_shape_`` None) or mis-shaped.

    Raises:
        ValueError: naming the scale tensor, the shape expected from the weight's and what it has.
    """
    if len(weight_shape) != 2:
        raise ValueError(f"{name}: a block-quantized weight must be 2-D; got shape {tuple(weight_shape)}")
    expected = scale_shape(weight_shape, block_size)
    if scale_shape_ is None:
        raise ValueError(
            f"{scale_name(name)}: missing; the FP8 weight {name} {tuple(weight_shape)} needs block scales "
            f"of shape {expected} (blocks {tuple(block_size)})"
        )
    if tuple(scale_shape_) != expected:
        raise ValueError(
            f"{scale_name(name)}: shape must be {expected} for the FP8 weight {name} {tuple(weight_shape)} "
            f"(blocks {tuple(block_size)}); got {tuple(scale_shape_)}"
        )


def check_checkpoint_scales(
    tensors: Mapping[str, tuple[str, tuple[int, ...]]], block_size: tuple[int, int] = BLOCK_SIZE,
) -> None:
    """Refuse a block-FP8 checkpoint whose scales do not match its FP8 weights, before any weight is read.

    Args:
        tensors: every checkpoint tensor's name -> (safetensors dtype name, shape), as the
            shards' headers give them (:func:`read_tensor_headers`).

    Raises:
        ValueError: an FP8 weight without its ``_scale_inv``, a scale of the wrong shape or
            dtype, or a scale without its FP8 weight (naming the tensor, expected and actual).
    """
    for name, (dtype, shape) in tensors.items():
        if dtype == SAFETENSORS_FP8:
            scale = tensors.get(scale_name(name))
            check_scale(name, shape, None if scale is None else scale[1], block_size)
            if scale[0] not in SAFETENSORS_SCALE_DTYPES:
                raise ValueError(
                    f"{scale_name(name)}: dtype must be one of {list(SAFETENSORS_SCALE_DTYPES)}; got {scale[0]}"
                )
        elif is_scale_name(name):
            weight = name[: -len(SCALE_SUFFIX)]
            if tensors.get(weight, (None,))[0] != SAFETENSORS_FP8:
                actual = tensors[weight][0] if weight in tensors else "missing"
                raise ValueError(f"{weight}: must be an {SAFETENSORS_FP8} weight beside its {name}; got {actual}")


def read_tensor_headers(folder) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (safetensors dtype name, shape) of every tensor in the ``*.safetensors`` of ``folder``
    (headers only: no tensor data is read)."""
    import json
    import pathlib
    import struct

    tensors = {}
    for shard in sorted(pathlib.Path(folder).glob("*.safetensors")):
        with open(shard, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                tensors[name] = (entry["dtype"], tuple(entry["shape"]))
    return tensors


def block_size_of(quantization_config: Mapping) -> tuple[int, int]:
    """The ``weight_block_size`` of a block-FP8 ``quantization_config`` (checked by :func:`check_fp8_config`)."""
    return tuple(quantization_config["weight_block_size"])


def check_fp8_config(quantization_config: Mapping) -> None:
    """Refuse an ``fp8`` ``quantization_config`` other than the block-FP8 format described above.

    Raises:
        ValueError: naming the field, what is supported and what was given.
    """
    fmt = quantization_config.get("fmt", SUPPORTED_FMT)
    if fmt != SUPPORTED_FMT:
        raise ValueError(f"quantization_config.fmt must be {SUPPORTED_FMT!r} (float8_e4m3fn weights); got {fmt!r}")
    scheme = quantization_config.get("activation_scheme", SUPPORTED_ACTIVATION_SCHEME)
    if scheme != SUPPORTED_ACTIVATION_SCHEME:
        raise ValueError(
            f"quantization_config.activation_scheme must be {SUPPORTED_ACTIVATION_SCHEME!r} (the checkpoint "
            f"carries no activation scales); got {scheme!r}"
        )
    block = quantization_config.get("weight_block_size")
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ValueError(
            "quantization_config.weight_block_size must be two positive ints (block-FP8, e.g. [128, 128]; "
            f"per-tensor FP8 is not supported); got {block!r}"
        )


#: The ``quant_method`` values of checkpoints the models load (besides unquantized ones).
SUPPORTED_QUANTIZATION = (FP8_METHOD,)


def check_quantization_method(method: str | None) -> None:
    """Refuse a quantization method other than block-FP8 (``None``: an unquantized checkpoint).

    Raises:
        ValueError: naming the method and what is supported.
    """
    if method is not None and method not in SUPPORTED_QUANTIZATION:
        raise ValueError(
            f"quantization {method!r} is not supported by the vllm-gdn-neuron models: they load unquantized "
            f"(bf16 / fp16 / fp32) checkpoints and block-FP8 ones (quant_method {FP8_METHOD!r}, fmt "
            f"{SUPPORTED_FMT!r}, weight_block_size [128, 128]); got quantization={method!r}"
        )


def check_quantized_checkpoint(quantization_config: Mapping | None, method: str | None = None, folder=None) -> None:
    """Refuse, before any weight is read, a quantized checkpoint the models cannot load.

    Args:
        quantization_config: the checkpoint's ``config.json`` ``quantization_config`` (None: unquantized).
        method: the quantization the engine was asked for (vLLM's ``--quantization``, or the
            one it read from the config), None for none.
        folder: the checkpoint folder, when local: its FP8 weights' scales are checked from
            the shards' headers (:func:`check_checkpoint_scales`).

    Raises:
        ValueError: another method than block-FP8 (the config's or ``method``), online
            quantization of an unquantized checkpoint, a block-FP8 config other than the
            published format, or missing / mis-shaped scales (naming the tensor).
    """
    if not quantization_config:
        if method is not None:
            raise ValueError(
                f"quantization={method!r} on an unquantized checkpoint (quantizing while loading) is not supported "
                f"by the vllm-gdn-neuron models; serve it unquantized, or serve a block-FP8 checkpoint "
                f"(quantization_config.quant_method {FP8_METHOD!r})"
            )
        return
    check_quantization_method(quantization_config.get("quant_method", "unknown"))
    check_quantization_method(method)
    check_fp8_config(quantization_config)
    if folder is not None:
        check_checkpoint_scales(read_tensor_headers(folder), block_size_of(quantization_config))


# Where the vLLM plugin records how a block-FP8 checkpoint is served (its ``Fp8Path``), for the model's log line.
FP8_PATH_KEY = "vllm_gdn_neuron_fp8_path"
# Where :func:`hold_dequantized` keeps a block-FP8 checkpoint's quantization_config on the config.
DEQUANTIZED_CONFIG_KEY = "vllm_gdn_neuron_fp8_config"


def hold_dequantized(model_config) -> None:
    """Serve a block-FP8 checkpoint dequantized: its ``quantization_config`` moves from the
    checkpoint's config (and vLLM's view of it, ``model_config`` being vLLM's ``ModelConfig``)
    to ``DEQUANTIZED_CONFIG_KEY``, so vLLM builds unquantized layers in any dtype and a shell's
    loader finds the format there (:func:`held_fp8_config`) to dequantize the weights."""
    hf_config = model_config.hf_config
    setattr(hf_config, DEQUANTIZED_CONFIG_KEY, hf_config.quantization_config)
    for config in {id(c): c for c in (hf_config, model_config.hf_text_config)}.values():
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
    arch_config = getattr(model_config, "model_arch_config", None)  # vLLM 0.32's view of the config
    if arch_config is not None:
        arch_config.quantization_config = None
    if model_config.quantization == FP8_METHOD:
        model_config.quantization = None


def release_held(model_config) -> None:
    """Undo :func:`hold_dequantized`: the ``quantization_config`` goes back where vLLM reads it
    (and ``model_config.quantization`` becomes ``fp8``), so vLLM builds its FP8 layers and the
    weights load as they are stored."""
    hf_config = model_config.hf_config
    quantization_config = held_fp8_config(hf_config)
    if quantization_config is None:
        raise ValueError("release_held: the config holds no block-FP8 quantization_config aside")
    delattr(hf_config, DEQUANTIZED_CONFIG_KEY)
    hf_config.quantization_config = quantization_config
    arch_config = getattr(model_config, "model_arch_config", None)
    if arch_config is not None:
        arch_config.quantization_config = quantization_config
    model_config.quantization = FP8_METHOD


def held_fp8_config(hf_config) -> Mapping | None:
    """The ``quantization_config`` :func:`hold_dequantized` moved aside (None: the weights are not block-FP8)."""
    return getattr(hf_config, DEQUANTIZED_CONFIG_KEY, None)


def dequantized_tensors(
    weights: Iterable[tuple[str, torch.Tensor]], block_size: tuple[int, int] = BLOCK_SIZE,
    dtype: torch.dtype = torch.float32,
) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint's ``(name, tensor)`` stream with every FP8 weight dequantized (:func:`dequantize_blocks`)
    and cast to ``dtype``, its ``_scale_inv`` consumed; other tensors pass through unchanged.

    A weight and its scale may come in either order (the stream holds the first until the
    second arrives).

    Raises:
        ValueError: a weight or scale left unpaired at the end of the stream, or a mis-shaped scale.
    """
    waiting_weights: dict[str, torch.Tensor] = {}
    waiting_scales: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if is_scale_name(name):
            weight_name = name[: -len(SCALE_SUFFIX)]
            if weight_name in waiting_weights:
                fp8 = waiting_weights.pop(weight_name)
                yield weight_name, dequantize_blocks(fp8, tensor, block_size, weight_name).to(dtype)
            else:
                waiting_scales[weight_name] = tensor
        elif tensor.dtype == FP8_DTYPE:
            if name in waiting_scales:
                yield name, dequantize_blocks(tensor, waiting_scales.pop(name), block_size, name).to(dtype)
            else:
                waiting_weights[name] = tensor
        else:
            yield name, tensor
    for name, tensor in waiting_weights.items():
        check_scale(name, tuple(tensor.shape), None, block_size)
    for name in waiting_scales:
        raise ValueError(f"{scale_name(name)}: block scales without their FP8 weight {name}")
