"""FP8 weights kept on the device (opt-in: ``neuron_config.quantization: "fp8"``).

A block-FP8 checkpoint (:mod:`vllm_gdn_neuron.model.fp8`) is always dequantized on the
host as it loads (:mod:`.weights`). With ``neuron_config.quantization`` set to
:data:`FP8_ON_DEVICE`, the projections and experts the checkpoint stored in FP8 are then
requantized, each rank's own share, to one scale per output row (per channel) in the
device's e4m3 range, and kept in HBM as FP8 beside their float32 scales; every other
parameter stays in the model dtype.

Why per output row, not the checkpoint's 128 x 128 blocks: a row's scale multiplies the
matmul's output column, ``x @ (q * s)^T = (x @ q^T) * s``, so the graph converts the FP8
weight to the activation dtype right before the matmul and scales the product (one
``[T, N]`` multiply, no ``[N, K]`` one); and a rank's shard of any split takes whole rows
or whole columns of it, whatever the shard's size against a 128-block. NxDI's own native
FP8 is this per-channel symmetric e4m3 form; it dequantizes block-FP8 checkpoints on load.

The e4m3 range: trn2's FP8 e4m3 tops out at 240 (the IEEE-style e4m3 with infinities,
exponent 15 reserved), not ``float8_e4m3fn``'s 448. Values of magnitude at most 240 have
the same bits in both formats, so the weights are stored as ``torch.float8_e4m3fn``
clipped to +-:data:`DEVICE_FP8_MAX`, and the scales map each row's largest magnitude to 240.

The matmul itself is the model dtype's (weight-only FP8: the weight bytes read per step
halve against bf16; TensorE's FP8 rate, which needs FP8 activations too, is not used).
Unverified on a device: what neuronx-cc makes of the convert-then-matmul (fused into the
matmul's weight load or a separate pass over the weight) is a compiler question.

Dimensions:
    N, K: a projection's output and input features (this rank's share); E experts; T tokens.
"""

import torch
from torch import nn
import torch.nn.functional as F

from vllm_gdn_neuron.model.fp8 import FP8_DTYPE

# The ``neuron_config.quantization`` value that keeps the checkpoint's FP8 projections on the device.
FP8_ON_DEVICE = "fp8"
# trn2's largest e4m3 magnitude (IEEE-style e4m3: 1.75 * 2 ** 7).
DEVICE_FP8_MAX = 240.0

# Module names below a layer whose weights a block-FP8 checkpoint stores in FP8, as this shell
# merges them (:mod:`vllm_gdn_neuron.model.parameters`).
FP8_LINEARS = ("linear_attn.in_proj_qkvz", "linear_attn.out_proj", "self_attn.qkv_proj", "self_attn.o_proj",
               "mlp.gate_up_proj", "mlp.down_proj", "shared_expert.gate_up_proj", "shared_expert.down_proj")
FP8_EXPERTS = "mlp.experts"


