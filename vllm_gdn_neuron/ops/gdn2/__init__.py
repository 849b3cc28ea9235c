"""GDN-2 (channel-wise gates), apart from what serves: no model uses it, no serving module imports it.

``gdn2_prefill`` is its public op (packed varlen tokens, the layout of ``ops.gdn_prefill``), on
the torch math (``chunked``) or the NKI kernel (``kernels.gdn2``).
"""

from ..validation import (
    F32,
    check_choice,
    check_cu_seqlens,
    check_decay,
    check_qkv,
    check_same_device,
    check_tensor,
    resolve_scale,
)
from . import chunked

STATE_LAYOUTS = ("kv", "vk")
BACKENDS = ("auto", "torch", "nki")


def _backend(backend, device):
    check_choice("backend", backend, BACKENDS)
    if backend != "auto":
        return backend
    from ..phases import NEURON_DEVICE_TYPES, nki_runs_here

    return "nki" if device.type in NEURON_DEVICE_TYPES and nki_runs_here() else "torch"


def _nki_gdn2_prefill(q, k, v, g, beta, w, cu_seqlens, initial_state, scale, use_qk_l2norm):
    """The GDN-2 kernel on the packed tokens (boundaries at compile time); q and k normalised here."""
    from vllm_gdn_neuron.kernels.gdn2 import launch
    from vllm_gdn_neuron.kernels.l2norm import l2norm

    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    return launch.gdn2_prefill(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
                               None if w is None else w.contiguous(), cu_seqlens.tolist(),
                               None if initial_state is None else initial_state.contiguous(), scale)


def gdn2_prefill(q, k, v, g, beta, w, cu_seqlens, *, initial_state=None, scale=None, use_qk_l2norm=False,
                 state_layout="kv", backend="auto"):
    """GDN-2 (channel-wise gates) over packed prompts (chunked).

    Args:
        q, k: ``[T, Hk, Dk]`` float32 or bfloat16.
        v: ``[T, Hv, Dv]``, q's dtype.
        g: ``[T, Hv, Dk]`` float32 natural-log decay per key channel, <= 0.
        beta: ``[T, Hv, Dk]`` float32 write strength per key channel.
        w: ``[T, Hv, Dv]`` float32 value weight per value channel, or None for ones.
        cu_seqlens: ``[N + 1]`` int32 or int64 sequence boundaries.
        initial_state: float32 ``[N, Hv, Dk, Dv]`` (``state_layout="kv"``) or ``[N, Hv, Dv, Dk]``
            (``"vk"``, flashinfer's), or None for zeros.
        scale, use_qk_l2norm: as in ``ops.gdn_prefill``.
        backend: ``"auto"`` (``nki`` where the real Neuron SDK runs the kernel on a Neuron
            device, else ``torch``), ``"torch"`` or ``"nki"``.
        state_layout: ``"kv"`` or ``"vk"``, for the initial and the final state alike.

    Returns:
        ``(o, final_state)``: ``[T, Hv, Dv]`` in q's dtype, final state float32 in ``state_layout``.
    """
    tokens, _, dim_k, num_v_heads, dim_v = check_qkv(q, k, v, "T")
    check_tensor("g", g, (("T", tokens), ("Hv", num_v_heads), ("Dk", dim_k)), F32)
    check_tensor("beta", beta, (("T", tokens), ("Hv", num_v_heads), ("Dk", dim_k)), F32)
    if w is not None:
        check_tensor("w", w, (("T", tokens), ("Hv", num_v_heads), ("Dv", dim_v)), F32)
    bounds = check_cu_seqlens(cu_seqlens, tokens)
    check_choice("state_layout", state_layout, STATE_LAYOUTS)
    if initial_state is not None:
        inner = (("Dk", dim_k), ("Dv", dim_v)) if state_layout == "kv" else (("Dv", dim_v), ("Dk", dim_k))
        check_tensor("initial_state", initial_state, (("N", bounds.numel() - 1), ("Hv", num_v_heads)) + inner, F32)
        if state_layout == "vk":
            initial_state = initial_state.transpose(-1, -2)
    device = check_same_device(q=q, k=k, v=v, g=g, beta=beta, w=w, initial_state=initial_state)
    scale = resolve_scale(scale, dim_k)
    check_decay("g", g)
    run = _nki_gdn2_prefill if _backend(backend, device) == "nki" else chunked.gdn2_prefill
    o, final_state = run(q, k, v, g, beta, w, bounds, initial_state, scale, bool(use_qk_l2norm))
    if state_layout == "vk":
        final_state = final_state.transpose(-1, -2).contiguous()
    return o, final_state
