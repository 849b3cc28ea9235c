"""Routed experts that read and compute only the experts the tokens chose, with static shapes.

Two formulations of one sum, ``out[t] = sum_j weights[t, j] * expert_{experts[t, j]}(x[t])``
(an expert = ``down @ swiglu(gate_up @ x)``), for graphs compiled once per bucket: no
data-dependent shapes, no host reads, traceable by ``torch.compile(fullgraph=True)``.

- :func:`gathered_expert_mixture` (decode-sized steps): the ``T * top_k`` chosen experts'
  weights are gathered per assignment (``[T * top_k, 2 * I, H]``) and applied by batched
  matrix-vector products. Reads ``T * top_k`` expert weight sets.
- :func:`grouped_expert_mixture` (prefill-sized steps): the assignments are sorted by expert
  and laid out in blocks of ``block_size`` rows, each block holding one expert's tokens
  (the last block of an expert padded with a zero row of weight zero). The block count is
  bounded statically by :func:`max_expert_blocks`; a block-sparse batched matmul runs each
  block against its expert's weights. Reads at most ``max_expert_blocks`` expert weight sets.

:func:`routed_expert_mixture` picks one per bucket by the static rule stated there.

Dimensions:
    T tokens, H hidden size, E experts, I an expert's intermediate size (this rank's share),
    k = top_k, N = T * k assignments, B = block_size.

Notes:
    Summation order: the dense reference (:func:`vllm_gdn_neuron.model.mlp.dense_expert_mixture`)
    adds each token's weighted expert outputs in expert-index order; the grouped path adds
    them in the same order (its blocks are sorted by expert and ``index_add`` accumulates in
    slot order), and so does the gathered path (it sorts each token's k choices). Inside each matmul the
    batched kernels may associate the H- and I-long dot products differently from
    ``F.linear``: in float32 the results agree up to that re-association only.

    Blocks past the ones in use point at the last expert and hold only padding rows: they
    cost a weight read and zero-row compute, never a wrong value (their weights are zero).

    Expert parallelism is not implemented: every rank holds all E experts with its I / tp
    slice of each (the caller all-reduces the partial sums).
"""

import torch

from vllm_gdn_neuron.model.mlp import swiglu

# Rows per expert block of the grouped path: the TensorE array's 128 rows (one full
# moving tile per block on a NeuronCore).
DEFAULT_BLOCK_SIZE = 128


def max_expert_blocks(num_assignments: int, num_experts: int, block_size: int) -> int:
    """The static upper bound on the blocks of the grouped path.

    With ``c_e`` assignments on expert e (``sum c_e = N``, at most ``m = min(E, N)`` of them
    non-zero), the blocks are ``sum ceil(c_e / B) <= sum (c_e + B - 1) / B <= (N + m (B - 1)) / B``.
    """
    used = min(num_experts, num_assignments)
    return (num_assignments + used * (block_size - 1)) // block_size


def uses_grouped_path(num_tokens: int, top_k: int, num_experts: int) -> bool:
    """The static crossover rule of :func:`routed_expert_mixture`: grouped iff ``T * k > E``.

    While ``N = T * k <= E`` the block bound equals N whatever the block size (every
    assignment may sit on its own expert), so grouping reads as many expert weight sets
    as gathering and computes B padded rows per assignment instead of one. Past it, the
    bound ``(N + E (B - 1)) / B`` is below N: grouping reads fewer weight sets (down to
    about E + N / B), and its B-row blocks cost TensorE no more per row than the
    gathered path's one-row products (each a full instruction).
    """
    return num_tokens * top_k > num_experts


