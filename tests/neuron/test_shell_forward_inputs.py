"""The runner's optional forward inputs: M-RoPE positions, prompt embeddings and the logit mask.

vllm-neuron's runner (whn09/vllm-neuron@7ea99278 ``neuron_model_runner.py``,
``_execute_model_forward`` and the warm-up input builders) passes, besides the always-present
keywords,

- ``rotary_position_ids [3, T]`` int64 when the model config uses M-RoPE (text tokens: the
  same position on all three axes);
- ``inputs_embeds [T, H]`` (bfloat16) with ``is_token_ids [T]`` bool when prompt embeds are
  enabled (True: the id's embedding, False: the prompt embedding; zeros / all True on steps
  without prompt embeds);
- ``logit_mask [R, V]`` bool when ``neuron_config.enable_structured_outputs`` is set (all
  True with host sampling: the grammar is applied to the returned logits on the host).

Each is checked on a workload of prefills and decode steps served through the harness, by
two runners on the same checkpoint: one given the plain inputs, one the optional input
carrying the same information. fp32 claims are exact (``torch.equal``).
"""

import pytest
import torch

from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM

from .runner import EngineSettings, NeuronRunnerStandIn, Request, host_reads

PROMPTS = ([5, 17, 42, 9, 300, 11, 250, 3, 77, 120, 64], [8, 400, 21, 6, 99])
DECODE_STEPS = 3


class ForwardTap:
    """Stands between the harness and the model: adds keywords to every step and keeps the logits.

    Args:
        forward: the harness's (compiled or eager) forward.
        extra: ``extra(kwargs) -> dict`` of keywords to add to a step, from the step's own.
        host_mask: keep a ``logit_mask`` of ``extra`` from the model and apply it to the
            returned logits here instead (what the runner does with host sampling).
    """

    def __init__(self, forward, extra=None, host_mask=False) -> None:
        self.forward, self.extra, self.host_mask, self.logits = forward, extra, host_mask, []

    def __call__(self, **kwargs):
        if self.extra is not None:
            kwargs.update(self.extra(kwargs))
        mask = kwargs.pop("logit_mask") if self.host_mask else None
        logits = self.forward(**kwargs, logit_mask=None) if self.host_mask else self.forward(**kwargs)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        self.logits.append(logits)
        return logits


def make_runner(model_dir, dtype="float32", compile=False) -> NeuronRunnerStandIn:
    """The runner stand-in loaded and its caches bound (one 16-token prefill bucket, one 2-row decode bucket)."""
    settings = EngineSettings(model=model_dir, dtype=dtype, max_num_seqs=2, num_gpu_blocks_override=12,
                              additional_config={"neuron_config": dict(num_batched_tokens_buckets=[16],
                                                                       num_seqs_buckets=[2],
                                                                       on_device_sampling_config=None)})
    runner = NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, settings, compile=compile)
    runner.load_model()
    runner.initialize_kv_cache(runner.get_kv_cache_spec())
    return runner


def serve_workload(model_dir, extra_for=None, dtype="float32", compile=False, warm_up=False, host_mask=False):
    """Prefill ``PROMPTS`` one by one, then ``DECODE_STEPS`` decode steps of both.

    Args:
        extra_for: ``extra_for(runner) -> extra`` (see :class:`ForwardTap`), or None.

    Returns:
        ``(tap, runner)``: ``tap.logits`` holds every step's logits after warm-up.
    """
    runner = make_runner(model_dir, dtype, compile)
    tap = ForwardTap(runner.forward, extra_for(runner) if extra_for is not None else None, host_mask)
    runner.forward = tap
    if warm_up:
        runner.warm_up()
        tap.logits.clear()
        tap.extra = extra_for(runner) if extra_for is not None else None  # seeded afresh
    requests = [Request(list(prompt), DECODE_STEPS + 1) for prompt in PROMPTS]
    with torch.compiler.set_stance("fail_on_recompile" if warm_up else "default"):
        for request in requests:
            request.output.append(runner.prefill(request, len(request.prompt)))
        for _ in range(DECODE_STEPS):
            for request, token in zip(requests, runner.decode(requests)):
                request.output.append(token)
    return tap, runner


def assert_same_logits(got, want):
    assert len(got) == len(want) == len(PROMPTS) + DECODE_STEPS
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), (step, (g - w).abs().max())


def mrope_of(kwargs):
    """Text-only M-RoPE positions: the step's positions on all three axes."""
    return {"rotary_position_ids": kwargs["positions"].to(torch.int64).expand(3, -1).contiguous()}


@pytest.fixture(scope="module")
def dense(tiny_model):
    return tiny_model("qwen3_5-dense")


@pytest.fixture(scope="module")
def plain_fp32(dense):
    return serve_workload(dense)[0].logits


def test_mrope_positions_of_a_text_prompt_give_the_logits_of_1d_positions(dense, plain_fp32):
    tap, _ = serve_workload(dense, lambda runner: mrope_of)
    assert_same_logits(tap.logits, plain_fp32)


