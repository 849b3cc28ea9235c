"""Speculative decoding in the Neuron shell, driven by the runner stand-in as vllm-neuron's runner drives it.

The runner's verify steps (``runner.py``: ``NeuronRunnerStandIn.verify``, its warm-up of one
verify graph per decode bucket, ``spec_decode_metadata``) over the shell's forward
(``shells/neuron/spec_decode.py``): each decode step carries every request's pending token and N
drafts; the shell judges them in the graph, returns ``[rows, 1 + N]`` ids with ``-1`` past
the accepted ones and keeps each GatedDeltaNet state at the last accepted token. The drafts
come from the reference MTP head (``scripts/mtp_reference.py``, transformers' modules) on the
host: the pinned runner builds no MTP drafter (``docs/neuron-mtp.md``), so the harness stands
in for one.

Measured, fp32: greedy ids with MTP equal transformers' greedy ids without it (N = 1 and 3,
the trained checkpoint whose head drafts right most of the time, and N = 3 with a random
head whose drafts are rejected), several requests arriving while others decode, a prompt
longer than the prefill bucket (chunked), decode batches padded to their bucket; compiled
(trained, N = 3): one static graph per bucket (a verify and a one-token graph per decode
bucket), none after warm-up under ``fail_on_recompile``, no graph break, no host read in any
graph. The other two cases run the same forward eagerly.
"""

import pathlib

import pytest
import torch

from scripts import mtp_reference
from tests.support import oracle
from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM
from vllm_gdn_neuron.shells.neuron.spec_decode import REJECTED, judge_drafts

from .runner import EngineSettings, NeuronRunnerStandIn, host_reads, serve, symbolic_graphs

TRAINED = pathlib.Path(__file__).resolve().parents[2] / "configs" / "trained" / "qwen3_5-tiny-mtp"
PREFILL_BUCKETS, DECODE_BUCKETS = (16,), (2, 4)
# (text, new tokens, arrival step): requests arriving while others decode; the first prompt is
# longer than the prefill bucket (two chunks); three running requests fill a padded bucket of 4.
WORKLOAD = [
    ("count from one to nine: one two three four five six seven eight nine. count from two to eight:", 9, 0),
    ("count from three to nine:", 8, 0),
    ("count from four to seven:", 6, 2),
]


def test_judge_drafts_keeps_the_ids_up_to_the_first_rejected_draft():
    generator = torch.Generator().manual_seed(0)
    rows, width = 64, 4
    sampled = torch.randint(0, 3, (rows * width,), generator=generator, dtype=torch.int32)
    drafts = torch.randint(0, 3, (rows * (width - 1),), generator=generator, dtype=torch.int32)
    ids, kept = judge_drafts(sampled, drafts, width)
    for row in range(rows):
        row_ids, row_drafts = sampled[row * width:(row + 1) * width].tolist(), drafts[row * (width - 1):][:width - 1]
        accepted = 0
        while accepted < width - 1 and row_ids[accepted] == int(row_drafts[accepted]):
            accepted += 1
        assert int(kept[row]) == accepted
        assert ids[row].tolist() == row_ids[:accepted + 1] + [REJECTED] * (width - 1 - accepted)
    assert ids.dtype == torch.int32 and {int(k) for k in kept} == {0, 1, 2, 3}


def _serve(tokenizer, hf_model, mtp, num_drafts, compile=True, backend=None):
    neuron_config = dict(num_batched_tokens_buckets=list(PREFILL_BUCKETS), num_seqs_buckets=list(DECODE_BUCKETS))
    settings = EngineSettings(model=str(TRAINED), dtype="float32", max_model_len=128, max_num_seqs=max(DECODE_BUCKETS),
                              additional_config={"neuron_config": neuron_config},
                              speculative_config={"method": "mtp", "num_speculative_tokens": num_drafts})
    runner = NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, settings, backend=backend, compile=compile,
                                 drafter=lambda tokens: mtp_reference.propose(hf_model, mtp, tokens, num_drafts))
    runner.start()
    warm_graphs = len(runner.recorder.dynamo_graphs)
    torch._dynamo.utils.counters.clear()
    prompts = [tokenizer(text)["input_ids"] for text, _, _ in WORKLOAD]
    with torch.compiler.set_stance("fail_on_recompile"):
        ids, steps = serve(runner, prompts, [n for _, n, _ in WORKLOAD], [a for _, _, a in WORKLOAD])
    verified = [(output[0], len(samplings)) for output, samplings in runner.outputs if output[0].dim() == 2]
    accepted = sum(int((ids_[:rows] != REJECTED).sum()) - rows for ids_, rows in verified)
    return dict(
        ids=ids, prompts=prompts, steps=steps, warm_graphs=warm_graphs, graphs=len(runner.recorder.dynamo_graphs),
        symbolic=symbolic_graphs(runner.recorder), graph_breaks=sum(torch._dynamo.utils.counters["graph_break"].values()),
        host_reads=[r for g in runner.recorder.dynamo_graphs + runner.recorder.aten_graphs for r in host_reads(g)],
        acceptance=accepted / (num_drafts * sum(rows for _, rows in verified)),
    )


