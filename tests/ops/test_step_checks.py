"""check_step refuses bad step metadata with a ValueError naming the argument (host side, once
per step); the paged ops refuse bad shapes and dtypes before writing anything."""

import pytest
import torch

from vllm_gdn_neuron import ops

from .ops_testing import make_gdn_inputs

PAGES, PAD = 8, 0


def _metadata():
    return dict(decode_pages=torch.tensor([3, 0, 5]), prefill_query_start_loc=torch.tensor([0, 4, 9, 9], dtype=torch.int32),
                prefill_pages=torch.tensor([2, 7, 0]), prefill_has_state=torch.tensor([True, False, False]),
                num_prefill_tokens=12)


def _check(num_pages, pad_page, decode_pages=None, prefill_query_start_loc=None, prefill_pages=None,
           prefill_has_state=None, num_prefill_tokens=None):
    """Build the step's parts from its metadata (``build`` checks shapes and dtypes), then check_step."""
    decode = None if decode_pages is None else ops.DecodeStep.build(decode_pages, PAD)
    prefill = None if prefill_query_start_loc is None else ops.PrefillStep.build(
        prefill_query_start_loc, prefill_pages, prefill_has_state, num_prefill_tokens)
    ops.check_step(num_pages, pad_page, decode=decode, prefill=prefill)


def test_a_valid_step_passes():
    _check(PAGES, PAD, **_metadata())
    ops.check_step(PAGES, decode=ops.DecodeStep.build(torch.tensor([1, 2], dtype=torch.int32)))
    meta = _metadata()
    del meta["decode_pages"]
    _check(PAGES, PAD, **meta)


# argument -> (new value, message pieces)
BAD_STEPS = {
    "num-pages": ("num_pages", 0, ["num_pages:", ">= 1", "0"]),
    "pad-page-range": ("pad_page", 8, ["pad_page:", "[0, 8)", "8"]),
    # shapes and dtypes: refused by the step's build, naming its argument
    "decode-dtype": ("decode_pages", torch.tensor([1.0, 2.0]), ["pages:", "int32 or int64", "float32"]),
    "decode-rank": ("decode_pages", torch.tensor([[1, 2]]), ["pages:", "1 dims"]),
    "qsl-short": ("prefill_query_start_loc", torch.tensor([0]), ["query_start_loc:", "S+1=4", "(1,)"]),
    "qsl-dtype": ("prefill_query_start_loc", torch.tensor([0.0, 4.0, 9.0, 9.0]), ["query_start_loc:", "int32"]),
    "prefill-pages-length": ("prefill_pages", torch.tensor([2, 7]), ["query_start_loc:", "S+1=3", "(4,)"]),
    "has-state-dtype": ("prefill_has_state", torch.tensor([1, 0, 0]), ["has_state:", "bool", "int64"]),
    "has-state-length": ("prefill_has_state", torch.tensor([True]), ["has_state:", "S=3"]),
    "tokens-type": ("num_prefill_tokens", 12.0, ["num_tokens:", "int >= 0", "12.0"]),
    # values: refused by check_step, naming the step's field
    "decode-range": ("decode_pages", torch.tensor([3, 8, 5]), ["decode.pages:", "[0, 8)", "got 8 for row 1"]),
    "decode-negative": ("decode_pages", torch.tensor([3, -1, 5]), ["decode.pages:", "got -1"]),
    "decode-repeated": ("decode_pages", torch.tensor([3, 5, 5]), ["decode.pages:", "page 5", "decode row 1 and decode row 2"]),
    "decode-vs-prefill": ("decode_pages", torch.tensor([7, 0, 5]),
                          ["prefill.pages:", "page 7", "decode row 0 and prefill sequence 1"]),
    "qsl-start": ("prefill_query_start_loc", torch.tensor([1, 4, 9, 9]), ["prefill.query_start_loc:", "start at 0", "got 1"]),
    "qsl-decreasing": ("prefill_query_start_loc", torch.tensor([0, 6, 4, 9]),
                       ["prefill.query_start_loc:", "non-decreasing", "6 then 4 at index 1"]),
    "qsl-end": ("prefill_query_start_loc", torch.tensor([0, 4, 13, 13]),
                ["prefill.query_start_loc:", "at most at prefill.num_tokens = 12", "got 13"]),
    "prefill-pages-range": ("prefill_pages", torch.tensor([2, 9, 0]), ["prefill.pages:", "got 9 for sequence 1"]),
    "prefill-pages-repeated": ("prefill_pages", torch.tensor([2, 2, 0]),
                               ["prefill.pages:", "page 2", "prefill sequence 0 and prefill sequence 1"]),
    "prefill-pad-page-not-empty": ("prefill_pages", torch.tensor([2, 0, 0]),
                                   ["prefill.query_start_loc:", "padding sequences", "5 tokens for prefill sequence 1"]),
}


