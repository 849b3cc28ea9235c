"""GDN kernels that know nothing of vLLM: float64 references, NKI kernels, the NKI interpreter.

Installed as ``vllm_gdn_neuron.kernels`` (see pyproject.toml's package-dir mapping).
"""
