"""The public GDN op surface; validates inputs and dispatches to a backend.

``backend="auto"`` takes ``$VLLM_GDN_BACKEND`` when set, else ``nki`` on a Neuron device,
else on the CPU the backend ``vllm_gdn_neuron.ops.auto`` chose for the call's phase and shape,
else ``torch``. Backends and their contract: ``vllm_gdn_neuron.ops.backends``; a serving
layer's paged ops, resolved once per phase: ``vllm_gdn_neuron.ops.phases``.

The paged ops (``paged_*``) are the trace-safe engine-step path: they read and write page-major
caches themselves from a ``DecodeStep`` / ``PrefillStep`` / ``VerifyStep`` built once per step,
whose values ``check_step`` validates on the host once per step.
"""

from .conv1d import conv1d_decode, conv1d_prefill
from .gdn import gdn_decode, gdn_prefill
from .paged import (
    paged_conv1d_decode,
    paged_conv1d_prefill,
    paged_conv1d_verify,
    paged_gdn_decode,
    paged_gdn_prefill,
    paged_gdn_verify,
)
from .step import DecodeStep, PrefillStep, VerifyStep
from .step_checks import check_step
from .validation import PAD_SLOT_ID

__all__ = [
    "PAD_SLOT_ID",
    "DecodeStep",
    "PrefillStep",
    "VerifyStep",
    "check_step",
    "conv1d_decode",
    "conv1d_prefill",
    "gdn_decode",
    "gdn_prefill",
    "paged_conv1d_decode",
    "paged_conv1d_prefill",
    "paged_conv1d_verify",
    "paged_gdn_decode",
    "paged_gdn_prefill",
    "paged_gdn_verify",
]