@pytest.mark.parametrize("name, value, pieces", BAD_STEPS.values(), ids=BAD_STEPS.keys())
def test_bad_step_metadata_is_a_value_error_naming_it(name, value, pieces):
    args = dict(num_pages=PAGES, pad_page=PAD, **_metadata())
    args[name] = value
    with pytest.raises(ValueError) as error:
        _check(**args)
    for piece in pieces:
        assert piece in str(error.value), (piece, str(error.value))


def test_a_prefill_without_sequences_is_refused():
    empty = torch.zeros(0, dtype=torch.int64)
    with pytest.raises(ValueError, match="prefill.query_start_loc: expected at least 2 entries"):
        ops.check_step(PAGES, PAD, prefill=ops.PrefillStep.build(torch.tensor([0]), empty, empty.bool(), 4))


def test_a_part_of_the_wrong_kind_is_refused():
    with pytest.raises(ValueError, match="prefill: expected None or a PrefillStep, got DecodeStep"):
        ops.check_step(PAGES, PAD, prefill=ops.DecodeStep.build(torch.tensor([1])))


def _decode_args():
    x = make_gdn_inputs([1, 1, 1], 1, 2, 4, 3, with_state=False)
    step = ops.DecodeStep.build(torch.tensor([3, 0, 5]), PAD)
    return dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], ssm_cache=torch.zeros(PAGES, 2, 4, 3),
                step=step)


def _prefill_args():
    x = make_gdn_inputs([12], 1, 2, 4, 3, with_state=False)
    step = ops.PrefillStep.build(torch.tensor([0, 4, 9, 9]), torch.tensor([2, 7, 0]),
                                 torch.tensor([True, False, False]), 12)
    return dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], ssm_cache=torch.zeros(PAGES, 2, 4, 3),
                step=step)


def _conv_args(prefill):
    rows = 12 if prefill else 3
    step = _prefill_args()["step"] if prefill else _decode_args()["step"]
    return dict(x=torch.randn(rows, 5), weight=torch.randn(5, 4), conv_cache=torch.zeros(PAGES, 5, 4), step=step)


