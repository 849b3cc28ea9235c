"""The shipped CPU settings as shipped: ``configs/serve-cpu.yaml`` serves in vLLM's compiled mode.

The other server tests start eagerly (``tests.support.serving.EAGER``: a compile per start would
not fit the suite's time); these two start ``bash scripts/serve.sh`` without it, so the plugin's
decoder (and the MTP drafter) run as vLLM's compiled graphs behind the OpenAI API:

- the README's command (the tiny model, bf16): completion ids of prompts of 1, 40 and 700
  tokens, sent at once, equal transformers' up to the first near-tie (``oracle``'s rules, the
  bf16 error rule included: Inductor's fused kernels round bf16 elementwise work once, where
  eager code and transformers round after each op, so a near-tie may fall to fp32's side);
- a checkpoint with an MTP head whose drafts get accepted (fp32, 3 speculative tokens,
  prefix caching off, requests at once): ids equal transformers', exactly, and drafts were
  accepted (vLLM's counter), so compiled verify steps advanced the state by more than one token.
"""

import pathlib
import random

import pytest
import torch

from scripts import build_tiny_models as builder
from tests.support.oracle import assert_greedy_matches, hf_bf16_oracle_in_subprocess, hf_greedy
from tests.support.serving import TINY_MODEL_DIR, Server, all_at_once, metric, running_server

MAX_TOKENS = 8
COMPILED = "enforce_eager=False"  # in the engine configuration vLLM logs at start-up


def _prompts(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in lengths]


def _served_compiled(server: Server) -> None:
    log = server.log_path.read_text()
    assert COMPILED in log and "Enforce eager set" not in log, "the server did not run in compiled mode"


def _generated(server: Server, prompts: list[list[int]]) -> list[list[int]]:
    return all_at_once(server, [{"prompt": p, "max_tokens": MAX_TOKENS} for p in prompts], workers=len(prompts))


@pytest.mark.slow
def test_the_readme_command_serves_compiled_with_transformers_ids(tmp_path):
    prompts = _prompts((1, 40, 700), seed=5)
    with running_server(tmp_path / "server.log", compiled=True) as server:
        got = _generated(server, prompts)
    _served_compiled(server)
    greedy, _ = hf_bf16_oracle_in_subprocess(TINY_MODEL_DIR, prompts, MAX_TOKENS)
    for ids, (want, want_logits, fp32_logits) in zip(got, greedy):
        assert_greedy_matches(ids, want, want_logits, torch.bfloat16, fp32_logits=fp32_logits)


@pytest.mark.slow
def test_mtp_serves_compiled_with_transformers_ids_and_accepted_drafts(tmp_path):
    folder = str(builder.build("qwen3_5-dense", tmp_path, mtp_head_kind="repeat"))
    prompts = _prompts((1, 17, 300, 5, 64), seed=2)
    args = ("--dtype", "float32", "--no-enable-prefix-caching",
            "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}')
    with running_server(tmp_path / "server.log", *args, model=pathlib.Path(folder).name, env={"MODEL": folder},
                        compiled=True) as server:
        got = _generated(server, prompts)
        assert metric(server, "vllm:spec_decode_num_accepted_tokens_total") > 0, \
            "no draft was accepted: the multi-token state advance was not tested"
    _served_compiled(server)
    for prompt, ids in zip(prompts, got):
        assert ids == hf_greedy(folder, torch.float32, prompt, MAX_TOKENS)[0], len(prompt)
