"""Every NKI kernel compiled by the real NKI and run on a Neuron device, against the float64
references. Skipped (with the reason) without ``/dev/neuron0`` and an importable Neuron SDK.

The tensors go to the device torch-neuronx exposes (``"neuron"``, or torch-xla's device on
older SDKs): which one a given SDK uses is not verified here.
"""

import os

import pytest
import torch

from vllm_gdn_neuron.kernels import adapter, nki_compat
from vllm_gdn_neuron.kernels.gdn2 import launch as gdn2_launch
from vllm_gdn_neuron.kernels.reference import causal_conv1d, causal_conv1d_step, gdn2_recurrence, gdn_recurrence

from .kernel_testing import assert_close, gdn_inputs, random_state, reference_cte


def _why_not():
    if not os.path.exists("/dev/neuron0"):
        return "no Neuron device (/dev/neuron0 is absent)"
    if nki_compat.using_interpreter:
        return "the Neuron SDK's nki is not importable (or VLLM_GDN_NKI_INTERPRET=1): kernels would run interpreted"
    return None


pytestmark = [pytest.mark.neuron, pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")]
SCALE = 16**-0.5


@pytest.fixture(scope="module")
def device():
    try:
        return torch.device("neuron")
    except RuntimeError:
        import torch_xla.core.xla_model as xm

        return xm.xla_device()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hk, hv", [(1, 1), (1, 4)])
def test_gdn_prefill(device, dtype, hk, hv):
    inputs = gdn_inputs(2, hk, hv, 256, 32, 16, dtype, seed=1)
    cache = random_state(3, hv, 32, 16)
    ref_out, ref_state = reference_cte(*inputs, SCALE, initial_state=cache[[2, 0]])
    on_device = cache.to(device)
    out = adapter.gdn_prefill(*(x.to(device) for x in inputs), on_device, torch.tensor([2, 0], device=device), SCALE)
    assert_close(out.cpu(), ref_out, dtype, "out")
    assert_close(on_device.cpu()[[2, 0]], ref_state, dtype, "state")


def test_gdn_cte_neumann(device):
    from vllm_gdn_neuron.kernels.gdn_cte import gdn_cte

    inputs = gdn_inputs(1, 2, 2, 128, 32, 32, torch.float32, seed=2)
    out, state = gdn_cte(*(x.to(device) for x in inputs), scale=SCALE, algorithm="neumann")
    ref_out, ref_state = reference_cte(*inputs, SCALE)
    assert_close(out.cpu(), ref_out, torch.float32, "out")
    assert_close(state.cpu(), ref_state, torch.float32, "state")


def test_gdn_decode(device):
    gen = torch.Generator().manual_seed(3)
    q = torch.nn.functional.normalize(torch.randn(3, 1, 16, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(3, 1, 16, generator=gen), dim=-1)
    v, g, beta = torch.randn(3, 2, 16, generator=gen), -torch.rand(3, 2, generator=gen), torch.rand(3, 2, generator=gen)
    cache = random_state(4, 2, 16, 16)
    ref_o, ref_state = gdn_recurrence(q, k, v, g, beta, cu_seqlens=[0, 1, 2, 3], initial_state=cache[[3, 0, 1]],
                                      scale=SCALE)
    on_device = cache.to(device)
    o = adapter.gdn_decode(*(x.to(device) for x in (q, k, v, g, beta)), on_device,
                           torch.tensor([3, 0, 1], device=device), SCALE)
    assert_close(o.cpu(), ref_o, torch.float32, "o")
    assert_close(on_device.cpu()[[3, 0, 1]], ref_state, torch.float32, "state")


def test_conv1d_prefill_and_decode(device):
    gen = torch.Generator().manual_seed(4)
    x, weight = torch.randn(2, 256, 40, generator=gen), torch.randn(256, 4, generator=gen)
    cache = torch.randn(3, 256, 4, generator=gen)
    lengths = [40, 3]
    ref = [causal_conv1d(x[b, :, :n].T, weight, initial_state=cache[s:s + 1]) for b, (s, n) in
           enumerate(zip([1, 2], lengths))]
    on_device = cache.to(device)
    y = adapter.conv1d_prefill(x.to(device), weight.to(device), on_device, torch.tensor([1, 2], device=device),
                               torch.tensor(lengths, device=device)).cpu()
    for b, n in enumerate(lengths):
        assert_close(y[b, :, :n].T, ref[b][0], torch.float32, f"y {b}")
        assert_close(on_device.cpu()[[1, 2][b]], ref[b][1][0], torch.float32, f"state {b}")
    step = torch.randn(2, 256, generator=gen)
    before = on_device.cpu()
    ref_y, ref_state = causal_conv1d_step(step, weight, before[[0, 2]])
    y = adapter.conv1d_decode(step.to(device), weight.to(device), on_device, torch.tensor([0, 2], device=device))
    assert_close(y.cpu(), ref_y, torch.float32, "decode y")
    assert_close(on_device.cpu()[[0, 2]], ref_state, torch.float32, "decode state")


def test_gdn2(device):
    gen = torch.Generator().manual_seed(5)
    t = 70
    q = torch.nn.functional.normalize(torch.randn(t, 1, 16, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(t, 1, 16, generator=gen), dim=-1)
    v = torch.randn(t, 2, 8, generator=gen)
    g, beta = -torch.rand(t, 2, 16, generator=gen), torch.rand(t, 2, 16, generator=gen)
    ref_o, ref_state = gdn2_recurrence(q, k, v, g, beta, cu_seqlens=[0, 3, t], scale=SCALE)
    o, state = gdn2_launch.gdn2_prefill(*(x.to(device) for x in (q, k, v, g, beta)), None, [0, 3, t], None, SCALE)
    assert_close(o.cpu(), ref_o, torch.float32, "o")
    assert_close(state.cpu(), ref_state, torch.float32, "state")
