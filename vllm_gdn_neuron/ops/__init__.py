"""The public GDN op surface; validates inputs and dispatches to a backend.

``backend="auto"`` takes ``$VLLM_GDN_BACKEND`` when set, else ``nki`` on a Neuron device,
else ``torch``. Backends and their contract: ``vllm_gdn_neuron.ops.backends``.
"""

from .conv1d import conv1d_decode, conv1d_prefill
from .gdn import gdn2_prefill, gdn_decode, gdn_prefill
from .validation import PAD_SLOT_ID

__all__ = ["PAD_SLOT_ID", "conv1d_decode", "conv1d_prefill", "gdn2_prefill", "gdn_decode", "gdn_prefill"]