@pytest.fixture(scope="module")
def served():
    """The workload served with the trained head (N = 3 compiled as the runner compiles, N = 1 eager) and a
    random head (N = 3, eager), and transformers' ids. (Eager runs the same forward without the
    per-bucket tracing, which takes most of a start on a loaded 2-core machine.)"""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(TRAINED)
    hf_model = oracle.hf_model(str(TRAINED), torch.float32)
    trained = mtp_reference.load_mtp_head(TRAINED, hf_model).float()
    torch.manual_seed(0)
    random_head = mtp_reference.MtpHead.for_model(hf_model).float().eval()
    results = {("trained", 3): _serve(tokenizer, hf_model, trained, 3),
               ("trained", 1): _serve(tokenizer, hf_model, trained, 1, compile=False),
               ("random", 3): _serve(tokenizer, hf_model, random_head, 3, compile=False)}
    first = next(iter(results.values()))
    want = [oracle.hf_greedy(str(TRAINED), torch.float32, prompt, n)[0]
            for prompt, (_, n, _) in zip(first["prompts"], WORKLOAD)]
    return results, want


@pytest.mark.slow
@pytest.mark.parametrize("case", [("trained", 1), ("trained", 3), ("random", 3)])
def test_greedy_ids_with_mtp_equal_those_without_it(served, case):
    results, want = served
    result = results[case]
    assert result["ids"] == want
    kinds = [step[0] for step in result["steps"]]
    assert "decode" not in kinds and kinds.count("verify") >= 2
    assert any(step[0] == "prefill" and step[1][0][1] > 0 for step in result["steps"]), "no chunked prefill"


@pytest.mark.slow
def test_the_trained_head_is_accepted_and_the_random_head_rejected(served):
    results, _ = served
    rates = {case: round(result["acceptance"], 3) for case, result in results.items()}
    print("draft acceptance:", rates)
    assert rates[("trained", 1)] > 0.5 and rates[("trained", 3)] > 0.3
    assert rates[("random", 3)] < 0.1


@pytest.mark.slow
def test_one_static_graph_per_bucket_and_no_host_read(served):
    result = served[0][("trained", 3)]
    buckets = len(PREFILL_BUCKETS) + 2 * len(DECODE_BUCKETS)  # a verify and a one-token graph per decode bucket
    assert result["warm_graphs"] == buckets and result["graphs"] == buckets
    assert result["symbolic"] == 0 and result["graph_breaks"] == 0
    assert result["host_reads"] == []


@pytest.mark.slow
def test_the_verify_buckets_lower_to_stablehlo_and_equal_eager():
    """The trained head, N = 3, compiled through torch-mlir (``xla_lowering.XlaLoweringBackend``): the
    prefill bucket, each decode bucket's verify graph (4 tokens a row) and one-token graph on XLA:CPU,
    equal to eager on every step (warm-up included), transformers' ids. The workload's verify steps
    take the 4-row bucket; the 2-row verify graph and the one-token graphs (every decode step
    carries drafts) serve only their warm-up."""
    import transformers
    from .test_xla_lowering import assert_equal_to_eager, bucket_labels, report
    from .xla_lowering import XlaLoweringBackend

    tokenizer = transformers.AutoTokenizer.from_pretrained(TRAINED)
    hf_model = oracle.hf_model(str(TRAINED), torch.float32)
    head = mtp_reference.load_mtp_head(TRAINED, hf_model).float()
    backend = XlaLoweringBackend()
    result = _serve(tokenizer, hf_model, head, 3, backend=backend)
    labels = bucket_labels(PREFILL_BUCKETS, DECODE_BUCKETS, 4)
    print("\n" + report("qwen3_5-tiny-mtp (torch_mlir)", labels, backend))
    served = [labels.index(f"prefill {PREFILL_BUCKETS[0]}"), labels.index(f"verify {max(DECODE_BUCKETS)} x 4")]
    assert_equal_to_eager(backend, len(labels), warm_up_only=[n for n in range(len(labels)) if n not in served])
    want = [oracle.hf_greedy(str(TRAINED), torch.float32, prompt, n)[0]
            for prompt, (_, n, _) in zip(result["prompts"], WORKLOAD)]
    assert result["ids"] == want
