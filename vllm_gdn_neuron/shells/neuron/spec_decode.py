"""The verify step of speculative decoding (the target's side), as vllm-neuron's runner drives it.

Read at whn09/vllm-neuron @ 7ea99278 (``neuron_model_runner.py``; ``docs/neuron-mtp.md`` has
the whole contract): with ``num_speculative_tokens = N`` a decode step carries, per request,
its last sampled token then its N draft tokens (W = 1 + N tokens, ``max_query_len = W``,
``decode_token_threshold = 1 + N``), padded to the decode bucket's R rows with full fake
requests (ids, positions and slots 0); ``sampling_positions = arange(R * W)``,
``sampling_params`` holds each request's row W times (``replicate_per_seq_rows``), and
``spec_decode_metadata.draft_token_ids [R * N]`` int32 the drafts (zeros for the fake rows).
With on-device sampling the runner reads back ``[R, W]`` token ids, ``-1`` past the
accepted ones (``_parse_rejection_sampling_output``), and passes nothing about them to the
next step but the positions, which start after the last accepted token.

So the model judges the drafts in its own graph: every one of the R * W rows is sampled as
a decode row would be (:mod:`.sampling`: greedy rows take the argmax); draft j of a row is
accepted while every earlier draft was and the id sampled at its predecessor equals it.
For a sampled row this is rejection sampling with a deterministic draft: a draft is kept
with the target's probability of it, a rejected one replaced by a draw from the target's
distribution without it, exactly the distribution of the target. The row returns the ids
at positions ``0 .. a`` (a drafts accepted, then the correction or bonus id), ``-1``
after; its GatedDeltaNet state becomes the one after its token a (the last kept input),
written only now (:class:`.gdn.PendingStates`). Attention K / V of rejected drafts stay in
their slots, past the request's next position: the next step overwrites them before any
token attends to them.
"""

import torch

from vllm_gdn_neuron.shells.neuron.gdn import PendingStates

# ``_parse_rejection_sampling_output``: ids past a row's accepted ones.
REJECTED = -1


def verify_width(num_tokens: int, num_rows: int, spec_decode_metadata) -> int:
    """W, the tokens per decode row: 1, or ``1 + N`` with ``spec_decode_metadata`` (N drafts per row).

    Raises:
        ValueError: naming the argument, when the shapes are not the runner's verify layout.
    """
    if spec_decode_metadata is None:
        if num_tokens != num_rows:
            raise ValueError(f"input_ids: a decode step without spec_decode_metadata takes one token per block-table "
                             f"row ({num_rows}); got {num_tokens}")
        return 1
    drafts = spec_decode_metadata.draft_token_ids
    if drafts.dim() != 1 or drafts.dtype.is_floating_point or drafts.shape[0] % num_rows:
        raise ValueError(f"spec_decode_metadata.draft_token_ids must be [rows * N] integer ids ({num_rows} rows); "
                         f"got {list(drafts.shape)} {drafts.dtype}")
    width = 1 + drafts.shape[0] // num_rows
    if width < 2 or num_tokens != num_rows * width:
        raise ValueError(f"input_ids: a verify step takes 1 + N tokens per row ({num_rows} rows, N = {width - 1} "
                         f"drafts each from spec_decode_metadata.draft_token_ids); got {num_tokens} tokens")
    return width


def judge_drafts(sampled: torch.Tensor, draft_token_ids: torch.Tensor, width: int):
    """The runner's rejection output and each row's kept position.

    Dimensions:
        R: rows; W: tokens per row (1 + N).

    Args:
        sampled: ``[R * W]`` int32 ids sampled at every token of the verify rows.
        draft_token_ids: ``[R * N]`` integer drafts (row r's at ``r * N .. r * N + N - 1``).
        width: W.

    Returns:
        ``(ids [R, W] int32, kept [R] int64)``: the ids sampled at positions ``0 .. a`` of each
        row (a = its accepted drafts) and ``REJECTED`` after; ``kept = a``, the token whose
        state the row keeps.
    """
    ids = sampled.view(-1, width)
    drafts = draft_token_ids.view(-1, width - 1).to(ids.dtype)
    matches = (ids[:, :-1] == drafts).to(torch.int64)
    positions = torch.arange(width, device=ids.device)[None, :]
    # The leading matches: where the running count of matches still equals the position (a
    # cumsum, not a cumprod: torch-mlir has no lowering of aten.cumprod).
    accepted = (matches.cumsum(dim=1) == positions[:, 1:]).sum(dim=1)              # [R] in 0 .. N
    return torch.where(positions <= accepted[:, None], ids, REJECTED).to(torch.int32), accepted


def commit_states(pending: list[PendingStates], kept: torch.Tensor) -> None:
    """Write every GDN layer's state after each row's kept token (``kept [R]`` int64) to its page."""
    for states in pending:
        states.commit(kept)
