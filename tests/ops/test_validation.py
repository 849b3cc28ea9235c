"""Every bad input of the public ops is a ValueError naming the argument, raised before any write."""

import pytest
import torch

from vllm_gdn_neuron import ops
from vllm_gdn_neuron.ops.gdn2 import gdn2_prefill

from .ops_testing import make_gdn_inputs

T, HK, HV, DK, DV, C, K = 6, 1, 2, 4, 3, 5, 4


def _gdn(num_k_heads=HK, num_v_heads=HV):
    x = make_gdn_inputs([2, 4], num_k_heads, num_v_heads, DK, DV)
    return dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], cu_seqlens=x["cu_seqlens"],
                initial_state=x["initial_state"])


def _gdn2():
    x = make_gdn_inputs([2, 4], HK, HV, DK, DV, channel_gates=True)
    return dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], w=x["w"], cu_seqlens=x["cu_seqlens"],
                initial_state=x["initial_state"])


def _decode():
    x = make_gdn_inputs([1, 1, 1], HK, HV, DK, DV)
    return dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], state=torch.zeros(4, HV, DK, DV),
                state_indices=torch.tensor([0, 3, 1], dtype=torch.int32))


def _conv():
    return dict(x=torch.randn(T, C), weight=torch.randn(C, K), cu_seqlens=torch.tensor([0, 2, 6]),
                initial_state=torch.zeros(2, C, K))


def _conv_decode():
    return dict(x=torch.randn(3, C), weight=torch.randn(C, K), state=torch.zeros(4, C, K),
                state_indices=torch.tensor([2, 0, 1]))


def _call(op, args):
    positional = {
        ops.gdn_prefill: ("q", "k", "v", "g", "beta", "cu_seqlens"),
        gdn2_prefill: ("q", "k", "v", "g", "beta", "w", "cu_seqlens"),
        ops.gdn_decode: ("q", "k", "v", "g", "beta", "state", "state_indices"),
        ops.conv1d_prefill: ("x", "weight", "cu_seqlens"),
        ops.conv1d_decode: ("x", "weight", "state", "state_indices"),
    }[op]
    values = [args.pop(name) for name in positional]
    return op(*values, **args)


