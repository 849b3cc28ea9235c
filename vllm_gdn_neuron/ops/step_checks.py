"""Host-side validation of one engine step's paged-op metadata, run once per step.

The paged ops check shapes only (they run inside compiled graphs); the values they index with
are checked here, on a host copy, before any layer runs: each failure is a ValueError naming
the argument, what was expected and what was given.
"""

from .step import DecodeStep, PrefillStep, VerifyStep


def _host(x):
    return x.detach().cpu().tolist()


def _check_pages(name, pages, num_pages, what):
    for at, page in enumerate(pages):
        if not 0 <= page < num_pages:
            raise ValueError(f"{name}: expected pages in [0, {num_pages}), got {page} for {what} {at}")


def _check_prefill(prefill, num_pages):
    """Returns the sequence lengths and pages of the prefill part."""
    bounds = _host(prefill.query_start_loc)
    if len(bounds) < 2:
        raise ValueError(f"prefill.query_start_loc: expected at least 2 entries (S >= 1 sequences), "
                         f"got {len(bounds)}")
    page_list = _host(prefill.pages)
    if bounds[0] != 0:
        raise ValueError(f"prefill.query_start_loc: expected to start at 0, got {bounds[0]}")
    for at in range(len(bounds) - 1):
        if bounds[at + 1] < bounds[at]:
            raise ValueError(f"prefill.query_start_loc: expected non-decreasing values, got {bounds[at]} then "
                             f"{bounds[at + 1]} at index {at}")
    if bounds[-1] > prefill.num_tokens:
        raise ValueError(f"prefill.query_start_loc: expected to end at most at prefill.num_tokens = "
                         f"{prefill.num_tokens}, got {bounds[-1]}")
    _check_pages("prefill.pages", page_list, num_pages, "sequence")
    return [end - start for start, end in zip(bounds[:-1], bounds[1:])], page_list


def _check_verify(verify, num_pages, pad_page):
    """Returns the pages of each verify row (a list of W pages)."""
    width = verify.width
    if width < 1:
        raise ValueError("verify.pages: expected W >= 1 draft positions per row, got 0")
    bounds, accepted = _host(verify.query_start_loc), _host(verify.num_accepted)
    if bounds[0] != 0:
        raise ValueError(f"verify.query_start_loc: expected to start at 0, got {bounds[0]}")
    if bounds[-1] > verify.num_tokens:
        raise ValueError(f"verify.query_start_loc: expected to end at most at verify.num_tokens = "
                         f"{verify.num_tokens}, got {bounds[-1]}")
    rows = _host(verify.pages)
    for at, row in enumerate(rows):
        _check_pages("verify.pages", row, num_pages, f"verify row {at}, position")
        length = bounds[at + 1] - bounds[at]
        live = any(page != pad_page for page in row)
        if live and not 1 <= length <= width:
            raise ValueError(f"verify.query_start_loc: expected 1 to W = {width} tokens per verify row, got "
                             f"{length} for verify row {at}")
        if not live and length:
            raise ValueError(f"verify.query_start_loc: expected padding rows (on pad_page = {pad_page}) to be "
                             f"empty, got {length} tokens for verify row {at}")
        if live and not 1 <= accepted[at] <= width:
            raise ValueError(f"verify.num_accepted: expected values in [1, W = {width}], got {accepted[at]} for "
                             f"verify row {at}")
        if live and pad_page in row:
            raise ValueError(f"verify.pages: expected a live row's W pages off pad_page = {pad_page}, got "
                             f"{row} for verify row {at}")
    return rows


def _check_kind(name, step, kind):
    if step is not None and not isinstance(step, kind):
        raise ValueError(f"{name}: expected None or a {kind.__name__}, got {type(step).__name__}")


def check_step(num_pages, pad_page=None, *, decode=None, prefill=None, verify=None):
    """Validate the values of one step's paged-op metadata (host read of small index tensors).

    The step objects' ``build`` checked shapes and dtypes; this checks what they index with.

    Args:
        num_pages: P, the pages of each GDN cache.
        pad_page: the reserved page of padding rows and sequences, or None (no padding).
        decode: the step's ``DecodeStep``, or None (no decodes).
        prefill: the step's ``PrefillStep``, or None (no prefill).
        verify: the step's ``VerifyStep``, or None (no verify rows).

    Checks: pages in ``[0, P)``; no page used twice by the live rows and sequences (those not on
    ``pad_page``) of the step, decode, verify and prefill together; padding sequences and rows (on
    ``pad_page``) empty; live verify rows 1..W tokens, off the pad page, accepted counts in
    ``[1, W]``; the boundaries start at 0, never decrease and end at most at T.

    Raises:
        ValueError: naming the argument (``prefill.pages``, ...), the expected and the actual value.
    """
    if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 1:
        raise ValueError(f"num_pages: expected an int >= 1, got {num_pages!r}")
    if pad_page is not None and (isinstance(pad_page, bool) or not isinstance(pad_page, int)
                                 or not 0 <= pad_page < num_pages):
        raise ValueError(f"pad_page: expected None or an int in [0, {num_pages}), got {pad_page!r}")
    _check_kind("decode", decode, DecodeStep)
    _check_kind("prefill", prefill, PrefillStep)
    _check_kind("verify", verify, VerifyStep)
    owners = {}
    if decode is not None:
        pages = _host(decode.pages)
        _check_pages("decode.pages", pages, num_pages, "row")
        for at, page in enumerate(pages):
            if page != pad_page:
                _claim(owners, page, "decode.pages", f"decode row {at}")
    if verify is not None:
        for at, row in enumerate(_check_verify(verify, num_pages, pad_page)):
            if any(page != pad_page for page in row):
                for position, page in enumerate(row):
                    _claim(owners, page, "verify.pages", f"verify row {at} position {position}")
    if prefill is not None:
        lengths, pages = _check_prefill(prefill, num_pages)
        for at, (length, page) in enumerate(zip(lengths, pages)):
            if page != pad_page:
                _claim(owners, page, "prefill.pages", f"prefill sequence {at}")
            elif length:
                raise ValueError(f"prefill.query_start_loc: expected padding sequences (on pad_page = {pad_page}) "
                                 f"to be empty, got {length} tokens for prefill sequence {at}")


def _claim(owners, page, name, who):
    if page in owners:
        raise ValueError(f"{name}: expected each live page used once in a step, got page {page} for "
                         f"{owners[page]} and {who}")
    owners[page] = who
