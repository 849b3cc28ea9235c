"""vLLM's view of the Neuron shell under the vision-language names: a multimodal model with Qwen3.5's processor.

vllm-neuron's runner (whn09/vllm-neuron @ ``7ea99278``, ``__init__``) builds its encoder cache
and calls the model's ``embed_multimodal`` only when
``MULTIMODAL_REGISTRY.supports_multimodal_inputs(model_config)`` holds: the class vLLM's
registry resolves for the architecture must be ``SupportsMultiModal`` with a processor
registered, and the engine must take some modality (``limit-mm-per-prompt``). This module
is that class for ``VllmGdnNeuronQwen3_5ForConditionalGeneration`` and
``VllmGdnNeuronQwen3_5MoeForConditionalGeneration`` (:mod:`vllm_gdn_neuron.plugin`): the
registry entry of the text names (:mod:`vllm_gdn_neuron.shells.neuron.registry_entry`: what vLLM's
front end inspects, and ``from_configs`` for the runner, which builds the decoder with its tower,
:class:`vllm_gdn_neuron.shells.neuron.model.Qwen3_5NeuronForConditionalGeneration`, where images are
served and the text decoder alone where ``limit-mm-per-prompt`` is image 0, video 0), marked
multimodal, with the same processor as the CPU shell
(:mod:`vllm_gdn_neuron.shells.vision_processing`, no torchvision).

It sits beside :mod:`vllm_gdn_neuron.plugin`, outside both shells, because it joins them: the
Neuron shell's class and the CPU shell's vLLM processor (the shells do not import each
other). It imports vLLM (the registry's decorator), which :mod:`vllm_gdn_neuron.shells.neuron.model`
does not.
"""

from vllm.model_executor.models.interfaces import SupportsMultiModal
from vllm.multimodal import MULTIMODAL_REGISTRY

from vllm_gdn_neuron.shells.vision_processing import (
    Qwen3_5VisionDummyInputsBuilder,
    Qwen3_5VisionMultiModalProcessor,
    Qwen3_5VisionProcessingInfo,
    placeholder_str,
)
from vllm_gdn_neuron.shells.neuron.registry_entry import Qwen3_5NeuronRegistryEntry


@MULTIMODAL_REGISTRY.register_processor(
    Qwen3_5VisionMultiModalProcessor, info=Qwen3_5VisionProcessingInfo, dummy_inputs=Qwen3_5VisionDummyInputsBuilder
)
class Qwen3_5NeuronMultiModal(Qwen3_5NeuronRegistryEntry, SupportsMultiModal):
    """The registry entry of the vision-language names (the runner builds the shell with the inherited ``from_configs``)."""

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        return placeholder_str(modality)