def test_the_temporal_mrope_row_turns_q_and_k(dense):
    """A config without ``mrope_section`` (no M-RoPE; the runner then passes no ``rotary_position_ids``)
    reads only row 0: other rows changed, same logits; row 0 changed, not. With an
    ``mrope_section`` every row turns its own slots: ``test_shell_vision.py``."""
    runner = make_runner(dense)
    tap = ForwardTap(runner.forward)
    runner.forward = tap
    rows = {
        "text": lambda p: torch.stack([p, p, p]),
        "other rows changed": lambda p: torch.stack([p, p * 0 + 7, p.flip(0)]),
        "temporal row changed": lambda p: torch.stack([p.flip(0), p, p]),
    }
    logits = {}
    for name, make in rows.items():
        tap.extra = lambda kwargs, make=make: {"rotary_position_ids": make(kwargs["positions"].to(torch.int64))}
        request = Request(list(PROMPTS[0]), 1)  # a fresh request: no state to carry
        runner.prefill(request, len(PROMPTS[0]))
        runner.release(request)
        logits[name] = tap.logits[-1]
    assert torch.equal(logits["other rows changed"], logits["text"])
    assert not torch.allclose(logits["temporal row changed"], logits["text"])


def prompt_embeds_of(fraction, dtype):
    """``extra_for``: a seeded ``fraction`` of tokens given as ``dtype`` embeddings, the rest as ids.

    As the runner builds them: ``inputs_embeds`` is zeros where ``is_token_ids`` is True.
    """

    def extra_for(runner):
        generator = torch.Generator().manual_seed(0)
        table = runner.model.model.embed_tokens.weight

        def extra(kwargs):
            ids = kwargs["input_ids"].to(torch.int64)
            is_token_ids = torch.rand(ids.shape[0], generator=generator) >= fraction
            rows = table.index_select(0, ids).to(dtype)
            inputs_embeds = torch.where(is_token_ids[:, None], torch.zeros((), dtype=dtype), rows)
            return {"inputs_embeds": inputs_embeds, "is_token_ids": is_token_ids}

        return extra

    return extra_for


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_prompt_embeddings_of_the_same_ids_give_the_same_logits_fp32(dense, plain_fp32, fraction):
    tap, _ = serve_workload(dense, prompt_embeds_of(fraction, torch.float32))
    assert_same_logits(tap.logits, plain_fp32)


def test_bfloat16_prompt_embeddings_in_a_bfloat16_model_give_the_same_logits(dense):
    """The runner sends bfloat16 embeddings; a bfloat16 model's own rows are those exactly."""
    plain, _ = serve_workload(dense, dtype="bfloat16")
    embedded, _ = serve_workload(dense, prompt_embeds_of(0.5, torch.bfloat16), dtype="bfloat16")
    assert_same_logits(embedded.logits, plain.logits)


def random_masks(vocab_size, allowed):
    """``extra_for``: a seeded ``[R, V]`` mask per step, a fraction ``allowed`` of it True."""

    def extra_for(runner):
        generator = torch.Generator().manual_seed(1)
        masks = []

        def extra(kwargs):
            rows = kwargs["sampling_positions"].shape[0]
            mask = torch.rand(rows, vocab_size, generator=generator) < allowed
            masks.append(mask)
            return {"logit_mask": mask}

        extra.masks = masks
        return extra

    return extra_for


@pytest.mark.parametrize("allowed", [0.3, 1.0])
def test_the_logit_mask_gives_the_logits_masked_on_the_host(dense, allowed):
    """The same seeded masks, applied by the model or to its returned logits on the host (each run's
    greedy ids follow its masked logits); ``allowed`` 1.0 is the runner's all-True mask."""
    vocab_size = 512
    on_device, _ = serve_workload(dense, random_masks(vocab_size, allowed))
    on_host, _ = serve_workload(dense, random_masks(vocab_size, allowed), host_mask=True)
    assert all(torch.equal(a, b) for a, b in zip(on_device.extra.masks, on_host.extra.masks))
    assert_same_logits(on_device.logits, on_host.logits)
    masks = on_device.extra.masks
    assert on_device.logits[0].shape[-1] == vocab_size
    assert all(torch.isneginf(g[~m]).all() and torch.isfinite(g[m]).all() for g, m in zip(on_device.logits, masks))


def every_optional_input(runner):
    embeds = prompt_embeds_of(0.5, torch.float32)(runner)
    masks = random_masks(runner.model.config.vocab_size, 0.3)(runner)

    def extra(kwargs):
        return {**mrope_of(kwargs), **embeds(kwargs), **masks(kwargs)}

    extra.masks = masks.masks
    return extra


@pytest.mark.slow
def test_every_optional_input_compiles_into_one_graph_per_bucket(dense):
    """Compiled per bucket (fullgraph, aot_eager), warmed up with every optional input, then served under
    ``fail_on_recompile``: each optional input is a graph input, no host read, the eager model's logits."""
    eager, _ = serve_workload(dense, every_optional_input)
    tap, runner = serve_workload(dense, every_optional_input, compile=True, warm_up=True)
    graphs = runner.recorder.dynamo_graphs
    assert len(graphs) == len(runner.prefill_buckets) + len(runner.decode_buckets)
    for graph in graphs:
        inputs = [node.name for node in graph.graph.nodes if node.op == "placeholder"]
        for name in ("rotary_position_ids", "inputs_embeds", "is_token_ids", "logit_mask"):
            assert any(name in i for i in inputs), (name, inputs)
    assert [r for g in graphs + runner.recorder.aten_graphs for r in host_reads(g)] == []
    for got, want in zip(tap.logits, eager.logits):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
