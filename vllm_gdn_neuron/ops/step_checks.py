"""Host-side validation of one engine step's paged-op metadata, run once per step.

The paged ops check shapes only (they run inside compiled graphs); the values they index with
are checked here, on a host copy, before any layer runs: each failure is a ValueError naming
the argument, what was expected and what was given.
"""

import torch

from .validation import INDEX_DTYPES, check_tensor


def _check_index(name, x, label, size=None):
    check_tensor(name, x, ((label, size),), INDEX_DTYPES)
    return x.detach().cpu().tolist()


def _check_pages(name, pages, num_pages, what):
    for at, page in enumerate(pages):
        if not 0 <= page < num_pages:
            raise ValueError(f"{name}: expected pages in [0, {num_pages}), got {page} for {what} {at}")


def _check_prefill(query_start_loc, pages, has_state, num_tokens, num_pages):
    """Returns the sequence lengths and pages of the prefill part."""
    given = {"prefill_query_start_loc": query_start_loc, "prefill_pages": pages,
             "prefill_has_state": has_state, "num_prefill_tokens": num_tokens}
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise ValueError(f"{missing[0]}: expected with the other prefill arguments, got None")
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"num_prefill_tokens: expected an int >= 0, got {num_tokens!r}")
    bounds = _check_index("prefill_query_start_loc", query_start_loc, "S+1")
    if len(bounds) < 2:
        raise ValueError(f"prefill_query_start_loc: expected at least 2 entries (S >= 1 sequences), "
                         f"got {len(bounds)}")
    num_seqs = len(bounds) - 1
    page_list = _check_index("prefill_pages", pages, "S", num_seqs)
    check_tensor("prefill_has_state", has_state, (("S", num_seqs),), (torch.bool,))
    if bounds[0] != 0:
        raise ValueError(f"prefill_query_start_loc: expected to start at 0, got {bounds[0]}")
    for at in range(num_seqs):
        if bounds[at + 1] < bounds[at]:
            raise ValueError(f"prefill_query_start_loc: expected non-decreasing values, got {bounds[at]} then "
                             f"{bounds[at + 1]} at index {at}")
    if bounds[-1] > num_tokens:
        raise ValueError(f"prefill_query_start_loc: expected to end at most at num_prefill_tokens = {num_tokens}, "
                         f"got {bounds[-1]}")
    _check_pages("prefill_pages", page_list, num_pages, "sequence")
    return [end - start for start, end in zip(bounds[:-1], bounds[1:])], page_list


def check_step(num_pages, pad_page=None, *, decode_pages=None, prefill_query_start_loc=None, prefill_pages=None,
               prefill_has_state=None, num_prefill_tokens=None):
    """Validate the metadata of one step of the paged ops (host read of small index tensors).

    Args:
        num_pages: P, the pages of each GDN cache.
        pad_page: the reserved page of padding rows and sequences, or None (no padding).
        decode_pages: ``[N]`` int32 / int64 page of each decode row, or None (no decodes).
        prefill_query_start_loc: ``[S + 1]`` int32 / int64 prefill boundaries, or None (no prefill).
        prefill_pages: ``[S]`` int32 / int64 page of each prefill sequence.
        prefill_has_state: ``[S]`` bool.
        num_prefill_tokens: T, the prefill tokens of the ops' inputs (padding included).

    Checks: pages in ``[0, P)``; no page used twice by the live rows and sequences (those not on
    ``pad_page``) of the step, decode and prefill together; padding sequences (on ``pad_page``)
    empty; the boundaries start at 0, never decrease and end at most at T.

    Raises:
        ValueError: naming the argument, the expected and the actual value.
    """
    if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 1:
        raise ValueError(f"num_pages: expected an int >= 1, got {num_pages!r}")
    if pad_page is not None and (isinstance(pad_page, bool) or not isinstance(pad_page, int)
                                 or not 0 <= pad_page < num_pages):
        raise ValueError(f"pad_page: expected None or an int in [0, {num_pages}), got {pad_page!r}")
    owners = {}
    if decode_pages is not None:
        pages = _check_index("decode_pages", decode_pages, "N")
        _check_pages("decode_pages", pages, num_pages, "row")
        for at, page in enumerate(pages):
            if page != pad_page:
                _claim(owners, page, "decode_pages", f"decode row {at}")
    prefill_given = (prefill_query_start_loc, prefill_pages, prefill_has_state, num_prefill_tokens)
    if any(value is not None for value in prefill_given):
        lengths, pages = _check_prefill(*prefill_given, num_pages)
        for at, (length, page) in enumerate(zip(lengths, pages)):
            if page != pad_page:
                _claim(owners, page, "prefill_pages", f"prefill sequence {at}")
            elif length:
                raise ValueError(f"prefill_query_start_loc: expected padding sequences (on pad_page = {pad_page}) "
                                 f"to be empty, got {length} tokens for prefill sequence {at}")


def _claim(owners, page, name, who):
    if page in owners:
        raise ValueError(f"{name}: expected each live page used once in a step, got page {page} for "
                         f"{owners[page]} and {who}")
    owners[page] = who
