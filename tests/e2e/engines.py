"""In-process vLLM engines for the end-to-end tests, and one in a child process.

A module of its own (not ``conftest``): a child process started with ``spawn`` finds
the functions it runs by module name, and the whole suite has more than one
``conftest`` module.
"""

import concurrent.futures
import contextlib
import gc
import multiprocessing
import os

# In-process engine (no engine-core subprocess): starts in seconds, and this process
# sees the engine's errors directly.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

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
