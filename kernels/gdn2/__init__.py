"""GDN-2 (channel-wise gates), apart from what serves: the chunked NKI kernel (``gdn2.py``), its
torch mirror (``gdn2_torch.py``) and its entry points (``launch.py``). Design: ``docs/kernels/gdn2.md``.
"""

from .gdn2 import GDN2, GDN2_CHUNK, gdn2_chunked, gdn2_kernel

__all__ = ["GDN2", "GDN2_CHUNK", "gdn2_chunked", "gdn2_kernel"]
