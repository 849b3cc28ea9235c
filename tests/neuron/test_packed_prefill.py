"""Several prompts per prefill step: the shell's packed prefill against one prompt per step and transformers.

vllm-neuron's runner (whn09/vllm-neuron @ 7ea99278 ``neuron_model_runner.py``; the scheduler of
that release line, ``max_prefills_per_batch = 1``) sends one prompt, or one chunk of one, per
prefill step, and passes no ``query_start_loc``. A packed step is what its input preparation
makes of several requests in a batch: their tokens end to end in batch-row order, padding after
the last, one block-table row each (``runner.py``). Checked here: the rows the shell reads from
those fields (``shells/neuron/packing.py``), the host checks that refuse other layouts, the stand-in's
refusals, a packed prefill equal to one prompt per step (ids exact; logits to summation order:
a packed step sums over more masked-out columns and batches the GDN chunks differently) and to
transformers, and bursts of prompts with decode served with one static graph per bucket.
"""

import pytest
import torch

from tests.support import oracle
from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM
from vllm_gdn_neuron.shells.neuron.packing import check_prefill_rows, prefill_rows

from .runner import EngineSettings, NeuronRunnerStandIn, Request
from .test_harness import check_graphs_and_ids, run_harness, settings_for

BLOCK = 4


def _packed_metadata(rows, table, pad):
    """One group's fields of a packed step: ``rows`` = ``[(row, first position, tokens)]`` in token order."""
    slots, positions = [], []
    for row, first, count in rows:
        for position in range(first, first + count):
            slots.append(table[row][position // BLOCK] * BLOCK + position % BLOCK)
            positions.append(position)
    slots += [0] * pad
    positions += [positions[-1]] * pad
    metadata = dict(block_table_tensor=torch.tensor(table, dtype=torch.int32),
                    slot_mapping=torch.tensor(slots, dtype=torch.int64), block_size=BLOCK)
    return metadata, torch.tensor(positions, dtype=torch.int64)


# Row 0: a new prompt over blocks 5 and 6; row 1: a chunk continuing at position 6 (block 7 after
# block 3); row 2: a stale copy of row 0's table (its request finished), which must own no token.
TABLE = [[5, 6, -1], [3, 7, -1], [5, 6, -1]]


def test_prefill_rows_reads_packed_requests_from_the_runner_fields():
    metadata, positions = _packed_metadata([(0, 0, 6), (1, 6, 2)], TABLE, pad=3)
    rows = prefill_rows(metadata, positions)
    assert rows.token_row.tolist() == [0] * 6 + [1] * 2 + [3] * 3
    assert rows.query_start_loc.tolist() == [0, 6, 8, 8]
    assert rows.first_position.tolist() == [0, 6, 0]
    assert check_prefill_rows(metadata, positions) == [6, 2, 0]


def test_check_prefill_rows_refuses_other_layouts():
    metadata, positions = _packed_metadata([(1, 6, 2), (0, 0, 6)], TABLE, pad=1)
    with pytest.raises(ValueError, match="end to end in row order"):
        check_prefill_rows(metadata, positions)
    metadata, positions = _packed_metadata([(0, 0, 3), (1, 6, 2), (0, 3, 3)], TABLE, pad=0)
    with pytest.raises(ValueError, match="end to end in row order"):
        check_prefill_rows(metadata, positions)
    metadata, positions = _packed_metadata([(0, 0, 6)], TABLE, pad=1)
    metadata["slot_mapping"][2] = 9 * BLOCK + 2  # a block no row holds
    with pytest.raises(ValueError, match="token 2 .* in no row"):
        check_prefill_rows(metadata, positions)
    metadata, positions = _packed_metadata([(0, 0, 6)], TABLE, pad=0)
    positions[3] = 2
    metadata["slot_mapping"][3] = 5 * BLOCK + 2
    with pytest.raises(ValueError, match="consecutive positions within row 0"):
        check_prefill_rows(metadata, positions)


def test_the_stand_in_refuses_bad_prefill_steps_before_any_work(tmp_path):
    settings = settings_for(str(tmp_path), "float32", (16, 32), (2,))
    with pytest.raises(ValueError, match="prefill_rows: expected 1 .. max_num_seqs = 2, got 3"):
        NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, settings, compile=False, prefill_rows=3)
    runner = NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, settings, compile=False, prefill_rows=2)
    a, b, c = (Request(list(range(1, n + 1)), 1) for n in (20, 20, 5))
    with pytest.raises(ValueError, match="1 .. prefill_rows = 2 requests, got 3"):
        runner.prefill_packed([(a, 5), (b, 5), (c, 5)])
    with pytest.raises(ValueError, match="at most 32 tokens .* got 40"):
        runner.prefill_packed([(a, 20), (b, 20)])
    with pytest.raises(ValueError, match="a chunk of 1 .. 5 tokens .* got 6"):
        runner.prefill_packed([(c, 6)])
    with pytest.raises(ValueError, match="each request once"):
        runner.prefill_packed([(a, 2), (a, 2)])
    assert not a.blocks and a.computed == 0


PROMPTS = ([5, 17, 42, 9, 300, 11, 250, 3, 77, 120, 64, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17],
           [8], [400, 21, 6, 99, 5], [31, 32, 33])
