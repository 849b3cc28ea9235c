"""Block-FP8 checkpoints served on CPU dequantized at load, and the quantized checkpoints refused
(the FP8-kernel path, and the real-dims checkpoint that takes it: ``test_fp8_kernels.py``).

The oracle is transformers on each checkpoint's dequantized twin (``tests.support.fp8``:
every FP8 weight times its block scale, by a float64 loop, stored in float32). Served in
float32, the engine's greedy ids must equal transformers' fp32 ids exactly, for the tiny
layouts and for the real-dims checkpoint (``qwen3_5-35b-a3b-real-fp8``: its oracle runs
first, in a child process, so that transformers' float32 model and the engine's are never in
memory together); in bfloat16, they follow the bf16 rules of ``tests.support.oracle``.
"""

import json
import pathlib
import shutil
import sys

import pytest
import torch

from tests.support.engines import engine, plugin_log_lines
from tests.support.fp8 import dequantized_twin
from tests.support.oracle import assert_greedy_matches, hf_greedy, hf_greedy_in_subprocess
from tests.support.serving import EAGER, REPO, completion, free_port, serving_process

PROMPTS = [[7], [(5 * i + 3) % 500 + 3 for i in range(90)]]
MAX_TOKENS = 8
DEQUANTIZED_LOG = "vllm-gdn-neuron: block-FP8 checkpoint: weights dequantized to torch.float32 at load"


@pytest.fixture(scope="module")
def twin(tiny_model, tmp_path_factory):
    """``twin(name) -> folder``: the dequantized twin of the FP8 checkpoint ``name``."""
    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = dequantized_twin(tiny_model(name), tmp_path_factory.mktemp("fp8-twin") / name)
        return built[name]

    return get


def _engine_run(model_dir: str, dtype: str, prompts: list[list[int]] = PROMPTS, max_tokens: int = MAX_TOKENS,
                **kwargs) -> tuple[list[list[int]], list[str], set[torch.dtype]]:
    """Greedy ids of ``prompts``, the plugin's log lines, and the dtypes of the parameters the engine's model holds."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    with plugin_log_lines() as lines:
        with engine(model_dir, dtype=dtype, **kwargs) as llm:
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            dtypes = llm.apply_model(lambda model: {p.dtype for p in model.parameters()})[0]
    return [list(out.outputs[0].token_ids) for out in outs], lines, dtypes


def _engine_ids(model_dir: str, dtype: str, **kwargs) -> list[list[int]]:
    return _engine_run(model_dir, dtype, **kwargs)[0]


@pytest.mark.slow
def test_served_fp8_checkpoint_gives_transformers_fp32_ids(tiny_model, twin, tmp_path):
    """Through the OpenAI API of ``vllm-gdn-serve`` (the command ``MODEL=... scripts/serve.sh`` runs)."""
    model = tiny_model("qwen3_5-moe-fp8")
    port = free_port()
    command = [sys.executable, "-m", "vllm_gdn_neuron.cli", model, "--config", str(REPO / "configs" / "serve-cpu.yaml"),
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "4096",
               "--kv-cache-memory-bytes", str(256 * 2**20), *EAGER]
    name = pathlib.Path(model).name
    with serving_process(command, port, tmp_path / "server.log", model=name) as server:
        out = completion(server, prompt=PROMPTS, max_tokens=MAX_TOKENS, return_token_ids=True)
        log = server.log_path.read_text()
    assert DEQUANTIZED_LOG in log
    got = [choice["token_ids"] for choice in sorted(out["choices"], key=lambda c: c["index"])]
    for ids, prompt in zip(got, PROMPTS):
        want, want_logits = hf_greedy(twin("qwen3_5-moe-fp8"), torch.float32, prompt, MAX_TOKENS)
        assert_greedy_matches(ids, want, want_logits, torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3_5-dense-fp8", "qwen3-next-fp8", "qwen3_5-vl-fp8", "qwen3_5-moe-vl-fp8"])
def test_fp8_checkpoint_gives_transformers_fp32_ids(tiny_model, twin, name):
    got = _engine_ids(tiny_model(name), "float32")
    for ids, prompt in zip(got, PROMPTS):
        want, want_logits = hf_greedy(twin(name), torch.float32, prompt, MAX_TOKENS)
        assert_greedy_matches(ids, want, want_logits, torch.float32)


@pytest.mark.slow
def test_real_dims_fp8_checkpoint_in_fp32_gives_transformers_fp32_ids(tiny_model, twin):
    """The 35B-A3B per-layer dims in block-FP8 (4 layers, 8 experts, the full vocabulary), served in
    float32: dequantized at load (vLLM's FP8 kernels take bf16 only), every parameter float32, and
    transformers' fp32 ids on the twin exactly. Transformers runs first, in a child process, so
    that its float32 model and the engine's are never in memory together."""
    name = "qwen3_5-35b-a3b-real-fp8"
    # One token; 203 tokens, off the 64-token GDN chunk and prefilled over two steps (128 tokens a step).
    prompts = [[248_000], [(37 * i + 11) % 248_000 + 5 for i in range(203)]]
    max_tokens = 6
    want = hf_greedy_in_subprocess(twin(name), torch.float32, prompts, max_tokens)
    got, lines, dtypes = _engine_run(tiny_model(name), "float32", prompts, max_tokens, max_model_len=512,
                                     max_num_seqs=2)
    reason = "vLLM's Fp8Config takes dtypes [torch.bfloat16, torch.float16], not torch.float32"
    assert any(line.startswith(DEQUANTIZED_LOG) and line.endswith(reason) for line in lines), lines
    assert dtypes == {torch.float32}, dtypes
    for ids, (want_ids, want_logits) in zip(got, want):
        assert_greedy_matches(ids, want_ids, want_logits, torch.float32)
    print(f"{name}: float32 greedy ids {got}")


@pytest.mark.slow
def test_fp8_checkpoint_in_bf16_gives_transformers_bf16_ids(tiny_model, twin):
    """Dequantized to bf16 at load: transformers' bf16 model on the twin (its float32 weights rounded
    to bf16 as the loader rounds them), under the bf16 tie rule."""
    got = _engine_ids(tiny_model("qwen3_5-moe-fp8"), "bfloat16")
    for ids, prompt in zip(got, PROMPTS):
        want, want_logits = hf_greedy(twin("qwen3_5-moe-fp8"), torch.bfloat16, prompt, MAX_TOKENS)
        assert_greedy_matches(ids, want, want_logits, torch.bfloat16)


@pytest.mark.slow
def test_fp8_mtp_head_drafts_for_the_fp8_target(tiny_model, twin):
    """The MTP drafter reads the same FP8 checkpoint (its head's projections are FP8 too), dequantized
    the same way: greedy speculative decoding keeps transformers' fp32 ids."""
    spec = dict(speculative_config={"method": "mtp", "num_speculative_tokens": 2}, enable_prefix_caching=False)
    got = _engine_ids(tiny_model("qwen3_5-moe-fp8"), "float32", **spec)
    for ids, prompt in zip(got, PROMPTS):
        want, want_logits = hf_greedy(twin("qwen3_5-moe-fp8"), torch.float32, prompt, MAX_TOKENS)
        assert_greedy_matches(ids, want, want_logits, torch.float32)


def _copy_with_config(src: str, dst: pathlib.Path, **changes) -> str:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return str(dst)


@pytest.fixture
def weights_never_load(monkeypatch):
    """Fail the test if the plugin's loader is reached: a refusal must come before any weight loads."""
    from vllm_gdn_neuron.shells.vllm import qwen3_5

    def refuse(self, weights):
        raise AssertionError("weights were loaded before the refusal")

    monkeypatch.setattr(qwen3_5.CheckpointLoader, "load_weights", refuse)


@pytest.mark.slow
@pytest.mark.parametrize("quantization_config, method", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}, "gptq"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, "awq"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {}}, "compressed-tensors"),
    ({"quant_method": "mxfp4"}, "mxfp4"),
])
def test_other_quantization_methods_are_refused_at_startup(tiny_model, tmp_path, weights_never_load,
                                                             quantization_config, method):
    model_dir = _copy_with_config(tiny_model("qwen3_5-dense"), tmp_path / "model", quantization_config=quantization_config)
    message = (f"quantization '{method}' is not supported by the vllm-gdn-neuron models: they load unquantized .* "
               f"and block-FP8 ones \\(quant_method 'fp8'")
    with pytest.raises(ValueError, match=message):
        with engine(model_dir, dtype="bfloat16"):
            pass


