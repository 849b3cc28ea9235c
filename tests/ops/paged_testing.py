"""Mixed engine steps for the paged-op tests: metadata with padding, caches and float64 references.

A step has decode rows and prefill sequences on shuffled live pages, padding rows and empty
padding sequences on the pad page, padding tokens after the last sequence, and spare pages no
one uses. Fresh (``has_state`` False) pages and the pad page hold NaN, so a test sees any read
of them that reaches an output or a live state.
"""

from dataclasses import dataclass

import torch

from vllm_gdn_neuron.kernels.reference import causal_conv1d, causal_conv1d_step, gdn_recurrence
from vllm_gdn_neuron.model.gdn_cache import conv_state_view


@dataclass
class Step:
    num_pages: int
    pad_page: int
    decode_pages: torch.Tensor          # [N] int64
    decode_real: list                   # rows that carry a request
    query_start_loc: torch.Tensor       # [S + 1] int32
    prefill_pages: torch.Tensor         # [S] int64
    has_state: torch.Tensor             # [S] bool
    lengths: list                       # real sequence lengths (padding sequences left out)
    num_tokens: int                     # T, padding tokens included

    @property
    def live_pages(self):
        rows = [int(self.decode_pages[r]) for r in self.decode_real]
        return rows + self.prefill_pages[:len(self.lengths)].tolist()

    def check_kwargs(self):
        return dict(decode_pages=self.decode_pages, prefill_query_start_loc=self.query_start_loc,
                    prefill_pages=self.prefill_pages, prefill_has_state=self.has_state,
                    num_prefill_tokens=self.num_tokens)


def make_step(num_decodes, lengths, has_state, *, pad_rows=2, pad_seqs=2, pad_tokens=5, spare_pages=3, seed=0):
    """A step with ``num_decodes`` live decode rows (plus ``pad_rows``, interleaved) and prefill
    sequences of ``lengths`` (``has_state`` each; plus ``pad_seqs`` empty ones) on random pages."""
    gen = torch.Generator().manual_seed(seed)
    num_live = num_decodes + len(lengths)
    num_pages = num_live + spare_pages + 1
    perm = torch.randperm(num_pages, generator=gen)
    pad_page, live = int(perm[0]), perm[1:1 + num_live]
    rows = torch.cat([live[:num_decodes], torch.full((pad_rows,), pad_page)])
    order = torch.randperm(rows.numel(), generator=gen)
    decode_pages = rows[order]
    decode_real = [r for r in range(rows.numel()) if int(order[r]) < num_decodes]
    bounds = [0] + torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist() + [sum(lengths)] * pad_seqs
    return Step(num_pages, pad_page, decode_pages, decode_real, torch.tensor(bounds, dtype=torch.int32),
                torch.cat([live[num_decodes:], torch.full((pad_seqs,), pad_page)]).long(),
                torch.tensor(list(has_state) + [False] * pad_seqs), list(lengths), sum(lengths) + pad_tokens)


def conv_pages(num_pages, conv_shape, dtype, gen):
    """Random ``[P, C, K]`` conv pages as the shells lay them out: the channel-fast view of ``[P, K, C]``."""
    channels, width = conv_shape
    return conv_state_view(torch.randn(num_pages, width, channels, generator=gen).to(dtype))


def make_caches(step, conv_shape, ssm_shape, conv_dtype=torch.float32, ssm_dtype=torch.float32, seed=1):
    """Random caches (conv pages channel-fast, :func:`conv_pages`) with NaN on the pad page and on the
    pages of fresh sequences."""
    gen = torch.Generator().manual_seed(seed)
    conv = conv_pages(step.num_pages, conv_shape, conv_dtype, gen)
    ssm = (0.5 * torch.randn(step.num_pages, *ssm_shape, generator=gen)).to(ssm_dtype)
    fresh = [int(p) for p, s in zip(step.prefill_pages[:len(step.lengths)], step.has_state) if not s]
    for cache in (conv, ssm):
        cache[[step.pad_page] + fresh] = float("nan")
    return conv, ssm


def prefill_initial(cache, step):
    """float64 initial states of the real prefill sequences (zeros for fresh ones)."""
    pages = step.prefill_pages[:len(step.lengths)]
    rows = cache[pages].double()
    rows[~step.has_state[:len(step.lengths)]] = 0
    return rows


def real_bounds(step):
    return step.query_start_loc[:len(step.lengths) + 1].long()


def reference_conv_decode(x, weight, cache, step, activation="silu"):
    """``(y [rows], new_state [rows])`` of the live decode rows."""
    rows = step.decode_real
    return causal_conv1d_step(x[rows], weight, cache[step.decode_pages[rows]], activation)


def reference_conv_prefill(x, weight, cache, step, activation="silu"):
    n = sum(step.lengths)
    return causal_conv1d(x[:n], weight, real_bounds(step), prefill_initial(cache, step), activation)


def reference_gdn_decode(q, k, v, g, beta, cache, step, **kwargs):
    rows = step.decode_real
    bounds = torch.arange(len(rows) + 1)
    return gdn_recurrence(q[rows], k[rows], v[rows], g[rows], beta[rows], bounds,
                          initial_state=cache[step.decode_pages[rows]], **kwargs)


def reference_gdn_prefill(q, k, v, g, beta, cache, step, **kwargs):
    n = sum(step.lengths)
    return gdn_recurrence(q[:n], k[:n], v[:n], g[:n], beta[:n], real_bounds(step),
                          initial_state=prefill_initial(cache, step), **kwargs)


def changed_pages(before, after):
    """Pages whose bits differ (NaN == NaN)."""
    same = (before == after) | (before.isnan() & after.isnan())
    return [p for p in range(before.shape[0]) if not bool(same[p].all())]
