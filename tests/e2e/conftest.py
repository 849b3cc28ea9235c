"""Fixtures of the end-to-end tests: the tiny checkpoints and in-process vLLM engines."""

import concurrent.futures
import contextlib
import gc
import importlib.util
import multiprocessing
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


@pytest.fixture(scope="session")
def real_dims_checkpoint(tmp_path_factory):
    """``name -> folder`` of a random checkpoint with published per-layer dims
    (``builder.REAL_MODELS``), each built on first use (1.5-2.6 GB, ~25 s) and kept for
    the session."""
    out = tmp_path_factory.mktemp("real-dims")
    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = str(builder.build(name, out))
        return built[name]

    return get


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


def _greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int, engine_kwargs: dict) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True)
    with engine(model_dir, **engine_kwargs) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


def greedy_in_subprocess(model_dir: str, prompts: list[list[int]], max_new_tokens: int, **engine_kwargs):
    """Greedy ids of ``prompts`` (one batch) from an :func:`engine` in a fresh process.

    For multi-GB checkpoints: the process's memory goes back to the system when it
    exits, which an in-process engine's does not reliably do.
    """
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_greedy, model_dir, prompts, max_new_tokens, engine_kwargs).result()
