"""The two engines' shells around the engine-free model: ``vllm`` (vLLM's own runner) and ``neuron`` (vllm-neuron's runner on trn2)."""