def gathered_expert_mixture(
    x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """The chosen experts applied per assignment: a static ``[T * k]`` weight gather and batched matmuls.

    Args:
        x: ``[T, H]``.
        weights: ``[T, k]`` routing weights (x's dtype); experts: ``[T, k]`` int64 expert ids.
        gate_up: ``[E, 2 * I, H]`` (gate rows first); down: ``[E, H, I]``.

    Returns:
        ``[T, H]`` in x's dtype, each token's outputs summed in expert-index order.
    """
    num_tokens, top_k = experts.shape
    experts, position = experts.sort(dim=1)  # each token's experts in index order, as the reference sums
    weights = weights.gather(1, position)
    flat = experts.reshape(-1)
    rows = x.repeat_interleave(top_k, dim=0).unsqueeze(-1)  # [N, H, 1]
    hidden = swiglu(torch.bmm(gate_up.index_select(0, flat), rows).squeeze(-1))  # [N, I]
    outputs = torch.bmm(down.index_select(0, flat), hidden.unsqueeze(-1)).squeeze(-1)  # [N, H]
    outputs = (outputs * weights.reshape(-1, 1)).view(num_tokens, top_k, -1)
    out = torch.zeros_like(x)
    for j in range(top_k):
        out = out + outputs[:, j]
    return out


def grouped_expert_mixture(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, gate_up: torch.Tensor,
                           down: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """Tokens grouped by expert into ``block_size``-row blocks, a block-sparse batched matmul.

    Args:
        x, weights, experts, gate_up, down: as :func:`gathered_expert_mixture`.
        block_size: rows per block (B).

    Returns:
        ``[T, H]`` in x's dtype, each token's outputs summed in expert-index order.

    Notes:
        Static shapes throughout: ``num_blocks = max_expert_blocks(N, E, B)`` blocks of B
        slots; slot -> token (T = a zero padding row), slot -> weight (0 for padding),
        block -> expert are built by sort, cumsum, scatter and comparisons on the device.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1; got {block_size}")
    num_tokens, hidden_size = x.shape
    top_k = experts.shape[1]
    num_experts = gate_up.shape[0]
    n = num_tokens * top_k
    num_blocks = max_expert_blocks(n, num_experts, block_size)
    slots = num_blocks * block_size
    device = x.device

    flat_experts = experts.reshape(n)
    # Assignments by expert, token order within one: the keys are distinct, so any sort keeps that
    # order (torch-mlir has no StableHLO lowering of a stable sort).
    order = torch.argsort(flat_experts * n + torch.arange(n, device=device))
    sorted_experts = flat_experts.index_select(0, order)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(
        0, flat_experts, torch.ones(n, dtype=torch.int64, device=device))
    # Non-negative operands: truncation is floor, without the float divide torch-mlir makes of `//`.
    padded = torch.div(counts + (block_size - 1), block_size, rounding_mode="trunc") * block_size
    padded_end = torch.cumsum(padded, 0)
    rank_in_expert = torch.arange(n, device=device) - (torch.cumsum(counts, 0) - counts).index_select(0, sorted_experts)
    slot = (padded_end - padded).index_select(0, sorted_experts) + rank_in_expert  # distinct, < slots

    slot_token = torch.full((slots,), num_tokens, dtype=torch.int64, device=device).scatter(
        0, slot, torch.div(order, top_k, rounding_mode="trunc"))
    slot_weight = torch.zeros(slots, dtype=weights.dtype, device=device).scatter(
        0, slot, weights.reshape(n).index_select(0, order))
    # Block b's expert = the experts whose padded blocks end at or before block b (a cumsum of end
    # marks; torch-mlir has no lowering of searchsorted).
    ends = torch.zeros(num_blocks + 1, dtype=torch.int64, device=device).index_add_(
        0, torch.div(padded_end, block_size, rounding_mode="trunc").clamp(max=num_blocks), torch.ones_like(padded_end))
    block_expert = ends.cumsum(0)[:num_blocks].clamp_(max=num_experts - 1)

    rows = torch.cat([x, x.new_zeros(1, hidden_size)]).index_select(0, slot_token).view(num_blocks, block_size, -1)
    hidden = swiglu(torch.bmm(rows, gate_up.index_select(0, block_expert).transpose(1, 2)))  # [nb, B, I]
    outputs = torch.bmm(hidden, down.index_select(0, block_expert).transpose(1, 2)).view(slots, -1)
    outputs = outputs * slot_weight.unsqueeze(-1)
    out = x.new_zeros(num_tokens + 1, hidden_size).index_add_(0, slot_token, outputs)
    return out[:num_tokens]


def routed_expert_mixture(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, gate_up: torch.Tensor,
                          down: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """The routed experts of one step: gathered when ``T * k <= E``, grouped otherwise.

    The choice reads only static sizes (the bucket's T, the config's k and E), so a
    compiled bucket holds one path (:func:`uses_grouped_path` states the rule and why).
    Qwen3.5-35B-A3B (E = 256, k = 8): decode buckets up to 32 rows gather, every prefill
    bucket of 33 tokens or more groups.

    Args and Returns: as :func:`grouped_expert_mixture`.
    """
    if uses_grouped_path(experts.shape[0], experts.shape[1], gate_up.shape[0]):
        return grouped_expert_mixture(x, weights, experts, gate_up, down, block_size)
    return gathered_expert_mixture(x, weights, experts, gate_up, down)
