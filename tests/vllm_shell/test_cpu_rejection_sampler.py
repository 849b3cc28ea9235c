"""The CPU expand kernel of vLLM 0.32's rejection sampler: vLLM's shim loses its output, ours does not.

The rejection sampler divides the target's logits at each draft position by its request's
temperature, spread over the drafts by ``expand_batch_to_tokens``; these tests call it as
the sampler does, on vLLM's CPU platform with vLLM's own kernel overrides registered.
"""

import pytest
import torch

from vllm_gdn_neuron.shells.vllm import cpu_rejection_sampler

# Three requests with 2, 0 and 3 draft tokens; the middle value is the greedy temperature 0.
CU_NUM_TOKENS = torch.tensor([2, 2, 5], dtype=torch.int32)
COUNTS = (2, 0, 3)


def _want(values: list, replace_from, replace_to) -> list:
    return [replace_to if v == replace_from else v for v, n in zip(values, COUNTS) for _ in range(n)]


@pytest.fixture
def vllm_cpu_kernels():
    """vLLM's CPU kernel overrides, as each of its CPU workers registers them (the C++ shims)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM's CPU platform only")
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample import rejection_sampler

    return rejection_sampler


def _expand_into(rejection_sampler, values: torch.Tensor, replace_from, replace_to) -> torch.Tensor:
    """The kernel launch of ``expand_batch_to_tokens``, into an output filled with a marker first."""
    out = torch.full((5,), -7, dtype=values.dtype)
    rejection_sampler.expand_kernel[(3,)](out, values, CU_NUM_TOKENS, replace_from, replace_to, MAX_NUM_TOKENS=128)
    return out


def test_vllm_032s_cpu_shim_leaves_float_and_int32_outputs_unwritten(vllm_cpu_kernels):
    """What :mod:`cpu_rejection_sampler` works around (if this fails, vLLM fixed its shim)."""
    from vllm.utils import cpu_triton_utils

    if getattr(vllm_cpu_kernels.expand_kernel, "func", None) is not cpu_triton_utils._expand_kernel_impl:
        pytest.skip("vLLM's C++ expand shim is not the registered kernel (Triton present, or already replaced)")
    temperatures = torch.tensor([0.7, 0.0, 1.3])
    assert _expand_into(vllm_cpu_kernels, temperatures, 0, 1).tolist() == [-7.0] * 5
    top_k = torch.tensor([5, 0, 7], dtype=torch.int32)
    assert _expand_into(vllm_cpu_kernels, top_k, 0, 0).tolist() == [-7] * 5


@pytest.mark.parametrize("values, replace_from, replace_to", [
    (torch.tensor([0.7, 0.0, 1.3]), 0, 1),                   # temperatures, greedy 0 -> 1
    (torch.tensor([0.9, 1.0, 0.25], dtype=torch.float32), 0, 0),  # top-p
    (torch.tensor([5, 0, 7], dtype=torch.int32), 0, 0),      # top-k
    (torch.tensor([5, 9, 7], dtype=torch.int64), 9, 1),
])
def test_installed_kernel_expands_at_the_callers_dtype(vllm_cpu_kernels, values, replace_from, replace_to):
    cpu_rejection_sampler.install()
    out = _expand_into(vllm_cpu_kernels, values, replace_from, replace_to)
    assert out.dtype == values.dtype
    assert out.tolist() == pytest.approx(_want(values.tolist(), replace_from, replace_to))
    expanded = vllm_cpu_kernels.expand_batch_to_tokens(values, CU_NUM_TOKENS, 5, replace_from, replace_to)
    assert expanded.tolist() == pytest.approx(_want(values.tolist(), replace_from, replace_to))


def test_install_replaces_only_vllms_shim(vllm_cpu_kernels):
    cpu_rejection_sampler.install()
    assert vllm_cpu_kernels.expand_kernel.func is cpu_rejection_sampler.expand_at_dtype
    assert cpu_rejection_sampler.install() is False  # already ours: left as it is


def test_the_plugin_installs_the_kernel_right_after_vllms_cpu_overrides(vllm_cpu_kernels, monkeypatch):
    """``register()`` runs before a worker registers vLLM's CPU shims: the kernel is replaced
    right after that registration."""
    import vllm
    from vllm.platforms import current_platform

    from vllm_gdn_neuron import plugin

    platform_class = type(current_platform)
    monkeypatch.setattr(platform_class, "register_triton_kernel_overrides",
                        platform_class.__dict__["register_triton_kernel_overrides"])
    monkeypatch.setattr(vllm, "__version__", "0.32.0+cpu")
    plugin._install_cpu_patches()
    wrapped = platform_class.__dict__["register_triton_kernel_overrides"]
    plugin._install_cpu_patches()  # once: the registration is wrapped a single time
    assert platform_class.__dict__["register_triton_kernel_overrides"] is wrapped
    current_platform.register_triton_kernel_overrides()
    assert vllm_cpu_kernels.expand_kernel.func is cpu_rejection_sampler.expand_at_dtype


@pytest.mark.parametrize("version, patched", [("0.32.0", True), ("0.32.1+cpu", True), ("0.24.0", False),
                                              ("0.33.0", False)])
def test_the_patch_is_for_the_vllm_releases_it_fixes(version, patched):
    assert cpu_rejection_sampler.needs_patch(version) is patched
