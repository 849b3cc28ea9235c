"""The GatedDeltaNet state page, and the page arithmetic that lets it share vLLM's block pool.

Under the pinned runner (``kv_cache_page_major``) each layer is bound one page-major
tensor: block b of every layer lives inside page b of that layer's view, and vLLM hands
out block ids from one pool shared by the attention and the recurrent groups. A GDN
layer's view is ``[P, page_elems]`` float32; one page holds one sequence's two states
back to back, then padding:

```
page = [ conv state [K, C] | recurrent state [Hv, Dk, Dv] | zeros up to the common page size ]
```

- conv state: the last K raw (pre-conv) inputs of the q | k | v channels, oldest first,
  channel-fast ``[K, C]`` as in the vLLM shell (``model.gdn_cache.gdn_state_shapes``; K
  rows: the one the next token pushes out is kept, so a decode step is one shift + one dot).
  vLLM's own GDN layer and the runner's recurrent layers use ``(K - 1, C)`` ("SD"); the
  runner does not look inside the page, so only the declared shapes must agree with this
  layout, and they do. :meth:`GDNPageLayout.split` hands the ops (and the NKI kernels) the
  rows' conv states as contiguous ``[N, C, K]``, :meth:`GDNPageLayout.join` stores them back.
  The conv state is carried in float32 columns (a page-major view has one dtype); a bf16
  input is exact in float32, so nothing is rounded.
- recurrent state: float32, K-major ``[Hv, Dk, Dv]``.

Shared allocations: the runner allocates one int8 buffer per vLLM ``KVCacheTensor`` and
hands one layer of every cache group a dtype view of it (in bf16 an attention layer's
``[P, 2, Hkv, B, D]`` bf16 view and GDN layers' ``[P, E]`` float32 views of the same bytes).
aot_autograd refuses in-place writes into graph inputs that are views of one another in
different dtypes, so a layer keeps the allocation itself (:class:`BoundPages`) and takes its
view inside the traced step: every write is then into one graph input per allocation, in
program order.

Page unification (vLLM's hybrid planner, ``Platform._align_hybrid_block_size``): every
group's page must have one size. With ``a`` bytes of attention KV per token
(``2 * Hkv * D * itemsize``), ``s`` bytes of GDN state per sequence and the attention
kernel's block alignment ``m``, the attention block size becomes
``m * ceil(s / (m * a))`` tokens and the state page is padded to ``block_size * a`` bytes:
:func:`hybrid_block_size`, :func:`padded_state_page_elems`.
"""

import math
from dataclasses import dataclass

import torch

from vllm_gdn_neuron.model.gdn_cache import conv_state_view, gdn_state_shapes

STATE_DTYPE = torch.float32


