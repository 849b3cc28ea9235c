"""vllm-gdn-neuron: Qwen3.5 Gated DeltaNet hybrid models for vLLM on Trainium and CPU."""

__version__ = "0.1.0"


def register() -> None:
    """The ``vllm.general_plugins`` entry point; see :mod:`vllm_gdn_neuron.plugin`."""
    from vllm_gdn_neuron.plugin import register as _register

    _register()
