"""The oracles' checkpoints of a block-FP8 checkpoint: transformers reads them in fp32.

- :func:`dequantized_copy`: every FP8 weight as ``fp8 * scale_inv`` in float32 (the weights a
  block-FP8 checkpoint means; the oracle of the host-dequantized path);
- :func:`device_weights_copy`: each of those then requantized per output row in trn2's e4m3
  range and dequantized again (:func:`vllm_gdn_neuron.shells.neuron.fp8.quantize_rows`): the
  weights the FP8-on-device path computes with at ``tp`` ranks (a row-parallel weight's
  input columns split over the ranks, each rank's columns requantized on their own; other
  weights split by rows, whose scales do not depend on the split).

Both drop ``quantization_config``; tokenizer and other files are copied as they are.
"""

import json
import pathlib
import shutil

import torch

from vllm_gdn_neuron.model import fp8
from vllm_gdn_neuron.shells.neuron.fp8 import dequantize_rows, quantize_rows

# Checkpoint weights whose input columns split over the ranks (every expert's down_proj among them).
ROW_PARALLEL_CHECKPOINT = (".out_proj.weight", ".o_proj.weight", ".down_proj.weight")


def _copy(model_dir: str, out: pathlib.Path, transform) -> str:
    from safetensors.torch import load_file, save_file

    source = pathlib.Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    block = fp8.block_size_of(config.pop("quantization_config"))
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name not in ("config.json",
                                                                                  "model.safetensors.index.json"):
            shutil.copy(path, out / path.name)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    pending = {}
    for shard in sorted(source.glob("*.safetensors")):
        pending.update(load_file(str(shard)))
    tensors = {}
    for name, tensor in fp8.dequantized_tensors(pending.items(), block):
        is_fp8 = name in pending and pending[name].dtype == fp8.FP8_DTYPE
        tensors[name] = transform(name, tensor) if is_fp8 else tensor
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    weight_map = dict.fromkeys(tensors, "model.safetensors")
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return str(out)


def dequantized_copy(model_dir: str, out: pathlib.Path) -> str:
    """The checkpoint with every FP8 weight dequantized to float32."""
    return _copy(model_dir, out, lambda name, weight: weight)


def device_weights_copy(model_dir: str, out: pathlib.Path, tp: int = 1) -> str:
    """The checkpoint with every FP8 weight dequantized, requantized per row in e4m3 +-240 (per rank's
    columns for a row-parallel weight at ``tp`` ranks), dequantized (float32)."""

    def requantized(name, weight):
        pieces = weight.chunk(tp, dim=1) if name.endswith(ROW_PARALLEL_CHECKPOINT) else (weight,)
        return torch.cat([dequantize_rows(*quantize_rows(piece)) for piece in pieces], dim=1)

    return _copy(model_dir, out, requantized)
