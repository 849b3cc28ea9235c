"""The Neuron shell: Qwen3.5 / Qwen3-Next for vllm-neuron's model runner.

vllm-neuron drives a model through its own contract, not vLLM's: ``from_configs``
under ``torch.device("meta")``, ``load_weights(model_path, device, download_dir)``,
``get_kv_spec`` -> allocate -> ``bind_kv_cache``, then a forward compiled with
``torch.compile(fullgraph=True)`` that returns the logits of ``sampling_positions``.
This package adapts that contract to the shared model definition in
:mod:`vllm_gdn_neuron.model`; the pinned vllm-neuron version and its fields are in
:mod:`vllm_gdn_neuron.shells.neuron.contract`.
"""
