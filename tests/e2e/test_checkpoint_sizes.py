"""The byte arithmetic ``vllm-gdn-serve`` sizes memory with, against real checkpoints.

``parameter_count`` is computed from ``config.json`` alone; here it must equal the
element count of the tensors the served model loads (all but ``mtp.*`` and the vision
tower) in every tiny checkpoint (dense, MoE, Qwen3-Next layout, vision-language).
"""

import json
import math
import pathlib

import pytest

from vllm_gdn_neuron.preflight import load_checkpoint, parameter_count, weight_bytes


def served_tensor_sizes(folder: str) -> tuple[int, int]:
    """(elements, bytes) of the text-model tensors in a checkpoint folder's safetensors files."""
    from safetensors import safe_open

    elements = nbytes = 0
    for path in sorted(pathlib.Path(folder).glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for key in handle.keys():
                if key.startswith("mtp.") or ".visual." in f".{key}":
                    continue
                piece = handle.get_slice(key)
                count = math.prod(piece.get_shape())
                elements += count
                nbytes += count * {"BF16": 2, "F16": 2, "F32": 4}[piece.get_dtype()]
    return elements, nbytes


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3_5-dense", "qwen3_5-moe", "qwen3-next", "qwen3_5-vl", "qwen3_5-moe-vl"])
def test_parameter_count_equals_the_checkpoint(tiny_model, model):
    checkpoint = load_checkpoint(tiny_model(model))
    elements, nbytes = served_tensor_sizes(tiny_model(model))
    assert parameter_count(checkpoint.text) == elements
    assert weight_bytes(checkpoint.text, checkpoint.dtype) == nbytes
    config = json.loads((pathlib.Path(tiny_model(model)) / "config.json").read_text())
    assert checkpoint.architecture == config["architectures"][0]
