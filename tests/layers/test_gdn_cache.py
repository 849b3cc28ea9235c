"""State shapes / dtypes of the GatedDeltaNet cache slots, the start-up refusals, bf16 staging."""

import types

import pytest
import torch

from vllm_gdn_neuron.layers.gdn_cache import check_gdn_config, gdn_state_dtypes, gdn_state_shapes


def _config(**overrides):
    base = dict(
        linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, hidden_act="silu",
    )
    return types.SimpleNamespace(**{**base, **overrides})


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_state_shapes_are_conv_c_by_k_and_k_major_recurrent(tp):
    conv, recurrent = gdn_state_shapes(_config(), tp)
    assert conv == ((2 * 4 * 32 + 8 * 16) // tp, 4)
    assert recurrent == (8 // tp, 32, 16)


def test_state_dtypes_default_to_model_dtype_conv_and_fp32_recurrent():
    assert gdn_state_dtypes(torch.bfloat16, "auto", "auto") == (torch.bfloat16, torch.float32)
    assert gdn_state_dtypes(torch.bfloat16, "float32", "bfloat16") == (torch.float32, torch.bfloat16)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(config=_config(linear_num_value_heads=6)), "linear_num_value_heads must be a positive multiple"),
        (dict(config=_config(linear_num_key_heads=0)), "linear_num_value_heads must be a positive multiple"),
        (dict(tp_size=8), "tensor_parallel_size must divide linear_num_key_heads=4"),
        (dict(config=_config(linear_conv_kernel_dim=0)), "linear_conv_kernel_dim must be >= 1; got 0"),
        (dict(config=_config(hidden_act="gelu")), "hidden_act must be 'silu'"),
        (dict(num_speculative_tokens=2), "num_speculative_tokens must be 0\\); got num_speculative_tokens=2"),
        (dict(mamba_ssm_cache_dtype="float16"), "mamba_ssm_cache_dtype must be one of"),
        (dict(quantization="fp8"), "quantized checkpoints are not supported.*got quantization='fp8'"),
    ],
)
def test_unservable_configs_are_refused(kwargs, message):
    args = dict(config=_config(), tp_size=1, num_speculative_tokens=0, mamba_ssm_cache_dtype="auto")
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        check_gdn_config(args.pop("config"), **args)


def test_servable_config_passes():
    check_gdn_config(_config(), tp_size=2, num_speculative_tokens=0, mamba_ssm_cache_dtype="bfloat16")


def test_a_bf16_recurrent_cache_is_staged_through_fp32_rows():
    """``--mamba-ssm-cache-dtype bfloat16``: same output as an fp32 cache holding the same values."""
    from vllm_gdn_neuron.layers.gated_deltanet import GatedDeltaNet

    torch.manual_seed(0)
    n, hk, hv, dk, dv, slots_total = 3, 2, 4, 8, 6, 5
    q, k = torch.randn(n, hk, dk), torch.randn(n, hk, dk)
    v = torch.randn(n, hv, dv)
    g, beta = -torch.rand(n, hv) * 3, torch.rand(n, hv)
    cache_bf16 = torch.randn(slots_total, hv, dk, dv).to(torch.bfloat16)
    cache_fp32 = cache_bf16.float()
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)

    want = GatedDeltaNet._decode_recurrence(q, k, v, g, beta, cache_fp32, slots)
    untouched = cache_bf16[[1, 3]].clone()
    got = GatedDeltaNet._decode_recurrence(q, k, v, g, beta, cache_bf16, slots)

    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(cache_bf16[slots.long()], cache_fp32[slots.long()].to(torch.bfloat16), rtol=0, atol=0)
    torch.testing.assert_close(cache_bf16[[1, 3]], untouched, rtol=0, atol=0)
