"""State shapes / dtypes of the GatedDeltaNet cache slots and the start-up refusals."""

import types

import pytest
import torch

from vllm_gdn_neuron.model.gdn_cache import check_gdn_config, conv_state_view, gdn_state_dtypes, gdn_state_shapes


def _config(**overrides):
    base = dict(
        linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, hidden_act="silu",
    )
    return types.SimpleNamespace(**{**base, **overrides})


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_state_shapes_are_channel_fast_conv_and_k_major_recurrent(tp):
    conv, recurrent = gdn_state_shapes(_config(), tp)
    assert conv == (4, (2 * 4 * 32 + 8 * 16) // tp)
    assert recurrent == (8 // tp, 32, 16)


def test_conv_state_view_is_the_ops_c_by_k_view_without_a_copy():
    pages = torch.arange(2 * 4 * 6, dtype=torch.float32).view(2, 4, 6)    # [P, K, C]
    view = conv_state_view(pages)
    assert view.shape == (2, 6, 4) and view.stride(1) == 1
    assert view.data_ptr() == pages.data_ptr()
    view[1, 5, 2] = -1.0
    assert pages[1, 2, 5] == -1.0


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
        (dict(num_speculative_tokens=2, prefix_caching=True),
         "speculative decoding with prefix caching.*got num_speculative_tokens=2, enable_prefix_caching=True"),
        (dict(mamba_ssm_cache_dtype="float16"), "mamba_ssm_cache_dtype must be one of"),
        (dict(quantization="gptq"), "quantization 'gptq' is not supported by the vllm-gdn-neuron models: they load "
                                    "unquantized .* and block-FP8 ones .*; got quantization='gptq'"),
    ],
)
def test_unservable_configs_are_refused(kwargs, message):
    args = dict(config=_config(), tp_size=1, num_speculative_tokens=0, mamba_ssm_cache_dtype="auto")
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        check_gdn_config(args.pop("config"), **args)


def test_servable_config_passes():
    check_gdn_config(_config(), tp_size=2, num_speculative_tokens=0, mamba_ssm_cache_dtype="bfloat16")
    check_gdn_config(_config(), tp_size=1, num_speculative_tokens=3, mamba_ssm_cache_dtype="auto",
                     prefix_caching=False)
    check_gdn_config(_config(), tp_size=1, num_speculative_tokens=0, mamba_ssm_cache_dtype="auto", quantization="fp8")