# (op, builder, argument to change, new value (callable of the valid args) or None to set, message pieces)
BAD = {
    "gdn-q-rank": (ops.gdn_prefill, _gdn, "q", lambda a: a["q"][0], ["q:", "3 dims"]),
    "gdn-q-dtype": (ops.gdn_prefill, _gdn, "q", lambda a: a["q"].half(), ["q:", "float32 or bfloat16", "float16"]),
    "gdn-q-not-tensor": (ops.gdn_prefill, _gdn, "q", lambda a: a["q"].tolist(), ["q:", "tensor", "list"]),
    "gdn-k-shape": (ops.gdn_prefill, _gdn, "k", lambda a: a["k"][:, :, :2], ["k:", "Dk=4", "(6, 1, 2)"]),
    "gdn-k-dtype": (ops.gdn_prefill, _gdn, "k", lambda a: a["k"].bfloat16(), ["k:", "float32", "bfloat16"]),
    "gdn-v-tokens": (ops.gdn_prefill, _gdn, "v", lambda a: a["v"][:5], ["v:", "T=6", "(5, 2, 3)"]),
    "gdn-heads-not-multiple": (ops.gdn_prefill, lambda: _gdn(2, 4), "v", lambda a: torch.randn(T, 3, DV), ["v:", "multiple", "Hv = 3"]),
    "gdn-g-shape": (ops.gdn_prefill, _gdn, "g", lambda a: a["g"][:, :1], ["g:", "Hv=2"]),
    "gdn-g-dtype": (ops.gdn_prefill, _gdn, "g", lambda a: a["g"].bfloat16(), ["g:", "float32", "bfloat16"]),
    "gdn-g-positive": (ops.gdn_prefill, _gdn, "g", lambda a: a["g"] + 2.0, ["g:", "<= 0"]),
    "gdn-g-nan": (ops.gdn_prefill, _gdn, "g", lambda a: a["g"] * float("nan"), ["g:", "<= 0", "nan"]),
    "gdn-beta-shape": (ops.gdn_prefill, _gdn, "beta", lambda a: a["beta"][:, None], ["beta:", "2 dims"]),
    "gdn-cu-dtype": (ops.gdn_prefill, _gdn, "cu_seqlens", lambda a: a["cu_seqlens"].float(),
                     ["cu_seqlens:", "int32 or int64", "float32"]),
    "gdn-cu-start": (ops.gdn_prefill, _gdn, "cu_seqlens", lambda a: torch.tensor([1, 2, 6]),
                     ["cu_seqlens:", "start at 0", "got 1"]),
    "gdn-cu-decreasing": (ops.gdn_prefill, _gdn, "cu_seqlens", lambda a: torch.tensor([0, 4, 2, 6]),
                          ["cu_seqlens:", "non-decreasing", "4 then 2"]),
    "gdn-cu-end": (ops.gdn_prefill, _gdn, "cu_seqlens", lambda a: torch.tensor([0, 2, 5]),
                   ["cu_seqlens:", "end at T = 6", "got 5"]),
    "gdn-cu-too-short": (ops.gdn_prefill, _gdn, "cu_seqlens", lambda a: torch.tensor([0]),
                         ["cu_seqlens:", "at least 2"]),
    "gdn-state-shape": (ops.gdn_prefill, _gdn, "initial_state", lambda a: a["initial_state"][:1], ["initial_state:", "N=2"]),
    "gdn-state-dtype": (ops.gdn_prefill, _gdn, "initial_state", lambda a: a["initial_state"].bfloat16(),
                        ["initial_state:", "float32", "bfloat16"]),
    "gdn-scale": (ops.gdn_prefill, _gdn, "scale", lambda a: "big", ["scale:", "real number", "str"]),
    "gdn-backend": (ops.gdn_prefill, _gdn, "backend", lambda a: "cuda", ["backend:", "'torch'", "'cuda'"]),
    "gdn2-g-shape": (gdn2_prefill, _gdn2, "g", lambda a: a["g"][..., 0], ["g:", "3 dims"]),
    "gdn2-beta-shape": (gdn2_prefill, _gdn2, "beta", lambda a: a["beta"][..., :2], ["beta:", "Dk=4"]),
    "gdn2-w-shape": (gdn2_prefill, _gdn2, "w", lambda a: a["w"][..., :1], ["w:", "Dv=3"]),
    "gdn2-w-dtype": (gdn2_prefill, _gdn2, "w", lambda a: a["w"].double(), ["w:", "float32", "float64"]),
    "gdn2-g-positive": (gdn2_prefill, _gdn2, "g", lambda a: a["g"].abs() + 0.1, ["g:", "<= 0"]),
    "gdn2-layout": (gdn2_prefill, _gdn2, "state_layout", lambda a: "kk", ["state_layout:", "'vk'", "'kk'"]),
    "gdn2-vk-state-shape": (gdn2_prefill, _gdn2, "state_layout", lambda a: "vk", ["initial_state:", "Dv=3"]),
    "decode-q-rank": (ops.gdn_decode, _decode, "q", lambda a: a["q"][:, 0], ["q:", "3 dims"]),
    "decode-v-rows": (ops.gdn_decode, _decode, "v", lambda a: a["v"][:2], ["v:", "N=3"]),
    "decode-g-shape": (ops.gdn_decode, _decode, "g", lambda a: a["g"][:2], ["g:", "N=3"]),
    "decode-state-dtype": (ops.gdn_decode, _decode, "state", lambda a: a["state"].bfloat16(),
                           ["state:", "float32", "bfloat16"]),
    "decode-state-shape": (ops.gdn_decode, _decode, "state", lambda a: a["state"][:, :, :2], ["state:", "Dk=4"]),
    "decode-index-out-of-range": (ops.gdn_decode, _decode, "state_indices", lambda a: torch.tensor([0, 4, 1]),
                                  ["state_indices:", "[0, 4)", "got 4"]),
    "decode-index-negative": (ops.gdn_decode, _decode, "state_indices", lambda a: torch.tensor([0, -2, 1]),
                              ["state_indices:", "PAD_SLOT_ID", "got -2"]),
    "decode-index-repeated": (ops.gdn_decode, _decode, "state_indices", lambda a: torch.tensor([1, 3, 1]),
                              ["state_indices:", "distinct", "slot 1 2 times"]),
    "decode-index-dtype": (ops.gdn_decode, _decode, "state_indices", lambda a: torch.tensor([0.0, 1.0, 2.0]),
                           ["state_indices:", "int32 or int64"]),
    "decode-index-length": (ops.gdn_decode, _decode, "state_indices", lambda a: torch.tensor([0, 1]),
                            ["state_indices:", "N=3"]),
    "decode-g-positive": (ops.gdn_decode, _decode, "g", lambda a: a["g"] + 1.0, ["g:", "<= 0"]),
    "conv-x-rank": (ops.conv1d_prefill, _conv, "x", lambda a: a["x"][None], ["x:", "2 dims"]),
    "conv-x-dtype": (ops.conv1d_prefill, _conv, "x", lambda a: a["x"].double(), ["x:", "float32 or bfloat16"]),
    "conv-weight-channels": (ops.conv1d_prefill, _conv, "weight", lambda a: a["weight"][:4], ["weight:", "C=5"]),
    "conv-weight-width": (ops.conv1d_prefill, _conv, "weight", lambda a: a["weight"][:, :0], ["weight:", "K >= 1"]),
    "conv-state-shape": (ops.conv1d_prefill, _conv, "initial_state", lambda a: a["initial_state"][:, :, :3],
                         ["initial_state:", "K=4"]),
    "conv-state-dtype": (ops.conv1d_prefill, _conv, "initial_state", lambda a: a["initial_state"].bfloat16(),
                         ["initial_state:", "float32", "bfloat16"]),
    "conv-cu-end": (ops.conv1d_prefill, _conv, "cu_seqlens", lambda a: torch.tensor([0, 2, 7]), ["cu_seqlens:", "T = 6"]),
    "conv-activation": (ops.conv1d_prefill, _conv, "activation", lambda a: "gelu", ["activation:", "'silu'", "'gelu'"]),
    "conv-decode-state-shape": (ops.conv1d_decode, _conv_decode, "state", lambda a: a["state"][:, :4],
                                ["state:", "C=5"]),
    "conv-decode-index-repeated": (ops.conv1d_decode, _conv_decode, "state_indices", lambda a: torch.tensor([2, 2, 1]),
                                   ["state_indices:", "distinct"]),
    "conv-decode-index-range": (ops.conv1d_decode, _conv_decode, "state_indices", lambda a: torch.tensor([2, 9, 1]),
                                ["state_indices:", "[0, 4)", "got 9"]),
    "conv-decode-backend": (ops.conv1d_decode, _conv_decode, "backend", lambda a: None, ["backend:", "None"]),
}


@pytest.mark.parametrize("op, build, name, bad, pieces", BAD.values(), ids=BAD.keys())
def test_bad_argument_is_a_value_error_naming_it_and_nothing_is_written(op, build, name, bad, pieces):
    args = build()
    args[name] = bad(args)
    snapshot = {key: value.clone() for key, value in args.items() if isinstance(value, torch.Tensor)}
    with pytest.raises(ValueError) as error:
        _call(op, dict(args))
    message = str(error.value)
    for piece in pieces:
        assert piece in message, (piece, message)
    for key, before in snapshot.items():
        assert torch.equal(args[key], before) or torch.isnan(before).any(), key


def test_tensors_on_different_devices_are_refused():
    args = _gdn()
    args["initial_state"] = args["initial_state"].to("meta")
    with pytest.raises(ValueError, match="initial_state: expected device cpu"):
        _call(ops.gdn_prefill, args)
