"""vllm-gdn-neuron: Qwen3.5 Gated DeltaNet hybrid models for vLLM on Trainium and CPU."""

__version__ = "0.1.0"
