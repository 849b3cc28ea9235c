"""The Qwen3.5 / Qwen3-Next model definition, engine-free: the decoder, its LM and MTP heads, the
vision tower, the layers' math and the parameter layout; each shell builds it from its parts."""
