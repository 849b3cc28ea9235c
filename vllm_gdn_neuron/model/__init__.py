"""vLLM layers: the GatedDeltaNet layer in the mamba-style cache."""
