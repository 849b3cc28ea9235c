"""Refusals of the model code (attention head split, prefix-cache state copies), each with its message."""

import types

import pytest
import torch


@pytest.mark.parametrize(("heads", "kv_heads", "tp"), [(4, 2, 3), (6, 4, 3), (4, 4, 8)])
def test_attention_heads_that_do_not_split_are_refused(heads, kv_heads, tp):
    from vllm_gdn_neuron.model.attention import check_attention_heads

    config = types.SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv_heads)
    with pytest.raises(ValueError, match=f"tensor_parallel_size must divide num_attention_heads={heads}.*got tensor_parallel_size={tp}"):
        check_attention_heads(config, tp)


@pytest.mark.parametrize(("heads", "kv_heads", "tp"), [(4, 2, 2), (4, 2, 4), (8, 1, 4)])
def test_attention_heads_that_split_pass(heads, kv_heads, tp):
    from vllm_gdn_neuron.model.attention import check_attention_heads

    check_attention_heads(types.SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv_heads), tp)


def test_prefix_cache_copies_the_whole_slot_of_the_current_block():
    from vllm_gdn_neuron.shells.vllm.qwen3_5 import Qwen3_5ForCausalLM

    conv_copy, ssm_copy = Qwen3_5ForCausalLM.get_mamba_state_copy_func()
    conv_state = torch.zeros(6, 5, 4)  # [blocks, C, K]
    ssm_state = torch.zeros(6, 2, 3, 4)  # [blocks, Hv, Dk, Dv]
    for copy_func, state in ((conv_copy, conv_state), (ssm_copy, ssm_state)):
        spec = copy_func(state, block_ids=[5, 2, 4], cur_block_idx=1, num_accepted_tokens=1)
        assert spec.start_addr == state[2].data_ptr()
        assert spec.num_elements == state[2].numel()


def test_prefix_cache_copy_after_a_speculative_step_reads_the_last_accepted_slot():
    """Both states keep one slot per draft position: 3 accepted tokens -> 2 slots past the block."""
    from vllm_gdn_neuron.shells.vllm.qwen3_5 import Qwen3_5ForCausalLM

    conv_state, ssm_state = torch.zeros(6, 5, 4), torch.zeros(6, 2, 3, 4)
    for copy_func, state in zip(Qwen3_5ForCausalLM.get_mamba_state_copy_func(), (conv_state, ssm_state)):
        spec = copy_func(state, block_ids=[5, 2, 4, 1, 3], cur_block_idx=1, num_accepted_tokens=3)
        assert spec.start_addr == state[1].data_ptr()
        assert spec.num_elements == state[1].numel()
    with pytest.raises(ValueError, match="num_accepted_tokens must be >= 1; got 0"):
        Qwen3_5ForCausalLM.get_mamba_state_copy_func()[0](conv_state, block_ids=[0, 1], cur_block_idx=0,
                                                          num_accepted_tokens=0)


def test_a_step_without_the_layers_metadata_is_refused_once_the_cache_is_bound():
    from vllm_gdn_neuron.shells.vllm.gated_deltanet import layer_metadata

    name = "model.layers.0.linear_attn"
    with pytest.raises(RuntimeError, match=f"{name}: no GatedDeltaNet metadata in this step \\(attn_metadata has no "
                                           "entry for the layer\\) although the layer's cache is bound"):
        layer_metadata({"model.layers.3.self_attn": object()}, name, cache_bound=True)
    with pytest.raises(RuntimeError, match="attn_metadata is None"):
        layer_metadata(None, name, cache_bound=True)


def test_only_the_profiling_run_without_a_cache_mixes_nothing():
    from vllm_gdn_neuron.shells.vllm.gated_deltanet import layer_metadata

    name = "model.layers.0.linear_attn"
    assert layer_metadata(None, name, cache_bound=False) is None
    entry = object()
    assert layer_metadata({name: entry}, name, cache_bound=True) is entry


def test_the_forward_context_keeps_the_gdn_metadata_built_once_per_metadata_object():
    from types import SimpleNamespace

    from vllm_gdn_neuron.shells.vllm.step import step_gdn_parts

    built = []

    def build(metadata, num_pages):
        built.append((metadata, num_pages))
        return f"parts of {metadata}"

    context = SimpleNamespace(additional_kwargs={})
    assert step_gdn_parts(context, "group-0", 9, build) == "parts of group-0"
    assert step_gdn_parts(context, "group-0", 9, build) == "parts of group-0"
    assert step_gdn_parts(context, "group-1", 9, build) == "parts of group-1"
    assert built == [("group-0", 9), ("group-1", 9)]
    step_gdn_parts(SimpleNamespace(additional_kwargs={}), "group-0", 9, build)  # the next forward builds its own
    assert len(built) == 3