def quantize_rows(weight: torch.Tensor, fp8_max: float = DEVICE_FP8_MAX) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row FP8: ``weight ~= fp8 * scale[..., None]``.

    Args:
        weight: ``[..., N, K]`` float.
        fp8_max: the largest FP8 magnitude used (a row's largest magnitude maps to it).

    Returns:
        ``(fp8 [..., N, K] float8_e4m3fn with |fp8| <= fp8_max, scale [..., N] float32)``; an
        all-zero row gets scale 1.
    """
    if weight.dim() < 2:
        raise ValueError(f"weight must be at least 2-D [..., N, K]; got shape {tuple(weight.shape)}")
    if not 0 < fp8_max <= torch.finfo(FP8_DTYPE).max:
        raise ValueError(f"fp8_max must be in (0, {torch.finfo(FP8_DTYPE).max}]; got {fp8_max}")
    w = weight.float()
    amax = w.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / fp8_max, torch.ones_like(amax))
    fp8 = (w / scale.unsqueeze(-1)).clamp(-fp8_max, fp8_max).to(FP8_DTYPE)
    return fp8, scale


def dequantize_rows(fp8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``fp8 * scale[..., None]`` in ``dtype`` (the weights a :class:`Fp8Linear` computes with, up to rounding)."""
    return (fp8.float() * scale.float().unsqueeze(-1)).to(dtype)


class Fp8Linear(nn.Module):
    """A bias-free linear layer with FP8 weights and one float32 scale per output row.

    Parameters: ``weight [N, K]`` float8_e4m3fn, ``weight_scale [N]`` float32 (not trained).
    ``forward`` converts the weight to the input's dtype right before the matmul and scales
    the product's columns.
    """

    def __init__(self, fp8: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        if fp8.dtype != FP8_DTYPE or fp8.dim() != 2 or tuple(scale.shape) != (fp8.shape[0],):
            raise ValueError(f"Fp8Linear takes a 2-D {FP8_DTYPE} weight [N, K] and a [N] scale; got "
                             f"{fp8.dtype} {tuple(fp8.shape)} and {tuple(scale.shape)}")
        self.weight = nn.Parameter(fp8, requires_grad=False)
        self.weight_scale = nn.Parameter(scale.float(), requires_grad=False)

    @classmethod
    def of(cls, linear: nn.Linear) -> "Fp8Linear":
        """The FP8 form of a bias-free ``nn.Linear`` (its weight requantized by :func:`quantize_rows`)."""
        if linear.bias is not None:
            raise ValueError("Fp8Linear.of takes a bias-free nn.Linear")
        return cls(*quantize_rows(linear.weight.data))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., K] -> [..., N]`` in x's dtype."""
        return F.linear(x, self.weight.to(x.dtype)) * self.weight_scale.to(x.dtype)


class Fp8ExpertStack:
    """One stacked expert weight ``[E, N, K]`` in FP8 with its ``[E, N]`` scales, read as the routed
    experts read a stacked tensor: ``shape`` and ``index_select(0, experts)``, which gathers the
    chosen experts' FP8 rows and scales and returns them dequantized in ``dtype`` (the experts
    not chosen are never converted).
    """

    def __init__(self, fp8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> None:
        self.fp8, self.scale, self.dtype = fp8, scale, dtype

    @property
    def shape(self) -> torch.Size:
        return self.fp8.shape

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        if dim != 0:
            raise ValueError(f"Fp8ExpertStack.index_select gathers experts (dim 0); got dim {dim}")
        fp8 = self.fp8.index_select(0, index).to(self.dtype)
        return fp8 * self.scale.index_select(0, index).to(self.dtype).unsqueeze(-1)


class Fp8Experts(nn.Module):
    """The routed experts in FP8: ``gate_up_proj [E, 2 * I / tp, H]`` and ``down_proj [E, H, I / tp]``
    float8_e4m3fn, ``gate_up_proj_scale [E, 2 * I / tp]`` and ``down_proj_scale [E, H]`` float32.

    :meth:`stacks` gives the two as :class:`Fp8ExpertStack` for
    :func:`vllm_gdn_neuron.model.routed_experts.routed_expert_mixture`.
    """

    def __init__(self, experts: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        for name in ("gate_up_proj", "down_proj"):
            fp8, scale = quantize_rows(getattr(experts, name).data)
            setattr(self, name, nn.Parameter(fp8, requires_grad=False))
            setattr(self, f"{name}_scale", nn.Parameter(scale, requires_grad=False))

    def stacks(self) -> tuple[Fp8ExpertStack, Fp8ExpertStack]:
        return (Fp8ExpertStack(self.gate_up_proj, self.gate_up_proj_scale, self.dtype),
                Fp8ExpertStack(self.down_proj, self.down_proj_scale, self.dtype))


def keep_fp8_on_device(model: nn.Module, fp8_params: set[str]) -> list[str]:
    """Requantize, in place, the projections and experts loaded from FP8 checkpoint tensors.

    A module of :data:`FP8_LINEARS` (or the experts) is converted when every checkpoint
    tensor written into its weight was FP8 (``fp8_params``: the parameter names the
    loader wrote from FP8 tensors only); a module the checkpoint kept in bf16
    (``modules_to_not_convert``) stays as it is.

    Returns:
        The converted modules' names.
    """
    converted = []
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and name.endswith(FP8_LINEARS) and f"{name}.weight" in fp8_params:
            replacement = Fp8Linear.of(module)
        elif name.endswith(FP8_EXPERTS) and {f"{name}.gate_up_proj", f"{name}.down_proj"} <= fp8_params:
            replacement = Fp8Experts(module, module.gate_up_proj.dtype)
        else:
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, replacement)
        converted.append(name)
    return converted
