"""Input builders and the tolerance check shared by the ops tests (imported by them by name).

Tolerances: float32 max abs error <= 1e-4 * max|ref| + 1e-6; bfloat16 <= 2e-2 * max|ref|.
References see exactly the inputs the op sees (bf16 inputs are rounded before either runs).
"""

import torch

from vllm_gdn_neuron.kernels.reference import tolerance


def assert_matches(actual, ref, dtype, what):
    """``actual`` within the project's tolerance (``kernels.reference.tolerance``) of the float64 reference ``ref``."""
    assert actual.shape == ref.shape, (what, actual.shape, ref.shape)
    error = (actual.double() - ref).abs().max().item() if ref.numel() else 0.0
    assert error <= tolerance(dtype, ref), f"{what}: max abs error {error:.3g} > {tolerance(dtype, ref):.3g}"


def make_gdn_inputs(lengths, num_k_heads, num_v_heads, dim_k, dim_v, *, dtype=torch.float32, min_g=-1.0,
                    correlated=False, with_state=True, channel_gates=False, seed=0):
    """Random packed GDN inputs.

    Args:
        lengths: token count of each sequence.
        min_g: g is uniform in [min_g, 0] (the strongly decaying case uses -20).
        correlated: keys share one direction plus 10% noise (a hard case for (I + A)^-1).
        channel_gates: GDN-2 gates ``[T, Hv, Dk]`` and a w ``[T, Hv, Dv]``.

    Returns:
        dict with q, k, v (in ``dtype``), g, beta (, w) float32, cu_seqlens int32 and
        initial_state float32 or None.
    """
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    q = torch.randn(tokens, num_k_heads, dim_k, generator=gen)
    if correlated:
        base = torch.randn(1, num_k_heads, dim_k, generator=gen)
        k = base + 0.1 * torch.randn(tokens, num_k_heads, dim_k, generator=gen)
    else:
        k = torch.randn(tokens, num_k_heads, dim_k, generator=gen)
    v = torch.randn(tokens, num_v_heads, dim_v, generator=gen)
    gate_shape = (tokens, num_v_heads, dim_k) if channel_gates else (tokens, num_v_heads)
    inputs = dict(
        q=q.to(dtype), k=k.to(dtype), v=v.to(dtype),
        g=min_g * torch.rand(gate_shape, generator=gen),
        beta=torch.rand(gate_shape, generator=gen),
        cu_seqlens=torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32),
        initial_state=(0.5 * torch.randn(len(lengths), num_v_heads, dim_k, dim_v, generator=gen)
                       if with_state else None),
    )
    if channel_gates:
        inputs["w"] = torch.rand(tokens, num_v_heads, dim_v, generator=gen)
    return inputs

