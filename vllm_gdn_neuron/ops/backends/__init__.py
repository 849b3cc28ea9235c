"""Backends of the GDN ops, and the contract every backend module implements.

A backend is a module ``vllm_gdn_neuron.ops.backends.<name>``, imported lazily by
``vllm_gdn_neuron.ops.phases`` (a layer's paged ops) and ``vllm_gdn_neuron.ops.dispatch`` (the
public ops): ``torch`` (everything, any device), ``nki`` (NKI kernels; on
trn2, or the CPU interpreter), ``vllm_cpu`` (vLLM's C++ CPU GDN and conv
kernels; ``auto`` takes it where ``vllm_gdn_neuron.ops.auto`` chose it). It exposes some or all of the functions below (an op a backend lacks is refused when
that backend is named in the call, and runs on ``torch`` under ``backend="auto"``, including a
``$VLLM_GDN_BACKEND`` choice), and optionally ``is_available() -> bool`` (asked before ``auto``
picks ``nki``). A backend that cannot run particular inputs raises a ValueError naming the
argument before doing any work.

What the public ops guarantee before they call a backend
---------------------------------------------------------
- Shapes, dtypes and devices are checked (``vllm_gdn_neuron/ops/validation.py``); all tensors
  share one device. Activation dtypes (q, k, v, x) are float32 or bfloat16, q/k/v share one.
  g, beta, w are float32. Recurrent states are float32. Tensors may be non-contiguous views.
- ``Hv % Hk == 0``; value head h reads key head ``h // (Hv // Hk)``.
- ``g <= 0`` everywhere (natural-log decay).
- ``scale`` is a Python float (``Dk ** -0.5`` already substituted for None).
- ``use_qk_l2norm`` is a bool; when True the backend normalises q and k per head in float32,
  ``x * rsqrt(sum(x^2) + 1e-6)``, before anything else (and before the scale).
- ``cu_seqlens`` is an int64 **CPU** tensor ``[N + 1]``, N >= 1, starting at 0,
  non-decreasing, ending at T (zero-length sequences are allowed: their state passes through).
- ``initial_state`` is None (= zeros) or a tensor of the documented shape.
- ``state_indices`` is int64 on the state's device, every entry a valid slot, no slot twice;
  padded rows (vLLM's PAD_SLOT_ID = -1) are removed by the public op before the call (their
  output rows are zeros and no state row is touched).
- ``activation`` is ``"silu"`` or None.

What a backend guarantees
-------------------------
- Inputs are never modified, except ``state`` rows ``state_indices`` in the decode ops,
  which are updated in place (and nothing else in ``state`` is written).
- Returned states are new float32 tensors (never aliases of ``initial_state``).
- Outputs are in q's dtype (x's dtype for the conv ops); accumulation is float32.

Functions
---------
``gdn_prefill(q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm)``
    q, k ``[T, Hk, Dk]``; v ``[T, Hv, Dv]``; g, beta ``[T, Hv]``;
    initial_state ``[N, Hv, Dk, Dv]`` or None.
    Returns ``(o [T, Hv, Dv], final_state [N, Hv, Dk, Dv])``.
    The torch backend's also takes ``layout=``, a prebuilt ``ChunkLayout`` (then ``cu_seqlens``
    is not read): the trace-safe paged ops (``vllm_gdn_neuron.ops.paged``) plan it per step.
``gdn_decode(q, k, v, g, beta, state, state_indices, scale, use_qk_l2norm)``
    q, k ``[N, Hk, Dk]``; v ``[N, Hv, Dv]``; g, beta ``[N, Hv]``;
    state ``[num_slots, Hv, Dk, Dv]`` (rows ``state_indices`` advanced one token in place).
    Returns ``o [N, Hv, Dv]``.
``conv1d_prefill(x, weight, cu_seqlens, initial_state, activation)``
    x ``[T, C]``; weight ``[C, K]`` (float32 or bfloat16); initial_state ``[N, C, K]`` in
    float32 or x's dtype, or None.
    Returns ``(y [T, C], final_state [N, C, K] float32)``, the state = the last K raw inputs.
``conv1d_decode(x, weight, state, state_indices, activation)``
    x ``[N, C]``; state ``[num_slots, C, K]`` in float32 or x's dtype (rows updated in place).
    Returns ``y [N, C]``.
"""
