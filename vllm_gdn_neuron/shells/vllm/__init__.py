"""Qwen3.5 / Qwen3-Next models for vLLM."""
