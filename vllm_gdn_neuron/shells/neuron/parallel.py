"""Tensor parallelism of the Neuron shell: the rank's group and how checkpoint tensors shard.

On a Neuron host the group is vLLM's tensor-parallel ``GroupCoordinator`` (what
vllm-neuron's worker initialises); anywhere vLLM's distributed state is not set up
the shell runs as a single rank. Each rank keeps only its slices of the checkpoint
tensors (:func:`shard`).
"""

import torch


class SingleRank:
    """The tensor-parallel group of an unsharded model: every collective is the identity."""

    world_size = 1
    rank_in_group = 0

    @staticmethod
    def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    @staticmethod
    def all_gather(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return tensor


def current_tp_group():
    """vLLM's tensor-parallel group when vLLM's distributed state is initialised, else :class:`SingleRank`.

    The group must have ``world_size``, ``rank_in_group``, ``all_reduce(t) -> t`` and
    ``all_gather(t, dim) -> t`` (vLLM's ``GroupCoordinator`` has all four).
    """
    try:
        from vllm.distributed import parallel_state
    except ImportError:
        return SingleRank()
    if not parallel_state.model_parallel_is_initialized():
        return SingleRank()
    return parallel_state.get_tp_group()


def shard(tensor: torch.Tensor, dim: int, rank: int, world_size: int, parts: tuple[int, ...] | None = None):
    """This rank's slice of ``tensor`` along ``dim``.

    Args:
        tensor: a whole checkpoint tensor.
        dim: the sharded dimension.
        rank, world_size: the tensor-parallel position.
        parts: sizes of consecutive segments along ``dim`` that shard separately
            (the q | k | v parts of a fused projection), or None for one segment.

    Returns:
        The concatenation, in order, of each segment's ``rank``-th of ``world_size`` pieces.
    """
    segments = tensor.split(list(parts), dim=dim) if parts else (tensor,)
    pieces = []
    for segment in segments:
        size = segment.shape[dim] // world_size
        pieces.append(segment.narrow(dim, rank * size, size))
    return torch.cat(pieces, dim=dim) if len(pieces) > 1 else pieces[0]
