"""One-token GDN decode step, reading and updating the cache rows where they are.

Per value head: ``S <- exp(g) S``; ``v_new = beta (v - S^T k)``; ``S <- S + k v_new^T``;
``o = S'^T q``. Both reads come from the undecayed state in one matmul,
``[k; q]^T S = [kS, qS]``: ``S^T k = exp(g) kS`` and
``o = exp(g) qS + (q . k) v_new``. Each cache row is then updated in place
(``S.mul_(exp(g)).baddbmm_(k, v_new)``), so the state is read once and written once per step,
never gathered into a copy.
"""

import torch

from .common import prepare_qk


def gdn_decode(q, k, v, g, beta, state, state_indices, scale, use_qk_l2norm):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``."""
    rows, num_k_heads, dim_k = q.shape
    num_v_heads, dim_v = v.shape[1:]
    group = num_v_heads // num_k_heads
    q, k = prepare_qk(q, k, scale, use_qk_l2norm)
    # [N, Hv, 2, Dk]: the key and the query of each value head's key head.
    k_q = torch.stack([k, q], dim=2).repeat_interleave(group, dim=1)
    slots = state_indices.tolist()
    reads = torch.empty(rows, num_v_heads, 2, dim_v, dtype=torch.float32, device=v.device)
    for row, slot in enumerate(slots):
        torch.bmm(k_q[row], state[slot], out=reads[row])
    decay = g.exp()[..., None]                                           # [N, Hv, 1]
    v_new = beta[..., None] * (v.float() - decay * reads[:, :, 0])       # [N, Hv, Dv]
    q_dot_k = (k_q[:, :, 0] * k_q[:, :, 1]).sum(-1, keepdim=True)        # [N, Hv, 1]
    o = decay * reads[:, :, 1] + q_dot_k * v_new
    keys = k_q[:, :, 0, :, None]                                         # [N, Hv, Dk, 1]
    for row, slot in enumerate(slots):
        state[slot].mul_(decay[row, :, :, None]).baddbmm_(keys[row], v_new[row, :, None, :])
    return o.to(v.dtype)
