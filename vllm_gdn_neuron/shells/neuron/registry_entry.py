"""The class vLLM's model registry holds for this plugin's Neuron names (``VllmGdnNeuron*``).

Two readers look it up, in different processes:

- **vLLM's front end** (the API server, the engine core, every worker: wherever an engine
  config is built) inspects the class while it validates the model config. It must look like
  one of vLLM's text-generation models (a constructor taking ``vllm_config``,
  ``embed_input_ids``, ``forward(input_ids, positions, ...)``, ``compute_logits``), or vLLM stops
  with "This model does not support `--runner generate`"; and it must say that the model is
  hybrid, with the GatedDeltaNet state shapes and dtypes that the platform's hybrid page
  alignment sizes pages from.
- **vllm-neuron's runner** (the workers) builds the model with :meth:`from_configs`, which
  returns the Neuron shell itself, :class:`~.model.Qwen3_5NeuronForCausalLM` (or
  :class:`~.model.Qwen3_5NeuronForConditionalGeneration` where images are served). The
  runner never instantiates this class, so the workers' model is always the shell.

The interface methods are the shell's own (the same functions), so what the front end
inspects is what the workers run. Only vLLM's own model runner would call the constructor,
and it never runs these names: the plugin registers them on Neuron only.
"""

from .model import Qwen3_5NeuronForCausalLM


class Qwen3_5NeuronRegistryEntry:
    """vLLM's view of the Neuron shell; :meth:`from_configs` builds the shell."""

    is_hybrid = True
    has_inner_state = True

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        raise TypeError(
            f"{type(self).__name__} is the registry entry of the Neuron shell: vllm-neuron's runner builds the model "
            f"with {type(self).__name__}.from_configs(hf_config, neuron_config) "
            f"(-> {Qwen3_5NeuronForCausalLM.__name__}); vLLM's own model runner cannot serve it")

    from_configs = staticmethod(Qwen3_5NeuronForCausalLM.from_configs)
    get_mamba_state_shape_from_config = staticmethod(Qwen3_5NeuronForCausalLM.get_mamba_state_shape_from_config)
    get_mamba_state_dtype_from_config = staticmethod(Qwen3_5NeuronForCausalLM.get_mamba_state_dtype_from_config)
    embed_input_ids = Qwen3_5NeuronForCausalLM.embed_input_ids
    forward = Qwen3_5NeuronForCausalLM.forward
    compute_logits = Qwen3_5NeuronForCausalLM.compute_logits
