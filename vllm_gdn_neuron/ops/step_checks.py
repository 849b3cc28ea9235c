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


def _check_part(part, given):
    """One part's arguments (name -> value, the token count last) all given, the count an int >= 0."""
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise ValueError(f"{missing[0]}: expected with the other {part} arguments, got None")
    name, num_tokens = list(given.items())[-1]
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {num_tokens!r}")


def _check_prefill(query_start_loc, pages, has_state, num_tokens, num_pages):
    """Returns the sequence lengths and pages of the prefill part."""
    _check_part("prefill", {"prefill_query_start_loc": query_start_loc, "prefill_pages": pages,
                            "prefill_has_state": has_state, "num_prefill_tokens": num_tokens})
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


def _check_verify(query_start_loc, pages, num_accepted, num_tokens, num_pages, pad_page):
    """Returns the pages of each verify row (a list of W pages) and whether the row is live."""
    _check_part("verify", {"verify_query_start_loc": query_start_loc, "verify_pages": pages,
                           "verify_num_accepted": num_accepted, "num_verify_tokens": num_tokens})
    num_rows, width = check_tensor("verify_pages", pages, (("R", None), ("W", None)), INDEX_DTYPES)
    if width < 1:
        raise ValueError("verify_pages: expected W >= 1 draft positions per row, got 0")
    bounds = _check_index("verify_query_start_loc", query_start_loc, "R+1", num_rows + 1)
    accepted = _check_index("verify_num_accepted", num_accepted, "R", num_rows)
    if bounds[0] != 0:
        raise ValueError(f"verify_query_start_loc: expected to start at 0, got {bounds[0]}")
    if bounds[-1] > num_tokens:
        raise ValueError(f"verify_query_start_loc: expected to end at most at num_verify_tokens = {num_tokens}, "
                         f"got {bounds[-1]}")
    rows = pages.detach().cpu().tolist()
    for at, row in enumerate(rows):
        _check_pages("verify_pages", row, num_pages, f"verify row {at}, position")
        length = bounds[at + 1] - bounds[at]
        live = any(page != pad_page for page in row)
        if live and not 1 <= length <= width:
            raise ValueError(f"verify_query_start_loc: expected 1 to W = {width} tokens per verify row, got "
                             f"{length} for verify row {at}")
        if not live and length:
            raise ValueError(f"verify_query_start_loc: expected padding rows (on pad_page = {pad_page}) to be "
                             f"empty, got {length} tokens for verify row {at}")
        if live and not 1 <= accepted[at] <= width:
            raise ValueError(f"verify_num_accepted: expected values in [1, W = {width}], got {accepted[at]} for "
                             f"verify row {at}")
        if live and pad_page in row:
            raise ValueError(f"verify_pages: expected a live row's W pages off pad_page = {pad_page}, got "
                             f"{row} for verify row {at}")
    return rows


def check_step(num_pages, pad_page=None, *, decode_pages=None, prefill_query_start_loc=None, prefill_pages=None,
               prefill_has_state=None, num_prefill_tokens=None, verify_query_start_loc=None, verify_pages=None,
               verify_num_accepted=None, num_verify_tokens=None):
    """Validate the metadata of one step of the paged ops (host read of small index tensors).

    Args:
        num_pages: P, the pages of each GDN cache.
        pad_page: the reserved page of padding rows and sequences, or None (no padding).
        decode_pages: ``[N]`` int32 / int64 page of each decode row, or None (no decodes).
        prefill_query_start_loc: ``[S + 1]`` int32 / int64 prefill boundaries, or None (no prefill).
        prefill_pages: ``[S]`` int32 / int64 page of each prefill sequence.
        prefill_has_state: ``[S]`` bool.
        num_prefill_tokens: T, the prefill tokens of the ops' inputs (padding included).
        verify_query_start_loc: ``[R + 1]`` int32 / int64 verify-row boundaries, or None (no verify rows).
        verify_pages: ``[R, W]`` int32 / int64 pages of each verify row's draft positions.
        verify_num_accepted: ``[R]`` int32 / int64 accepted tokens of each row's previous step.
        num_verify_tokens: the verify tokens of the ops' inputs (padding included).

    Checks: pages in ``[0, P)``; no page used twice by the live rows and sequences (those not on
    ``pad_page``) of the step, decode, verify and prefill together; padding sequences and rows (on
    ``pad_page``) empty; live verify rows 1..W tokens, off the pad page, accepted counts in
    ``[1, W]``; the boundaries start at 0, never decrease and end at most at T.

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
    verify_given = (verify_query_start_loc, verify_pages, verify_num_accepted, num_verify_tokens)
    if any(value is not None for value in verify_given):
        for at, row in enumerate(_check_verify(*verify_given, num_pages, pad_page)):
            if any(page != pad_page for page in row):
                for position, page in enumerate(row):
                    _claim(owners, page, "verify_pages", f"verify row {at} position {position}")
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
