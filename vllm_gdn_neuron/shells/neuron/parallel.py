"""Tensor parallelism of the Neuron shell: the rank's group.

On a Neuron host the group is vLLM's tensor-parallel ``GroupCoordinator`` (what
vllm-neuron's worker initialises); anywhere vLLM's distributed state is not set up
the shell runs as a single rank. Which slices of the checkpoint tensors each rank keeps
is :mod:`vllm_gdn_neuron.model.parameters`.
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

