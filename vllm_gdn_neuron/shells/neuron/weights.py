"""Checkpoint loading of the Neuron shell: Hugging Face safetensors -> this rank's parameters.

Parameter names are the checkpoint's own text-decoder names (vision-language prefixes
renamed, MTP head skipped: :mod:`vllm_gdn_neuron.model.checkpoint`; the vision tower is
loaded into ``visual.tower.*``, replicated, where the model has one and skipped otherwise),
except where the layouts differ:

- the projections that share an input are merged, as in the vLLM shell
  (:mod:`vllm_gdn_neuron.model.parameters`: ``in_proj_qkvz``, ``in_proj_ba``, ``qkv_proj``,
  ``gate_up_proj``); each checkpoint part's rows for this rank are copied into the part's
  rows of the merged parameter;
- routed experts, per-expert (``experts.{e}.gate_proj.weight``, ...) or fused 3-D
  (``experts.gate_up_proj``, ``experts.down_proj``), fill the stacked
  ``experts.gate_up_proj [E, 2 * I, H]`` and ``experts.down_proj [E, H, I]``;
- ``conv1d.weight [C, 1, K]`` drops its unit axis.

Each rank keeps its share of every tensor as :mod:`vllm_gdn_neuron.model.parameters` describes
it (:func:`~vllm_gdn_neuron.model.parameters.rank_share`; the LM head split by vocabulary rows
where the model splits its vocabulary).

A block-FP8 checkpoint (:mod:`vllm_gdn_neuron.model.fp8`) has its scales checked against its
weights from the shards' headers before any tensor is read; each FP8 weight is then
dequantized on the host (``fp8 * scale_inv`` in float32), whole, before it is split over
the ranks, so a rank's shard may be any size against the 128 x 128 blocks. The loader
records which parameters were written from FP8 tensors only (``model.fp8_params``): the ones
:mod:`.fp8` may keep in FP8 on the device.

Every parameter must be written exactly once; a missing, unexpected or misshaped tensor
raises ``ValueError`` naming it (never a half-initialised model).
"""

import json
import os
import pathlib
import re

import torch

from vllm_gdn_neuron.model.checkpoint import text_tensor_name, vision_tensor_name
from vllm_gdn_neuron.model.fp8 import (SAFETENSORS_FP8, check_checkpoint_scales, dequantized_tensors,
                                       read_tensor_headers)
from vllm_gdn_neuron.model.parameters import PartLoad, merged_loads, rank_rows, rank_share

_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


def checkpoint_files(model_path: str, download_dir: str | None) -> list[pathlib.Path]:
    """The safetensors files of a local checkpoint folder or a Hugging Face repository id."""
    folder = pathlib.Path(model_path)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        folder = pathlib.Path(snapshot_download(model_path, cache_dir=download_dir,
                                                allow_patterns=["*.safetensors", "*.json"]))
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / name for name in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model_path: no *.safetensors in {folder}")
    return files


def _checkpoint_tensors(files):
    from safetensors import safe_open

    for path in files:
        with safe_open(os.fspath(path), framework="pt") as handle:
            for key in handle.keys():
                yield key, handle.get_tensor(key)


