"""One-token GDN decode step, reading and updating the cache rows where they are.

Per value head: ``S <- exp(g) S``; ``v_new = beta (v - S^T k)``; ``S <- S + k v_new^T``;
``o = S'^T q``. Both reads come from the undecayed state in one matmul,
``[k; q]^T S = [kS, qS]``: ``S^T k = exp(g) kS`` and
``o = exp(g) qS + (q . k) v_new``. Each cache row is then updated in place
(``S.mul_(exp(g)).baddbmm_(k, v_new)``) right after its read, while it is still in cache: a
row (``Hv x Dk x Dv`` float32, 2 MiB at 32 x 128 x 128) comes from memory once per step and
goes back once, never gathered into a copy. Reading all rows first and updating them after
read every row from memory twice.
"""

import torch

from .common import prepare_kq


def gdn_decode(q, k, v, g, beta, state, state_indices, scale, use_qk_l2norm):
    """Backend contract: see ``vllm_gdn_neuron.ops.backends``."""
    rows, num_k_heads, dim_k = q.shape
    num_v_heads, dim_v = v.shape[1:]
    group = num_v_heads // num_k_heads
    # [N, Hv, 2, Dk]: the key and the query of each value head's key head.
    k_q = prepare_kq(q, k, scale, use_qk_l2norm).repeat_interleave(group, dim=1)
    decay = g.exp()[..., None]                                           # [N, Hv, 1]
    beta_v = beta[..., None] * v.float()                                 # [N, Hv, Dv]
    beta_decay = beta[..., None] * decay                                 # [N, Hv, 1]
    q_dot_k = (k_q[:, :, 0] * k_q[:, :, 1]).sum(-1, keepdim=True)        # [N, Hv, 1]
    keys = k_q[:, :, 0, :, None]                                         # [N, Hv, Dk, 1]
    reads = torch.empty(num_v_heads, 2, dim_v, dtype=torch.float32, device=v.device)
    v_new = torch.empty(num_v_heads, 1, dim_v, dtype=torch.float32, device=v.device)
    o = torch.empty(rows, num_v_heads, dim_v, dtype=torch.float32, device=v.device)
    # Per-row views made once (each ``x[row]`` in the loop would be one more dispatched op).
    read_k, read_q = reads.unbind(1)
    v_new_rows = v_new[:, 0]
    per_row = zip(state_indices.tolist(), *(t.unbind(0) for t in (k_q, beta_v, beta_decay, q_dot_k, decay,
                                                                    decay[..., None], keys, o)))
    for slot, k_q_r, beta_v_r, beta_decay_r, q_dot_k_r, decay_r, state_decay_r, keys_r, o_r in per_row:
        s = state[slot]
        torch.bmm(k_q_r, s, out=reads)
        torch.addcmul(beta_v_r, beta_decay_r, read_k, value=-1, out=v_new_rows)
        torch.addcmul(q_dot_k_r * v_new_rows, decay_r, read_q, out=o_r)
        s.mul_(state_decay_r).baddbmm_(keys_r, v_new)
    return o.to(v.dtype)
