"""The shipped CPU settings as shipped: ``configs/serve-cpu.yaml`` serves in vLLM's compiled mode.

The other server tests start eagerly (``tests.support.serving.EAGER``: a compile per start would
not fit the suite's time); these two start ``bash scripts/serve.sh`` without it, so the plugin's
decoder (and the MTP drafter) run as vLLM's compiled graphs behind the OpenAI API:

- the README's command (the tiny model, bf16): completion ids of prompts of 1, 40 and 700
  tokens, sent at once, equal transformers' up to the first near-tie (``oracle``'s rule);
- a checkpoint with an MTP head whose drafts get accepted (fp32, 3 speculative tokens,
  prefix caching off, requests at once): ids equal transformers', exactly, and drafts were
  accepted (vLLM's counter), so compiled verify steps advanced the state by more than one token.
"""

import pathlib
import random

import pytest
import torch

from scripts import build_tiny_models as builder
from tests.support.oracle import assert_greedy_matches, hf_greedy
from tests.support.serving import TINY_MODEL_DIR, Server, all_at_once, metric, running_server

MAX_TOKENS = 8
COMPILED = "enforce_eager=False"  # in the engine configuration vLLM logs at start-up


def _prompts(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in lengths]


def _served_compiled(server: Server) -> None:
    log = server.log_path.read_text()
    assert COMPILED in log and "Enforce eager set" not in log, "the server did not run in compiled mode"


def _assert_transformers_ids(server: Server, model_dir: str, dtype: torch.dtype, prompts: list[list[int]]) -> None:
    got = all_at_once(server, [{"prompt": p, "max_tokens": MAX_TOKENS} for p in prompts], workers=len(prompts))
    for prompt, ids in zip(prompts, got):
        want, want_logits = hf_greedy(model_dir, dtype, prompt, MAX_TOKENS)
        assert_greedy_matches(ids, want, want_logits, dtype)


@pytest.mark.slow
def test_the_readme_command_serves_compiled_with_transformers_ids(tmp_path):
    with running_server(tmp_path / "server.log", compiled=True) as server:
        _assert_transformers_ids(server, TINY_MODEL_DIR, torch.bfloat16, _prompts((1, 40, 700), seed=5))
    _served_compiled(server)


@pytest.mark.slow
def test_mtp_serves_compiled_with_transformers_ids_and_accepted_drafts(tmp_path):
    folder = str(builder.build("qwen3_5-dense", tmp_path, mtp_head_kind="repeat"))
    args = ("--dtype", "float32", "--no-enable-prefix-caching",
            "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}')
    with running_server(tmp_path / "server.log", *args, model=pathlib.Path(folder).name, env={"MODEL": folder},
                        compiled=True) as server:
        _assert_transformers_ids(server, folder, torch.float32, _prompts((1, 17, 300, 5, 64), seed=2))
        assert metric(server, "vllm:spec_decode_num_accepted_tokens_total") > 0, \
            "no draft was accepted: the multi-token state advance was not tested"
    _served_compiled(server)