class _Writer:
    """Writes this rank's slices into the model's parameters and remembers what it wrote."""

    def __init__(self, model) -> None:
        self.model = model
        self.config = model.config
        self.params = dict(model.named_parameters())
        group = model.tp_group
        self.tp, self.rank = group.world_size, group.rank_in_group
        self.vocab_split = model.vocab_shards > 1
        self.written: dict[str, set] = {name: set() for name in self.params}
        self.merged_parts: dict[str, set] = {}  # merged parameter -> the keys of all its parts
        self.fp8_sources: set[str] = set()  # checkpoint tensors stored in FP8
        self.written_from: dict[str, set[bool]] = {}  # parameter -> whether each write came from FP8

    def fp8_params(self) -> set[str]:
        """The parameters written from FP8 checkpoint tensors only."""
        return {name for name, kinds in self.written_from.items() if kinds == {True}}

    def write(self, source: str, name: str, tensor: torch.Tensor, index=None) -> None:
        if name not in self.params:
            raise ValueError(f"checkpoint tensor {source!r} has no parameter {name!r} in this model "
                             f"(is the config's architecture right?)")
        param = self.params[name]
        if isinstance(index, PartLoad):
            part, target, key = self._merged_part(source, name, tensor, index)
        else:
            part = rank_share(name, tensor, self.config, self.tp, self.rank, vocab_split=self.vocab_split)
            target = param.data
            key = "whole" if index is None else str(index)
            if isinstance(index, tuple):  # (expert, "gate" | "up") of a stacked gate_up_proj
                expert, half = index
                rows = param.shape[1] // 2
                target = target[expert, :rows] if half == "gate" else target[expert, rows:]
            elif index is not None:
                target = target[index]
        if tuple(part.shape) != tuple(target.shape):
            raise ValueError(f"checkpoint tensor {source!r}: this rank's slice of {name!r} must have shape "
                             f"{tuple(target.shape)}; got {tuple(part.shape)}")
        if key in self.written[name]:
            raise ValueError(f"checkpoint tensor {source!r} writes {name!r} a second time")
        target.copy_(part.to(param.dtype))
        self.written[name].add(key)
        self.written_from.setdefault(name, set()).add(source in self.fp8_sources)

    def _merged_part(self, source: str, name: str, tensor: torch.Tensor, load: PartLoad):
        """This rank's rows of one part of a merged projection, the rows they fill, and the part's key."""
        merged, index = load.merged, load.part
        self.merged_parts[name] = {str(p) for p in range(len(merged.shard_ids))}
        rows = merged.part_sizes(self.config)[index]
        if tensor.shape[0] != rows:
            raise ValueError(f"checkpoint tensor {source!r}: part {index} of {name!r} must have {rows} rows; "
                             f"got shape {tuple(tensor.shape)}")
        take, into = rank_rows(merged, index, self.config, self.tp, self.rank)
        return tensor[take], self.params[name].data[into], str(index)

    def check_complete(self) -> None:
        experts = range(getattr(self.config, "num_experts", 0))
        complete = {
            ".experts.gate_up_proj": {str((e, half)) for e in experts for half in ("gate", "up")},
            ".experts.down_proj": {str(e) for e in experts},
        }
        missing = []
        for name, keys in self.written.items():
            stacked = next((want for suffix, want in complete.items() if name.endswith(suffix)), None)
            merged = self.merged_parts.get(name)
            if keys == {"whole"} or keys in (stacked, merged):
                continue
            missing.append(name)
        if missing:
            raise ValueError(f"the checkpoint does not provide {len(missing)} parameters: {missing[:8]}")


def load_checkpoint(model, model_path: str, device: torch.device, download_dir: str | None) -> None:
    """Fill every parameter of ``model`` (a :class:`Qwen3_5NeuronForCausalLM`) from the checkpoint."""
    files = checkpoint_files(model_path, download_dir)
    tensors = _checkpoint_tensors(files)
    fp8_sources = set()
    if model.checkpoint_block_size is not None:  # scales checked from the headers, before any tensor is read
        headers = read_tensor_headers(files[0].parent)
        check_checkpoint_scales(headers, model.checkpoint_block_size)
        fp8_sources = {name for name, (dtype, _) in headers.items() if dtype == SAFETENSORS_FP8}
        tensors = dequantized_tensors(tensors, model.checkpoint_block_size)
    if any(p.is_meta for p in model.parameters()):
        model.to_empty(device=device)
    writer = _Writer(model)
    writer.fp8_sources = fp8_sources
    config = model.config
    has_tower = hasattr(model, "visual")
    for key, tensor in tensors:
        tower_name = vision_tensor_name(key)
        if tower_name is not None and has_tower:
            writer.write(key, f"visual.tower.{tower_name}", tensor.to(device))
            continue
        name = text_tensor_name(key)
        if name is None:
            continue
        if name == "lm_head.weight" and model.tie_word_embeddings:
            continue
        tensor = tensor.to(device)
        if name == "model.embed_tokens.weight" and model.tie_word_embeddings:
            writer.write(key, "lm_head.weight", tensor)
        for target, part, index in _plan(name, tensor, config):
            writer.write(key, target, part, index)
    writer.check_complete()
    model.fp8_params = writer.fp8_params()


def _plan(name: str, tensor: torch.Tensor, config):
    """The ``(parameter, tensor, index into the parameter or None)`` writes of one checkpoint
    tensor; a part of a merged projection is indexed by its :class:`PartLoad` (the whole part)."""
    writes = []
    for load in merged_loads(name, tensor, config):
        writes += [(load.param, load.tensor, load)] if load.merged is not None else _writes(load.param, load.tensor)
    return writes


def _writes(name: str, tensor: torch.Tensor):
    """The writes of one tensor loaded whole, or of a routed expert into the stacked experts."""
    if name.endswith(".linear_attn.conv1d.weight"):
        return [(name, tensor.reshape(tensor.shape[0], tensor.shape[-1]), None)]
    match = _EXPERT.match(name)
    if match:
        expert, proj = int(match["expert"]), match["proj"]
        if proj == "down":
            return [(match["prefix"] + ".down_proj", tensor, expert)]
        return [(match["prefix"] + ".gate_up_proj", tensor, (expert, proj))]
    return [(name, tensor, None)]
