"""The mask pack: shapes, plane meanings, and that its levels invert a unit lower triangle."""

import numpy as np
import pytest
import torch

from vllm_gdn_neuron.kernels.gdn_cte_torch import neumann_inverse_t, schur_inverse_t
from vllm_gdn_neuron.kernels.mask_pack import (BLOCK_DIAG_16, CHUNK, IDENTITY, LEVEL_MASK, N_MASKS, NUM_LEVELS,
                                               STRICT_LOWER, STRICT_UPPER, UPPER, build_mask_pack)

PACK = build_mask_pack()


def test_shape_dtype_and_values():
    assert PACK.shape == (N_MASKS, CHUNK, CHUNK) and PACK.dtype == np.float32
    assert set(np.unique(PACK)) == {0.0, 1.0}


def test_triangles_identity_and_blocks():
    s, r = np.indices((CHUNK, CHUNK))
    assert np.array_equal(PACK[STRICT_UPPER], (s < r).astype(np.float32))
    assert np.array_equal(PACK[UPPER], (s <= r).astype(np.float32))
    assert np.array_equal(PACK[STRICT_LOWER], (s > r).astype(np.float32))
    assert np.array_equal(PACK[IDENTITY], np.eye(CHUNK, dtype=np.float32))
    assert np.array_equal(PACK[BLOCK_DIAG_16], (s // 16 == r // 16).astype(np.float32))


def test_levels_partition_the_strict_triangle():
    # every (s < r) pair is merged at exactly one level: the one where s and r first share a block
    total = sum(PACK[LEVEL_MASK[j]] for j in range(NUM_LEVELS))
    assert np.array_equal(total, PACK[STRICT_UPPER])


@pytest.mark.parametrize("level", range(NUM_LEVELS))
def test_level_selects_lower_left_blocks_of_each_pair(level):
    block = 2**level
    plane = PACK[LEVEL_MASK[level]]
    # pair 0: source tokens 0..b-1 feed destinations b..2b-1, nothing else in that pair
    assert plane[:block, block:2 * block].all()
    assert plane[:, :block].sum() == 0
    assert plane.sum() == (CHUNK // (2 * block)) * block * block


@pytest.mark.parametrize("inverse, chunk", [(schur_inverse_t, 128), (neumann_inverse_t, 64)])
def test_levels_invert_a_unit_lower_triangular_matrix(inverse, chunk):
    gen = torch.Generator().manual_seed(0)
    e = torch.tril(torch.randn(chunk, chunk, generator=gen, dtype=torch.float64), -1) * 0.2
    beta = torch.rand(chunk, generator=gen, dtype=torch.float64)
    t_t = inverse(e.T.float(), beta.float(), torch.from_numpy(PACK))
    expected = torch.linalg.inv(torch.eye(chunk, dtype=torch.float64) + beta[:, None] * e).T
    assert torch.allclose(t_t.double(), expected, atol=1e-4, rtol=0)
