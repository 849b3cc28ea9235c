"""A dtype-preserving CPU stand-in for the expand kernel of vLLM 0.32's rejection sampler.

Speculative decoding with sampling: vLLM's rejection sampler spreads each request's
temperature (and top-k, top-p) over the request's draft tokens with the Triton kernel
``vllm.v1.sample.rejection_sampler.expand_kernel``, then divides the target's logits at the
draft positions by it. Without Triton (vLLM's CPU platform) vLLM 0.32 swaps in a C++ shim,
``vllm.utils.cpu_triton_utils._expand_kernel_impl``, that first converts the output tensor
and the input to int64. For the float32 temperatures (and the int32 top-k) the rejection
sampler passes, the C++ kernel fills the converted copies, and the tensor the sampler reads
keeps whatever the allocator left in it (a float temperature would be truncated, 0.7 to 0,
besides). Each sampled request with drafts then has its drafts accepted, and its rejected
drafts replaced, from target probabilities at a temperature nobody asked for: the tokens
do not follow the target's distribution. Greedy requests never call the kernel.

:func:`install` replaces that one shim with :func:`expand_at_dtype` (the Triton kernel's
semantics at the caller's dtype); Triton's own kernel, or any other override, stays. The
plugin's ``register()`` calls :func:`install_after_platform_overrides` on vLLM's CPU platform
for the vLLM releases in :data:`PATCHED_VLLM`: vLLM registers its CPU shims after it loads the
plugins, so the replacement follows that registration.
"""

import torch

from vllm.logger import init_logger

logger = init_logger(f"vllm.plugins.{__name__}")

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
#: The vLLM releases (``major.minor``) whose CPU expand shim loses its output.
PATCHED_VLLM = ("0.32",)


def needs_patch(vllm_version: str) -> bool:
    """Whether ``vllm_version`` (``0.32.0``, ``0.32.1+cpu``, ...) is one of :data:`PATCHED_VLLM`."""
    return ".".join(vllm_version.split("+")[0].split(".")[:2]) in PATCHED_VLLM


def expand_at_dtype(output_ptr: torch.Tensor, input_ptr: torch.Tensor, cu_num_tokens_ptr: torch.Tensor,
                    replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:
    """Write request r's ``input_ptr[r]`` (``replace_to`` where it equals ``replace_from``) to its
    tokens ``output_ptr[cu_num_tokens[r - 1]:cu_num_tokens[r]]``, in the tensors' own dtype.

    Dimensions:
        R: requests; T: tokens (``output_ptr``'s length, at least ``cu_num_tokens[-1]``).

    Args:
        output_ptr: ``[T]`` any dtype; its first ``cu_num_tokens[-1]`` entries are written.
        input_ptr: ``[R]``, output_ptr's dtype.
        cu_num_tokens_ptr: ``[R]`` int32 / int64, the cumulative token counts (no leading 0).
        replace_from, replace_to: Python numbers; the comparison is made at the input's dtype.
        MAX_NUM_TOKENS: the Triton kernel's block size; unused.
    """
    counts = torch.diff(cu_num_tokens_ptr.to(torch.int64), prepend=cu_num_tokens_ptr.new_zeros(1, dtype=torch.int64))
    values = torch.where(input_ptr == replace_from, torch.full_like(input_ptr, replace_to), input_ptr)
    expanded = values.repeat_interleave(counts)
    output_ptr[: expanded.shape[0]].copy_(expanded)


def install() -> bool:
    """Replace vLLM 0.32's CPU expand shim with :func:`expand_at_dtype` in this process, once.

    Call it after vLLM registered its CPU kernel overrides. Returns whether the shim was
    found and replaced.
    """
    from vllm.triton_utils.dispatcher import register_kernels
    from vllm.utils import cpu_triton_utils
    from vllm.v1.sample import rejection_sampler

    current = getattr(rejection_sampler.expand_kernel, "func", None)
    if current is not cpu_triton_utils._expand_kernel_impl:
        return False
    register_kernels({KERNEL: expand_at_dtype})
    logger.info("vllm-gdn-neuron: the rejection sampler expands through a dtype-preserving CPU kernel "
                "(vLLM 0.32's C++ shim leaves its per-token temperatures unwritten)")
    return True


def install_after_platform_overrides() -> None:
    """Make vLLM's CPU platform run :func:`install` right after it registers its kernel
    overrides (this process, once).

    A worker loads the plugins, then registers the platform's overrides (the shim among
    them), then builds the model: the shim is replaced there, before any step samples.
    Imports nothing beyond vLLM's platform (``register()`` runs in every vLLM process).
    """
    from vllm.platforms import current_platform

    platform_class = type(current_platform)
    register_overrides = getattr(platform_class, "register_triton_kernel_overrides", None)
    if register_overrides is None:  # a platform that registers no kernel overrides has no shim to replace
        return
    if getattr(register_overrides, "installs_cpu_expand_kernel", False):
        return

    def register_then_install(cls) -> None:
        register_overrides()
        install()

    register_then_install.installs_cpu_expand_kernel = True
    platform_class.register_triton_kernel_overrides = classmethod(register_then_install)
