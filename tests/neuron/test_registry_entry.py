"""The Neuron names' registry entry: a text-generation model to vLLM's front end, the Neuron shell to the runner.

vLLM's model-config validation asks its registry whether the architecture's class is a
text-generation model (``is_text_generation_model``: a constructor taking ``vllm_config``,
``embed_input_ids``, ``forward(input_ids, positions)``, ``compute_logits``) and whether it is
hybrid; the Neuron shell's own class (built by ``from_configs``) is neither in vLLM's sense. The
whole route through vLLM's front end: ``test_front_end.py``.
"""

import pytest
import torch

from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM
from vllm_gdn_neuron.shells.neuron.registry_entry import Qwen3_5NeuronRegistryEntry

from .runner import NeuronConfigStandIn


@pytest.mark.vllm024
def test_vllm_sees_a_hybrid_text_generation_model_and_not_the_shell_alone():
    from vllm.model_executor.models.interfaces import is_hybrid
    from vllm.model_executor.models.interfaces_base import is_text_generation_model

    from vllm_gdn_neuron.shells.neuron.multimodal_entry import Qwen3_5NeuronMultiModal

    for entry in (Qwen3_5NeuronRegistryEntry, Qwen3_5NeuronMultiModal):
        assert is_text_generation_model(entry) and is_hybrid(entry)
    assert not is_text_generation_model(Qwen3_5NeuronForCausalLM)


def test_the_interface_vllm_inspects_is_the_shells_own():
    for name in ("forward", "embed_input_ids", "compute_logits"):
        assert getattr(Qwen3_5NeuronRegistryEntry, name) is getattr(Qwen3_5NeuronForCausalLM, name)


@pytest.mark.vllm024
def test_from_configs_builds_the_shell_and_the_constructor_refuses(tiny_model):
    import transformers

    config = transformers.AutoConfig.from_pretrained(tiny_model("qwen3_5-dense"))
    with torch.device("meta"):
        model = Qwen3_5NeuronRegistryEntry.from_configs(config, NeuronConfigStandIn(on_device_sampling_config=None))
    assert type(model) is Qwen3_5NeuronForCausalLM
    with pytest.raises(TypeError, match=r"Qwen3_5NeuronRegistryEntry.from_configs\(hf_config, neuron_config\)"):
        Qwen3_5NeuronRegistryEntry(vllm_config=None)


def test_the_shells_vllm_named_methods_are_its_embedding_and_its_head(tiny_model):
    import transformers

    config = transformers.AutoConfig.from_pretrained(tiny_model("qwen3_5-dense"))
    config.dtype = torch.float32
    model = Qwen3_5NeuronForCausalLM(config, NeuronConfigStandIn(on_device_sampling_config=None))
    ids = torch.tensor([0, 5, 7])
    assert torch.equal(model.embed_input_ids(ids), model.model.embed_tokens.weight[ids])
    hidden = torch.randn(2, config.hidden_size)
    assert torch.allclose(model.compute_logits(hidden), hidden @ model.lm_head.weight.T)
