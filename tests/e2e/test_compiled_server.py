"""The shipped CPU settings as shipped: ``configs/serve-cpu.yaml`` serves in vLLM's compiled mode.

The other server tests start eagerly (``tests.support.serving.EAGER``: a compile per start would
not fit the suite's time); this one starts ``bash scripts/serve.sh`` without it, so the plugin's
decoder runs as vLLM's compiled graph behind the OpenAI API: the README's command (the tiny
model, bf16), completion ids of prompts of 1, 40 and 700 tokens, sent at once, equal
transformers' up to the first near-tie (``oracle``'s rules, the bf16 error rule included:
Inductor's fused kernels round bf16 elementwise work once, where eager code and transformers
round after each op, so a near-tie may fall to fp32's side). The compiled MTP drafter with
accepted drafts is ``test_compiled_mode.py``'s, in-process.
"""

import random

import pytest
import torch

from tests.support.oracle import assert_greedy_matches, hf_bf16_oracle_in_subprocess
from tests.support.serving import TINY_MODEL_DIR, Server, all_at_once, running_server

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
