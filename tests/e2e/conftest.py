"""Fixtures of the end-to-end tests: the tiny checkpoints and in-process vLLM engines."""

import contextlib
import gc
import importlib.util
import os
import pathlib

import pytest

# In-process engine (no engine-core subprocess): starts in seconds, and this process
# sees the engine's errors directly.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

REPO = pathlib.Path(__file__).resolve().parents[2]


def _load_builder():
    spec = importlib.util.spec_from_file_location("build_tiny_models", REPO / "configs" / "build_tiny_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


builder = _load_builder()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """All tiny checkpoints, built once per test session: name -> folder."""
    out = tmp_path_factory.mktemp("tiny-models")
    return {name: str(builder.build(name, out)) for name in builder.MODELS}


# Small enough for a shared 2-core machine; small batches force chunked prefill.
ENGINE_DEFAULTS = dict(
    enforce_eager=True,
    max_model_len=2048,
    max_num_seqs=8,
    max_num_batched_tokens=128,
    gpu_memory_utilization=0.1,
    kv_cache_memory_bytes=64 * 2**20,
    seed=0,
)


@contextlib.contextmanager
def engine(model_dir: str, **kwargs):
    """An in-process ``vllm.LLM``, torn down (distributed state included) on exit,
    also when start-up itself fails."""
    from vllm import LLM
    from vllm.distributed import cleanup_dist_env_and_memory

    llm = None
    try:
        llm = LLM(model=model_dir, **{**ENGINE_DEFAULTS, **kwargs})
        yield llm
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()
