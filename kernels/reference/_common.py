"""Helpers shared by the float64 references: conversion and per-sequence iteration."""

import numpy as np
import torch


def as_float64(x):
    """Return ``x`` (a torch tensor, NumPy array or nested list) as a float64 CPU tensor."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(device="cpu", dtype=torch.float64)
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


def sequence_bounds(cu_seqlens, total):
    """``[(start, end), ...]`` of each sequence; ``cu_seqlens=None`` means one sequence of ``total``."""
    if cu_seqlens is None:
        return [(0, total)]
    bounds = [int(b) for b in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
    return list(zip(bounds[:-1], bounds[1:]))
