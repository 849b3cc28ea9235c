"""A MoE checkpoint whose routed experts are stored fused (transformers 5's in-memory
layout: ``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]) loads
into the same model as the per-expert layout (``experts.<e>.gate_proj.weight`` ...).
"""

import pathlib
import re
import shutil

import pytest
import torch

from tests.support.engines import engine
from tests.support.oracle import assert_greedy_matches, hf_greedy

_PER_EXPERT = re.compile(r"^(?P<layer>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def _fuse_experts(src: str, dst) -> str:
    """Copy a per-expert checkpoint folder with the experts rewritten as fused 3-D tensors."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    tensors, experts = {}, {}
    for path in sorted(pathlib.Path(src).glob("*.safetensors")):
        for name, tensor in load_file(path).items():
            match = _PER_EXPERT.match(name)
            if match:
                experts.setdefault(match["layer"], {}).setdefault(match["proj"], {})[int(match["e"])] = tensor
            else:
                tensors[name] = tensor
    for layer, projections in experts.items():
        count = len(projections["down_proj"])
        gate_up = [torch.cat([projections["gate_proj"][e], projections["up_proj"][e]]) for e in range(count)]
        tensors[f"{layer}.gate_up_proj"] = torch.stack(gate_up)
        tensors[f"{layer}.down_proj"] = torch.stack([projections["down_proj"][e] for e in range(count)])
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for extra in pathlib.Path(src).iterdir():
        if not extra.name.startswith("model") and extra.is_file():
            shutil.copy(extra, dst / extra.name)
    return str(dst)


@pytest.mark.slow
def test_fused_expert_checkpoint_gives_transformers_ids(tiny_model, tmp_path):
    from vllm import SamplingParams

    fused = _fuse_experts(tiny_model("qwen3_5-moe"), tmp_path / "fused")
    prompts = [[7], [(5 * i + 3) % 500 + 3 for i in range(90)]]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with engine(fused, dtype="float32") as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        want, want_logits = hf_greedy(tiny_model("qwen3_5-moe"), torch.float32, prompt, 8)
        assert_greedy_matches(list(out.outputs[0].token_ids), want, want_logits, torch.float32)