GDN_ORDER = ("q", "k", "v", "g", "beta", "ssm_cache", "step")
CONV_ORDER = ("x", "weight", "conv_cache", "step")
# (op, argument builder, argument order, argument, new value (callable of the args), message pieces)
BAD_CALLS = {
    "decode-rows": (ops.paged_gdn_decode, _decode_args, GDN_ORDER, "q", lambda a: a["q"][:2], ["q:", "N=3", "(2, 1, 4)"]),
    "decode-cache-heads": (ops.paged_gdn_decode, _decode_args, GDN_ORDER, "ssm_cache",
                           lambda a: torch.zeros(PAGES, 3, 4, 3), ["ssm_cache:", "Hv=2"]),
    "decode-cache-dtype": (ops.paged_gdn_decode, _decode_args, GDN_ORDER, "ssm_cache",
                           lambda a: a["ssm_cache"].half(), ["ssm_cache:", "float32 or bfloat16", "float16"]),
    "decode-g-dtype": (ops.paged_gdn_decode, _decode_args, GDN_ORDER, "g", lambda a: a["g"].double(),
                       ["g:", "float32", "float64"]),
    "decode-step-kind": (ops.paged_gdn_decode, _decode_args, GDN_ORDER, "step", lambda a: _prefill_args()["step"],
                         ["step:", "DecodeStep", "PrefillStep"]),
    "decode-scale": (ops.paged_gdn_decode, _decode_args, GDN_ORDER, "scale", lambda a: "x", ["scale:", "str"]),
    "prefill-tokens": (ops.paged_gdn_prefill, _prefill_args, GDN_ORDER, "v", lambda a: a["v"][:11],
                       ["v:", "T=12", "(11, 2, 3)"]),
    "prefill-key-heads": (ops.paged_gdn_prefill, _prefill_args, GDN_ORDER, "q", lambda a: torch.randn(12, 2, 4),
                          ["k:", "Hk=2", "(12, 1, 4)"]),
    "prefill-step-kind": (ops.paged_gdn_prefill, _prefill_args, GDN_ORDER, "step", lambda a: None,
                          ["step:", "PrefillStep", "NoneType"]),
    "conv-decode-cache-width": (ops.paged_conv1d_decode, lambda: _conv_args(False), CONV_ORDER, "conv_cache",
                                lambda a: torch.zeros(PAGES, 5, 3), ["conv_cache:", "K=4"]),
    "conv-decode-cache-dtype": (ops.paged_conv1d_decode, lambda: _conv_args(False), CONV_ORDER, "conv_cache",
                                lambda a: a["conv_cache"].bfloat16(), ["conv_cache:", "float32", "bfloat16"]),
    "conv-prefill-tokens": (ops.paged_conv1d_prefill, lambda: _conv_args(True), CONV_ORDER, "x",
                            lambda a: a["x"][:10], ["x:", "T=12", "(10, 5)"]),
    "conv-prefill-weight": (ops.paged_conv1d_prefill, lambda: _conv_args(True), CONV_ORDER, "weight",
                            lambda a: a["weight"][:4], ["weight:", "C=5"]),
    "conv-activation": (ops.paged_conv1d_prefill, lambda: _conv_args(True), CONV_ORDER, "activation",
                        lambda a: "relu", ["activation:", "'relu'"]),
}


@pytest.mark.parametrize("op, build, order, name, bad, pieces", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_paged_op_argument_is_a_value_error_and_no_cache_is_written(op, build, order, name, bad, pieces):
    args = build()
    args[name] = bad(args)
    cache_name = "ssm_cache" if "ssm_cache" in args else "conv_cache"
    cache = args[cache_name]
    before = cache.clone() if isinstance(cache, torch.Tensor) else None
    positional = [args.pop(key) for key in order]
    with pytest.raises(ValueError) as error:
        op(*positional, **args)
    for piece in pieces:
        assert piece in str(error.value), (piece, str(error.value))
    assert torch.equal(cache, before)


BUILD = dict(query_start_loc=torch.tensor([0, 4, 9]), pages=torch.tensor([2, 7]), has_state=torch.tensor([True, False]),
             num_tokens=12)
BAD_BUILDS = {
    "qsl-length": ("query_start_loc", torch.tensor([0, 4]), ["query_start_loc:", "S+1=3", "(2,)"]),
    "qsl-dtype": ("query_start_loc", torch.tensor([0.0, 4.0, 9.0]), ["query_start_loc:", "int32 or int64"]),
    "pages-rank": ("pages", torch.tensor([[2, 7]]), ["pages:", "1 dims"]),
    "has-state-dtype": ("has_state", torch.tensor([1, 0]), ["has_state:", "bool", "int64"]),
    "num-tokens": ("num_tokens", -1, ["num_tokens:", "int >= 0", "-1"]),
}


@pytest.mark.parametrize("name, value, pieces", BAD_BUILDS.values(), ids=BAD_BUILDS.keys())
def test_bad_prefill_step_build_is_a_value_error_naming_it(name, value, pieces):
    args = dict(BUILD, **{name: value})
    with pytest.raises(ValueError) as error:
        ops.PrefillStep.build(**args)
    for piece in pieces:
        assert piece in str(error.value), (piece, str(error.value))


def test_bad_decode_step_build_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="pages: expected dtype int32 or int64, got torch.float32"):
        ops.DecodeStep.build(torch.tensor([1.0, 2.0]), PAD)
