"""Block-FP8 checkpoints through vLLM's own FP8 CPU kernels (AMX), and the fallback to dequantizing at load.

The kernel path (W8A16: bf16 activations times FP8 weights) is held to bf16-level error against
the dequantized fp32 oracle: transformers on the checkpoint's dequantized twin
(``tests.support.fp8``), by the bf16 logprob error-ratio rule of ``tests.support.oracle``: the
logprobs of vLLM's top tokens along its own greedy continuation err from transformers' fp32
model's, scored on the same tokens, at most 1.5x as much as transformers' bf16 model's do
(medians). Greedy ids are not compared: the kernel rounds differently from transformers'
bf16 model, so a near-tie may fall either way by more than transformers' own bf16 error (seen
once: a 0.11-logit fp32 margin flipped at step 3, where transformers' bf16 logits were off by
up to 0.06), and the continuations then part; the ratio rule scores vLLM's own tokens and is
unaffected. The ``-blocks`` tiny models have every quantized projection in
whole 128 x 128 blocks, as the kernels need; the ``-fp8`` tiny twins (64-wide) do not, and fall back.
"""

import pytest
import torch

from tests.support.engines import engine, plugin_log_lines
from tests.support.fp8 import dequantized_twin
from tests.support.oracle import assert_logprob_error_ratio, hf_bf16_oracle_in_subprocess

PROMPTS = [[7], [(5 * i + 3) % 500 + 3 for i in range(90)], list(range(3, 260))]
MAX_TOKENS = 8
LOGPROBS = 5
KERNELS_LOG = ("vllm-gdn-neuron: block-FP8 checkpoint: weights held in FP8 (float8_e4m3fn and their block scales) "
               "and run through vLLM's FP8 kernels (CPUFp8BlockScaledMMKernel for the linear layers")
DEQUANTIZED_LOG = "vllm-gdn-neuron: block-FP8 checkpoint: weights dequantized to torch.bfloat16 at load"


def _serve(model_dir: str, prompts: list[list[int]] = PROMPTS, max_tokens: int = MAX_TOKENS, **kwargs):
    """Greedy runs of ``prompts`` in bf16 with their top logprobs, the model's log lines, and the
    dtypes of the weights the model holds (name -> dtype)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=LOGPROBS)
    with plugin_log_lines() as lines:
        with engine(model_dir, dtype="bfloat16", enable_prefix_caching=False, **kwargs) as llm:
            outs = [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                       use_tqdm=False)]
            dtypes = llm.apply_model(lambda model: {n: p.dtype for n, p in model.named_parameters()})[0]
    runs = []
    for out in outs:
        best = [sorted(step.items(), key=lambda item: item[1].rank)[:LOGPROBS] for step in out.logprobs]
        runs.append((list(out.token_ids), [[t for t, _ in s] for s in best], [[lp.logprob for _, lp in s] for s in best]))
    return runs, lines, dtypes


@pytest.mark.slow
@pytest.mark.parametrize("name, enforce_eager", [
    ("qwen3_5-moe-blocks-fp8", True),
    ("qwen3-next-blocks-fp8", True),
    ("qwen3_5-moe-blocks-fp8", False),  # vLLM's compiled mode, the shipped CPU setting
])
def test_fp8_kernels_are_within_bf16_error_of_the_dequantized_fp32_oracle(tiny_model, tmp_path, name, enforce_eager):
    model = tiny_model(name)
    runs, lines, dtypes = _serve(model, enforce_eager=enforce_eager)
    assert any(line.startswith(KERNELS_LOG) for line in lines), lines
    # The projections and experts hold FP8 (packed by the kernels), the rest bf16.
    assert dtypes["model.layers.0.linear_attn.in_proj_qkvz.weight"] == torch.float8_e4m3fn
    assert dtypes["model.layers.3.self_attn.o_proj.weight"] == torch.float8_e4m3fn
    experts = [dtype for param, dtype in dtypes.items()
               if param.startswith("model.layers.1.mlp.experts.") and param.endswith(("w13_weight", "w2_weight"))]
    assert experts == [torch.float8_e4m3fn] * 2, dtypes
    assert dtypes["model.layers.0.linear_attn.in_proj_ba.weight"] == torch.bfloat16
    assert dtypes["model.layers.1.mlp.gate.weight"] == torch.bfloat16

    twin = dequantized_twin(model, tmp_path / "twin")
    scored = [(prompt, ids, tokens) for prompt, (ids, tokens, _) in zip(PROMPTS, runs)]
    _, forced = hf_bf16_oracle_in_subprocess(twin, PROMPTS, MAX_TOKENS, scored)
    ratio = assert_logprob_error_ratio([torch.tensor(logprobs) for _, _, logprobs in runs], forced)
    print(f"{name}: FP8-kernel bf16 logprob error {ratio:.3f}x transformers' own bf16 error")


@pytest.mark.slow
def test_real_dims_fp8_checkpoint_through_the_kernels_is_within_bf16_error(tiny_model, tmp_path):
    """The 35B-A3B per-layer dims in block-FP8 (whole blocks everywhere), served in bf16 through vLLM's
    FP8 kernels, against transformers on the dequantized twin: the error-ratio rule of
    ``tests.support.oracle`` (the module doc says why greedy ids are not compared)."""
    model = tiny_model("qwen3_5-35b-a3b-real-fp8")
    prompts = [[5, 900, 248_000, 17], list(range(1000, 1200))]
    runs, lines, dtypes = _serve(model, prompts, 4, max_num_seqs=2)
    assert any(line.startswith(KERNELS_LOG) for line in lines), lines
    assert dtypes["model.layers.0.linear_attn.in_proj_qkvz.weight"] == torch.float8_e4m3fn
    plain = dequantized_twin(model, tmp_path / "twin")
    scored = [(prompt, ids, tokens) for prompt, (ids, tokens, _) in zip(prompts, runs)]
    _, forced = hf_bf16_oracle_in_subprocess(plain, prompts, 4, scored)
    ratio = assert_logprob_error_ratio([torch.tensor(logprobs) for _, _, logprobs in runs], forced)
    print(f"qwen3_5-35b-a3b-real-fp8: FP8-kernel bf16 logprob error {ratio:.3f}x transformers' own bf16 error")


@pytest.mark.slow
def test_tiny_dims_off_the_block_fall_back_to_dequantizing(tiny_model):
    _, lines, dtypes = _serve(tiny_model("qwen3_5-moe-fp8"))
    reason = "vLLM's FP8 kernels not used: linear_attn.in_proj_qkvz's parts [64, 64, 64, 64] x 64 per rank (tp=1)"
    assert any(line.startswith(DEQUANTIZED_LOG) and reason in line for line in lines), lines
    assert dtypes["model.layers.0.linear_attn.in_proj_qkvz.weight"] == torch.bfloat16


@pytest.mark.slow
def test_a_cpu_without_amx_falls_back_to_dequantizing(tiny_model, monkeypatch):
    """vLLM's capability check (``torch.cpu._is_amx_tile_supported``, which its CPU FP8 kernels ask)
    says no AMX: the whole-block model is dequantized, and the line says why."""
    model = tiny_model("qwen3_5-moe-blocks-fp8")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    _, lines, dtypes = _serve(model)
    assert any(line.startswith(DEQUANTIZED_LOG) and "requires AMX tile support" in line for line in lines), lines
    assert dtypes["model.layers.0.linear_attn.in_proj_qkvz.weight"] == torch.bfloat16