DECODE_STEPS = 3


def _eager_runner(model_dir, prefill_rows):
    """An uncompiled stand-in that keeps every step's logits (host sampling: the forward returns them)."""
    settings = EngineSettings(model=model_dir, dtype="float32", max_num_seqs=4, num_gpu_blocks_override=24,
                              additional_config={"neuron_config": dict(num_batched_tokens_buckets=[16, 32],
                                                                       num_seqs_buckets=[4],
                                                                       on_device_sampling_config=None)})
    runner = NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, settings, compile=False, prefill_rows=prefill_rows)
    runner.load_model()
    runner.initialize_kv_cache(runner.get_kv_cache_spec())
    logits = []
    forward = runner.forward
    runner.forward = lambda **kwargs: logits.append(forward(**kwargs)) or logits[-1]
    return runner, logits


def _first_logits(runner, logits, requests):
    """The last step's logits row of each of ``requests`` (its batch row)."""
    return [logits[-1][runner.batch.index(r)] for r in requests]


def test_packed_prefill_equals_one_prompt_per_step_and_transformers(tiny_model):
    """Step 1 packs a chunk of the long prompt with two short ones, step 2 its continuation with the
    fourth; the one-row runner prefills each in turn (the long one in the same two chunks)."""
    model_dir = tiny_model("qwen3_5-dense")
    single, single_logits = _eager_runner(model_dir, 1)
    packed, packed_logits = _eager_runner(model_dir, 4)
    alone = [Request(list(p), DECODE_STEPS + 1) for p in PROMPTS]
    together = [Request(list(p), DECODE_STEPS + 1) for p in PROMPTS]
    want_logits = {}
    for index, request in enumerate(alone):
        for chunk in ((12, 10) if index == 0 else (len(request.prompt),)):
            token = single.prefill(request, chunk)
        request.output.append(token)
        want_logits[index] = single_logits[-1][0]
    first = packed.prefill_packed([(together[0], 12), (together[1], 1), (together[2], 5)])
    assert first[0] is None
    got_logits = dict(zip((1, 2), _first_logits(packed, packed_logits, together[1:3])))
    second = packed.prefill_packed([(together[0], 10), (together[3], 3)])
    got_logits.update(zip((0, 3), _first_logits(packed, packed_logits, [together[0], together[3]])))
    for request, token in zip(together, (second[0], first[1], first[2], second[1])):
        request.output.append(token)
    for index in range(len(PROMPTS)):
        torch.testing.assert_close(got_logits[index], want_logits[index], rtol=1e-5, atol=1e-5)
    for runner, requests in ((single, alone), (packed, together)):
        for _ in range(DECODE_STEPS):
            for request, token in zip(requests, runner.decode(requests)):
                request.output.append(token)
    for prompt, a, b in zip(PROMPTS, alone, together):
        want, _ = oracle.hf_greedy(model_dir, torch.float32, list(prompt), DECODE_STEPS + 1)
        assert a.output == b.output == want, (len(prompt), a.output, b.output, want)


# (prompt length, new tokens, arrival step): a burst of five (one longer than the largest bucket,
# so its continuation shares a step with new prompts), then more while the first ones decode.
BURST_WORKLOAD = [(1, 3, 0), (7, 2, 0), (40, 2, 0), (3, 3, 0), (12, 2, 0), (20, 2, 3), (2, 3, 3)]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3_5-dense", "qwen3_5-moe"])
def test_bursts_of_prompts_pack_into_prefill_buckets_with_one_graph_per_bucket(tiny_model, model):
    model_dir = tiny_model(model)
    result = run_harness(model_dir, BURST_WORKLOAD, "float32", prefill_buckets=(32,), decode_buckets=(4,),
                         prefill_rows=4, num_gpu_blocks_override=40)
    prefills = [step[1] for step in result["steps"] if step[0] == "prefill"]
    assert max(len(items) for items in prefills) >= 3
    assert any(len(items) > 1 and items[0][1] > 0 for items in prefills), "no continuation packed with new prompts"
    assert len(prefills) < len(BURST_WORKLOAD)
    check_graphs_and_ids(result, model_dir, BURST_WORKLOAD)


@pytest.mark.slow
def test_packed_prefill_buckets_lower_to_stablehlo_and_equal_eager(tiny_model):
    """The same bursts through torch-mlir (``xla_lowering.XlaLoweringBackend``), on the MoE model (its
    grouped experts in the prefill bucket): every step on XLA:CPU equal to eager, transformers' ids."""
    from .test_xla_lowering import assert_equal_to_eager, bucket_labels, report
    from .xla_lowering import XlaLoweringBackend

    model_dir = tiny_model("qwen3_5-moe")
    backend = XlaLoweringBackend()
    result = run_harness(model_dir, BURST_WORKLOAD, "float32", prefill_buckets=(32,), decode_buckets=(4,),
                         prefill_rows=4, num_gpu_blocks_override=40, backend=backend)
    print("\n" + report("qwen3_5-moe packed (torch_mlir)", bucket_labels((32,), (4,)), backend))
    assert max(len(step[1]) for step in result["steps"] if step[0] == "prefill") >= 3
    assert_equal_to_eager(backend, 2)
    check_graphs_and_ids(result, model_dir, BURST_WORKLOAD)
