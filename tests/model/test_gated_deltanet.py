"""The shared GatedDeltaNet mixer on one mixed step (decodes, then prefills) against the float64 references.

One step: two decode rows, then three prefill sequences (a one-token prompt, a new
37-token prompt, a 9-token chunk continuing a cached prompt), then padding tokens; the
cache holds stale values everywhere, NaNs on the fresh sequence's page. The layer's phases
resolved with ``VLLM_GDN_BACKEND=torch`` and with ``auto`` (this CPU's choice) both run. The reference
runs each sequence token by token in float64 (``kernels/reference``) from the states the
cache held; the mixer's outputs and the pages it leaves must match, and no other page
may change.
"""

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.kernels import reference
from vllm_gdn_neuron.model.gated_deltanet import GDNCaches, GDNDims, gdn_mix
from vllm_gdn_neuron.model.gdn_cache import conv_state_view
from vllm_gdn_neuron.ops.auto import ConvShape, GdnShape
from vllm_gdn_neuron.ops.gating import gdn_gates
from vllm_gdn_neuron.ops.phases import resolve_phases

TOLERANCE = {torch.float32: dict(rtol=2e-4, atol=2e-4), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


def _reference(dims, x, a, b, weight, A_log, dt_bias, conv0, ssm0, bounds):
    """Per sequence: conv (K-wide state) then the gated delta rule, both float64, token by token."""
    outs, convs, ssms = [], [], []
    for (start, stop), conv_state, ssm_state in zip(bounds, conv0, ssm0):
        y, conv_final = reference.causal_conv1d(x[start:stop], weight, initial_state=conv_state[None])
        q, k, v = dims.split_heads(y)
        g, beta = reference.qwen35_gating(a[start:stop], b[start:stop], A_log, dt_bias)
        o, ssm_final = reference.gdn_recurrence(q, k, v, g, beta, initial_state=ssm_state[None], use_qk_l2norm=True)
        outs.append(o)
        convs.append(conv_final[0])
        ssms.append(ssm_final[0])
    return torch.cat(outs), convs, ssms


@pytest.mark.parametrize("backend", ["torch", "auto"])
@pytest.mark.parametrize(("dtype", "ssm_dtype"), [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                                  (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize(("hk", "hv", "dk", "dv"), [(2, 4, 8, 6), (1, 3, 6, 8), (2, 2, 8, 8)])
def test_mixed_decode_and_prefill_step_matches_the_float64_references(monkeypatch, backend, dtype, ssm_dtype, hk, hv, dk, dv):
    torch.manual_seed(0)
    dims = GDNDims(hk, hv, dk, dv, conv_kernel=4)
    channels, pages = dims.conv_dim, 10
    weight = (0.5 * torch.randn(channels, 4)).to(dtype)
    A_log, dt_bias = torch.randn(hv) * 0.5 + 1.0, torch.randn(hv)  # strongly decaying heads included
    conv_cache = conv_state_view(torch.randn(pages, 4, channels))  # the shells' pages: [P, K, C]
    ssm_cache = (0.3 * torch.randn(pages, hv, dk, dv)).to(ssm_dtype)  # bf16: --mamba-ssm-cache-dtype

    decode_pages = [3, 8]
    prefill_pages, has_state, lengths = [1, 6, 4], [False, False, True], [1, 37, 9]
    conv_cache[6] = float("nan")  # a recycled page: the new sequence must not read it
    ssm_cache[6] = float("nan")
    num_prefill, padding = sum(lengths) + 3, 5  # the prefill part is bucket-padded too
    tokens = len(decode_pages) + num_prefill + padding
    x = torch.randn(tokens, channels).to(dtype)
    a, b = torch.randn(tokens, hv).to(dtype), torch.randn(tokens, hv).to(dtype)

    qsl = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    decode = ops.DecodeStep.build(torch.tensor(decode_pages))
    prefill = ops.PrefillStep.build(qsl, torch.tensor(prefill_pages), torch.tensor(has_state), num_prefill)
    conv_before, ssm_before = conv_cache.clone(), ssm_cache.clone()
    caches = GDNCaches(conv=conv_cache, ssm=ssm_cache)
    monkeypatch.setenv("VLLM_GDN_BACKEND", backend)
    phases = resolve_phases(GdnShape(dtype, hk, hv, dk, dv, dk ** -0.5, ssm_dtype),
                            ConvShape(dtype, dtype, conv_cache.dtype, channels, 4, "silu"), "cpu")
    core = gdn_mix(dims, x, a, b, weight, A_log, dt_bias, caches, decode, prefill, phases=phases)

    # reference, sequence by sequence
    n_dec = len(decode_pages)
    seq_pages = decode_pages + prefill_pages
    bounds = [(i, i + 1) for i in range(n_dec)] + [(n_dec + s, n_dec + e) for s, e in zip(qsl[:-1].tolist(), qsl[1:].tolist())]
    fresh = [False] * n_dec + [not h for h in has_state]
    conv0 = [torch.zeros(channels, 4) if f else conv_before[p] for p, f in zip(seq_pages, fresh)]
    ssm0 = [torch.zeros(hv, dk, dv) if f else ssm_before[p] for p, f in zip(seq_pages, fresh)]
    want, conv_want, ssm_want = _reference(dims, x, a, b, weight, A_log, dt_bias, conv0, ssm0, bounds)

    real = n_dec + sum(lengths)
    tolerance = TOLERANCE[torch.bfloat16 if torch.bfloat16 in (dtype, ssm_dtype) else torch.float32]
    torch.testing.assert_close(core[:real].double(), want, **tolerance)
    assert torch.count_nonzero(core[real:]) == 0  # prefill padding and the tokens past the step
    for page, conv_state, ssm_state in zip(seq_pages, conv_want, ssm_want):
        torch.testing.assert_close(conv_cache[page].double(), conv_state, **tolerance)
        torch.testing.assert_close(ssm_cache[page].double(), ssm_state, **tolerance)
    untouched = [p for p in range(pages) if p not in seq_pages]
    torch.testing.assert_close(conv_cache[untouched], conv_before[untouched], rtol=0, atol=0)
    torch.testing.assert_close(ssm_cache[untouched], ssm_before[untouched], rtol=0, atol=0)


def test_gates_match_the_reference_gating():
    torch.manual_seed(1)
    a, b = 4 * torch.randn(9, 3), torch.randn(9, 3)
    A_log, dt_bias = torch.randn(3), torch.randn(3)
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    g_ref, beta_ref = reference.qwen35_gating(a, b, A_log, dt_bias)
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(beta.double(), beta_ref, rtol=1e-6, atol=1e-7)
    assert (g <= 0).all()