@pytest.mark.slow
def test_quantizing_an_unquantized_checkpoint_at_load_is_refused(tiny_model, weights_never_load):
    with pytest.raises(ValueError, match="quantization='fp8' on an unquantized checkpoint .* is not supported"):
        with engine(tiny_model("qwen3_5-dense"), dtype="bfloat16", quantization="fp8"):
            pass


def _rewrite_tensor(folder: pathlib.Path, name: str, tensor: torch.Tensor | None) -> None:
    """Replace (None: drop) one tensor of a checkpoint folder, in its shard and the index."""
    from safetensors.torch import load_file, save_file

    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = folder / index["weight_map"][name]
    tensors = load_file(str(shard))
    if tensor is None:
        del tensors[name], index["weight_map"][name]
    else:
        tensors[name] = tensor
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))


@pytest.mark.slow
@pytest.mark.parametrize("scale, message", [
    (None, r"model.layers.1.mlp.experts.2.down_proj.weight_scale_inv: missing; the FP8 weight "
           r"model.layers.1.mlp.experts.2.down_proj.weight \(64, 32\) needs block scales of shape \(1, 1\)"),
    (torch.ones(2, 1, dtype=torch.bfloat16),
     r"model.layers.1.mlp.experts.2.down_proj.weight_scale_inv: shape must be \(1, 1\) .*; got \(2, 1\)"),
])
def test_fp8_checkpoint_with_bad_scales_is_refused_before_loading(tiny_model, tmp_path, weights_never_load, scale,
                                                                   message):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model("qwen3_5-moe-fp8"), model_dir)
    _rewrite_tensor(model_dir, "model.layers.1.mlp.experts.2.down_proj.weight_scale_inv", scale)
    with pytest.raises(ValueError, match=message):
        with engine(str(model_dir), dtype="bfloat16"):
            pass
