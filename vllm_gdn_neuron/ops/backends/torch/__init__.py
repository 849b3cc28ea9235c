"""The torch backend: runs on any torch device; float32 math whatever the input dtype.

Implements the contract of ``vllm_gdn_neuron.ops.backends`` in full.
"""

from .chunked import gdn_prefill
from .conv1d import conv1d_decode, conv1d_prefill
from .recurrent import gdn_decode


def is_available():
    return True


__all__ = ["conv1d_decode", "conv1d_prefill", "gdn_decode", "gdn_prefill", "is_available"]
