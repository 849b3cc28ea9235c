"""Shared helpers of the NKI kernel tests: inputs in the kernels' layouts, the float64 oracle
(``vllm_gdn_neuron.kernels.reference``) in those layouts, and the project's tolerances."""

import torch

from vllm_gdn_neuron.kernels.reference import gdn_recurrence, l2norm, tolerance

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def unit_rows(shape, generator, correlated=False):
    """Random rows of unit L2 norm; ``correlated`` makes all rows near-copies of the first."""
    x = torch.randn(*shape, generator=generator)
    if correlated:
        x = x[..., :1, :] + 0.1 * x
    return l2norm(x).float()


def gdn_inputs(b, hk, hv, s, dk, dv, dtype, g_min=-20.0, correlated=False, seed=0):
    """``(query, key, value, g_log, beta)`` in the gdn_cte layout; q/k/v already in ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    query = unit_rows((b, hk, s, dk), gen).to(dtype)
    key = unit_rows((b, hk, s, dk), gen, correlated).to(dtype)
    value = torch.randn(b, hv, s, dv, generator=gen).to(dtype)
    g_log = torch.rand(b, hv, s, generator=gen) * g_min
    beta = torch.rand(b, hv, s, generator=gen)
    return query, key, value, g_log, beta


def random_state(b, hv, dk, dv, seed=1):
    return torch.randn(b, hv, dk, dv, generator=torch.Generator().manual_seed(seed))


def reference_cte(query, key, value, g_log, beta, scale, initial_state=None, use_qk_l2norm=False):
    """The float64 recurrence on gdn_cte-layout inputs: ``(out [B, Hv, S, Dv], state [B, Hv, Dk, Dv])``."""
    outs, states = [], []
    for b in range(query.shape[0]):
        init = None if initial_state is None else initial_state[b:b + 1]
        o, st = gdn_recurrence(query[b].transpose(0, 1), key[b].transpose(0, 1), value[b].transpose(0, 1),
                               g_log[b].T, beta[b].T, initial_state=init, scale=scale, use_qk_l2norm=use_qk_l2norm)
        outs.append(o.transpose(0, 1))
        states.append(st[0])
    return torch.stack(outs), torch.stack(states)


def assert_close(actual, expected, dtype, what):
    """The project tolerance: fp32 ``1e-4 max|ref| + 1e-6``, bf16 ``2e-2 max|ref|`` (max abs error)."""
    expected = expected.double()
    error = (actual.double() - expected).abs().max().item()
    bound = tolerance(dtype, expected)
    assert error <= bound, f"{what}: max abs error {error:.3g} > {bound:.3g} (max |ref| {expected.abs().max().item():.3g})"
