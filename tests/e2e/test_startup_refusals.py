"""A configuration the GatedDeltaNet layer cannot serve fails at start-up, saying why.

The check runs in vLLM's config hook (before any weight is loaded or any process is
started), so a server never reports healthy and then fails at the first request.
"""

import json
import shutil

import pytest

from conftest import engine


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
    ],
)
def test_unservable_config_is_refused_at_startup(tiny_models, tmp_path, changes, message):
    model_dir = _edited_copy(tiny_models["qwen3_5-dense"], tmp_path / "model", **changes)
    with pytest.raises(ValueError, match=message):
        with engine(model_dir, dtype="float32"):
            pass
