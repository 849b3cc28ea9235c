"""A configuration the GatedDeltaNet layer cannot serve fails at start-up, saying why.

The check runs in vLLM's config hook (before any weight is loaded or any process is
started), so a server never reports healthy and then fails at the first request.
"""

import json
import shutil

import torch

import pytest

from tests.support.engines import engine


def _edited_copy(src: str, dst, **changes) -> str:
    shutil.copytree(src, dst)
    config_path = dst / "config.json"
    config = json.loads(config_path.read_text())
    config.update(changes)
    config_path.write_text(json.dumps(config))
    return str(dst)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"linear_num_value_heads": 3}, "linear_num_value_heads must be a positive multiple of linear_num_key_heads"),
        ({"hidden_act": "gelu"}, "hidden_act must be 'silu'"),
        ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
         "layer_types\\[1\\] must be 'linear_attention' or 'full_attention'; got 'sliding_attention'"),
    ],
)
def test_unservable_config_is_refused_at_startup(tiny_model, tmp_path, changes, message):
    model_dir = _edited_copy(tiny_model("qwen3_5-dense"), tmp_path / "model", **changes)
    with pytest.raises(ValueError, match=message):
        with engine(model_dir, dtype="float32"):
            pass


@pytest.mark.slow
def test_a_checkpoint_tensor_without_a_parameter_is_refused(tiny_model, tmp_path):
    from safetensors.torch import save_file

    model_dir = _edited_copy(tiny_model("qwen3_5-dense"), tmp_path / "model")
    save_file({"model.layers.0.linear_attn.in_proj_w.weight": torch.zeros(4, 64)}, str(tmp_path / "model" / "extra.safetensors"))
    index_path = tmp_path / "model" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.layers.0.linear_attn.in_proj_w.weight"] = "extra.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match="checkpoint tensor 'model.layers.0.linear_attn.in_proj_w.weight' has no parameter"):
        with engine(model_dir, dtype="float32"):
            pass
