"""In-process vLLM engines for the end-to-end tests, and one in a child process.

A module of its own (not ``conftest``): a child process started with ``spawn`` finds
the functions it runs by module name, and the whole suite has more than one
``conftest`` module.
"""

import collections
import contextlib
import dataclasses
import gc
import os
import re

from .oracle import in_subprocess

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


@contextlib.contextmanager
def plugin_log_lines():
    """The INFO lines the vLLM shell's model module logs while the block runs (formatted), collected
    into the yielded list; they still reach the log."""
    from vllm_gdn_neuron.shells.vllm import qwen3_5

    lines: list[str] = []
    info = qwen3_5.logger.info

    def collect(message, *args):
        lines.append(message % args)
        info(message, *args)

    qwen3_5.logger.info = collect
    try:
        yield lines
    finally:
        qwen3_5.logger.info = info


def _greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int, engine_kwargs: dict,
            logprobs: int | None = None):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True, logprobs=logprobs)
    with engine(model_dir, **engine_kwargs) as llm:
        outs = [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
    if logprobs is None:
        return [list(o.token_ids) for o in outs]
    return [(list(o.token_ids), _top(o.logprobs, logprobs)) for o in outs]


def _top(steps, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """The ``k`` best-ranked tokens of each step and their logprobs, from vLLM's per-step dicts."""
    best = [sorted(step.items(), key=lambda item: item[1].rank)[:k] for step in steps]
    return [[token for token, _ in step] for step in best], [[lp.logprob for _, lp in step] for step in best]


def greedy_in_subprocess(model_dir: str, prompts: list[list[int]], max_new_tokens: int, **engine_kwargs):
    """Greedy ids of ``prompts`` (one batch) from an :func:`engine` in a fresh process.

    For multi-GB checkpoints: the process's memory goes back to the system when it
    exits, which an in-process engine's does not reliably do.
    """
    return in_subprocess(_greedy, model_dir, prompts, max_new_tokens, engine_kwargs)


def _greedy_compiled(model_dir: str, prompts: list[list[int]], max_new_tokens: int, engine_kwargs: dict):
    import logging

    import torch
    import torch._dynamo.utils
    from vllm import SamplingParams
    from vllm.compilation.counter import compilation_counter

    graph_code: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            graph_code.append(record.getMessage())

    torch._logging.set_logs(graph_code=True)
    graph_logger = logging.getLogger("torch._dynamo.output_graph.__graph_code")
    graph_logger.addHandler(_Keep())
    graph_logger.propagate = False  # kept, not printed
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True)
    with engine(model_dir, **engine_kwargs) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        stats = engine_kwargs.get("disable_log_stats") is False  # vLLM's LLM keeps none by default
        accepted = sum(m.value for m in (llm.get_metrics() if stats else [])
                       if m.name == "vllm:spec_decode_num_accepted_tokens" and hasattr(m, "value"))
    return [list(o.outputs[0].token_ids) for o in outs], CompileReport(
        graph_breaks=dict(torch._dynamo.utils.counters["graph_break"]),
        models=compilation_counter.num_models_seen,
        graphs=torch._dynamo.utils.counters["stats"]["unique_graphs"],
        graph_ops=[_graph_op_calls(code) for code in graph_code],
        accepted_drafts=int(accepted),
    )


@dataclasses.dataclass(frozen=True)
class CompileReport:
    """What vLLM's compiled mode did in one engine process.

    Attributes:
        graph_breaks: dynamo's graph breaks by reason.
        models: the modules vLLM handed to its compilation (``support_torch_compile``).
        graphs: the distinct graphs dynamo captured.
        graph_ops: per captured graph (in capture order), how often it calls each
            ``torch.ops`` operator (``vllm_gdn_neuron.gdn_core``, ``vllm.unified_attention_with_output``...).
        accepted_drafts: speculative tokens accepted (vLLM's counter; 0 without a drafter or
            unless the engine runs with ``disable_log_stats=False``).
    """

    graph_breaks: dict
    models: int
    graphs: int
    graph_ops: list[collections.Counter]
    accepted_drafts: int


def _graph_op_calls(graph_code: str) -> collections.Counter:
    """The ``torch.ops`` calls of one graph's code as dynamo prints it, by operator name (the
    graph's statements, not the source lines dynamo quotes in comments)."""
    statement = r'^\s*\w+(?:: "[^"]*")? = torch\.ops\.([\w.]+?)(?:\.default)?\('
    return collections.Counter(re.findall(statement, graph_code, flags=re.MULTILINE))


def greedy_compiled_in_subprocess(model_dir: str, prompts: list[list[int]], max_new_tokens: int, **engine_kwargs):
    """:func:`greedy_in_subprocess` with vLLM's compiled mode (``enforce_eager=False``): ``(ids,
    CompileReport)``, counted in that process alone."""
    return in_subprocess(_greedy_compiled, model_dir, prompts, max_new_tokens,
                         {**engine_kwargs, "enforce_eager": False})


def greedy_logprobs_in_subprocess(model_dir: str, prompts: list[list[int]], max_new_tokens: int, logprobs: int,
                                  **engine_kwargs):
    """:func:`greedy_in_subprocess` with vLLM's logprobs of each step's ``logprobs`` best tokens:
    per prompt ``(ids, tokens [steps][k], logprobs [steps][k])``."""
    return [(ids, *top) for ids, top in in_subprocess(_greedy, model_dir, prompts, max_new_tokens, engine_kwargs, logprobs)]