@dataclass(frozen=True)
class GDNPageLayout:
    """Offsets of the two states inside one float32 page row.

    Attributes:
        conv_shape: ``(K, C)`` (channel-fast storage).
        ssm_shape: ``(Hv, Dk, Dv)``.
    """

    conv_shape: tuple[int, int]
    ssm_shape: tuple[int, int, int]

    @classmethod
    def from_config(cls, text_config, tp_size: int = 1) -> "GDNPageLayout":
        return cls(*gdn_state_shapes(text_config, tp_size))

    @property
    def conv_elems(self) -> int:
        return math.prod(self.conv_shape)

    @property
    def state_elems(self) -> int:
        """float32 elements the two states need (the page may be padded beyond)."""
        return self.conv_elems + math.prod(self.ssm_shape)

    @property
    def state_bytes(self) -> int:
        return self.state_elems * STATE_DTYPE.itemsize

    def check_pages(self, name: str, pages: torch.Tensor) -> None:
        """Refuse a bound view that is not ``[P, >= state_elems]`` float32."""
        if pages.dim() != 2 or pages.dtype != STATE_DTYPE or pages.shape[1] < self.state_elems:
            raise ValueError(
                f"{name}: state pages must be [P, >= {self.state_elems}] float32 "
                f"({self.conv_shape} conv + {self.ssm_shape} recurrent); got {tuple(pages.shape)} {pages.dtype}"
            )

    def split(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[N, page_elems]`` rows -> contiguous ``conv [N, C, K]`` and ``ssm [N, Hv, Dk, Dv]``."""
        n = rows.shape[0]
        conv = conv_state_view(rows[:, : self.conv_elems].reshape(n, *self.conv_shape)).contiguous()
        ssm = rows[:, self.conv_elems : self.state_elems].reshape(n, *self.ssm_shape).contiguous()
        return conv, ssm

    def join(self, conv: torch.Tensor, ssm: torch.Tensor, page_elems: int) -> torch.Tensor:
        """The inverse of :meth:`split` (``conv [N, C, K]`` stored ``[K, C]``): whole ``[N, page_elems]``
        float32 rows, zero-padded."""
        n = conv.shape[0]
        parts = [conv.transpose(1, 2).reshape(n, -1).to(STATE_DTYPE), ssm.reshape(n, -1).to(STATE_DTYPE)]
        if page_elems > self.state_elems:
            parts.append(conv.new_zeros(n, page_elems - self.state_elems, dtype=STATE_DTYPE))
        return torch.cat(parts, dim=1)


class BoundPages:
    """A layer's page-major view, held as an int8 view of the whole allocation plus its own dtype and shape.

    Made by :func:`bind_allocations`, which gives every layer bound to one allocation the same
    ``root`` tensor (the one graph input of that allocation).
    """

    def __init__(self, root: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self.root = root
        self.dtype = dtype
        self.shape = shape

    def view(self) -> torch.Tensor:
        """The layer's pages, re-derived from the allocation (call inside the traced step)."""
        # (-1, itemsize) first: torch-mlir lowers a narrow-to-wide dtype view only over a last
        # dimension of the size ratio.
        return self.root.view(-1, self.dtype.itemsize).view(self.dtype).view(self.shape)


def bind_allocations(caches: dict[str, torch.Tensor]) -> dict[str, BoundPages]:
    """One :class:`BoundPages` per layer, layers of one allocation sharing one int8 ``root``.

    Args:
        caches: layer name -> the page-major view the runner bound. Each must be contiguous,
            start at byte 0 of its storage and cover all of it (the runner's views do: a
            ``raw.view(dtype).view(pages, ...)`` of a whole buffer). A dtype view of another
            element size has no ``_base``, so allocations are told apart by their storage.
    """
    roots: dict[int, torch.Tensor] = {}
    bound = {}
    for name, pages in caches.items():
        nbytes = pages.untyped_storage().nbytes()
        if not pages.is_contiguous() or pages.storage_offset() != 0 or pages.numel() * pages.element_size() != nbytes:
            raise ValueError(
                f"{name}: the bound pages must be a contiguous view of a whole allocation; got "
                f"{tuple(pages.shape)} {pages.dtype} at element offset {pages.storage_offset()} of a "
                f"{nbytes}-byte allocation"
            )
        key = pages.untyped_storage().data_ptr()
        if key not in roots:
            roots[key] = pages.reshape(-1).view(torch.int8)
        bound[name] = BoundPages(roots[key], pages.dtype, tuple(pages.shape))
    return bound


def attention_bytes_per_token(num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """K and V bytes one token takes in one attention layer's page."""
    return 2 * num_kv_heads * head_dim * dtype.itemsize


def hybrid_block_size(attention_token_bytes: int, state_page_bytes: int, alignment: int) -> int:
    """The smallest ``alignment`` multiple of tokens whose attention page holds a state page."""
    return alignment * math.ceil(state_page_bytes / (alignment * attention_token_bytes))


def padded_state_page_elems(block_size: int, attention_token_bytes: int) -> int:
    """float32 elements of a state page padded to the attention page of ``block_size`` tokens."""
    page_bytes = block_size * attention_token_bytes
    if page_bytes % STATE_DTYPE.itemsize:
        raise ValueError(f"an attention page of {page_bytes} bytes is not a whole number of float32 elements")
    return page_bytes // STATE_DTYPE.itemsize
