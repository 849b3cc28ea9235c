"""Checkpoint loading of the Neuron shell: Hugging Face safetensors -> this rank's parameters.

Parameter names are the checkpoint's own text-decoder names (vision-language prefixes
renamed, MTP head skipped: :mod:`vllm_gdn_neuron.model.checkpoint`; the vision tower is
loaded into ``visual.tower.*``, replicated, where the model has one and skipped otherwise),
except where the layouts differ:

- Qwen3-Next ``in_proj_qkvz`` / ``in_proj_ba`` are un-interleaved into Qwen3.5's
  ``in_proj_qkv`` + ``in_proj_z`` and ``in_proj_b`` + ``in_proj_a``
  (:func:`~vllm_gdn_neuron.model.checkpoint.flat_gdn_tensors`);
- routed experts, per-expert (``experts.{e}.gate_proj.weight``, ...) or fused 3-D
  (``experts.gate_up_proj``, ``experts.down_proj``), fill the stacked
  ``experts.gate_up_proj [E, 2 * I, H]`` and ``experts.down_proj [E, H, I]``;
- ``conv1d.weight [C, 1, K]`` drops its unit axis.

Every parameter must be written exactly once; a missing, unexpected or misshaped tensor
raises ``ValueError`` naming it (never a half-initialised model).
"""

import json
import os
import pathlib
import re

import torch

from vllm_gdn_neuron.model.checkpoint import flat_gdn_tensors, text_tensor_name, vision_tensor_name
from vllm_gdn_neuron.shells.neuron.parallel import shard

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
        self.written: dict[str, set] = {name: set() for name in self.params}

    def write(self, source: str, name: str, tensor: torch.Tensor, index=None) -> None:
        if name not in self.params:
            raise ValueError(f"checkpoint tensor {source!r} has no parameter {name!r} in this model "
                             f"(is the config's architecture right?)")
        part = self._shard(name, tensor)
        param = self.params[name]
        target = param.data
        if isinstance(index, tuple):  # (expert, "gate" | "up") of a stacked gate_up_proj
            expert, half = index
            rows = param.shape[1] // 2
            target = target[expert, :rows] if half == "gate" else target[expert, rows:]
        elif index is not None:
            target = target[index]
        if tuple(part.shape) != tuple(target.shape):
            raise ValueError(f"checkpoint tensor {source!r}: this rank's slice of {name!r} must have shape "
                             f"{tuple(target.shape)}; got {tuple(part.shape)}")
        key = "whole" if index is None else str(index)
        if key in self.written[name]:
            raise ValueError(f"checkpoint tensor {source!r} writes {name!r} a second time")
        target.copy_(part.to(param.dtype))
        self.written[name].add(key)

    def _shard(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if self.tp == 1 or name.startswith("visual."):  # the vision tower is replicated
            return tensor
        config, tp, rank = self.config, self.tp, self.rank
        key_dim = config.linear_num_key_heads * config.linear_key_head_dim
        value_dim = config.linear_num_value_heads * config.linear_value_head_dim
        if name.endswith((".in_proj_qkv.weight", ".conv1d.weight")):
            return shard(tensor, 0, rank, tp, (key_dim, key_dim, value_dim))
        if name.endswith((".in_proj_z.weight", ".in_proj_b.weight", ".in_proj_a.weight", ".A_log", ".dt_bias",
                          ".q_proj.weight", ".gate_proj.weight", ".up_proj.weight")):
            return shard(tensor, 0, rank, tp)
        if name.endswith((".out_proj.weight", ".o_proj.weight", "mlp.down_proj.weight",
                          "shared_expert.down_proj.weight")):
            return shard(tensor, 1, rank, tp)
        if name.endswith((".k_proj.weight", ".v_proj.weight")):
            kv_heads = config.num_key_value_heads
            if tp <= kv_heads:
                return shard(tensor, 0, rank, tp)
            head = rank // (tp // kv_heads)
            return tensor.narrow(0, head * config.head_dim, config.head_dim)
        if name.endswith(".experts.gate_up_proj"):
            # per expert [2I, H] (gate rows then up rows) or fused [E, 2I, H]
            inter = config.moe_intermediate_size
            return shard(tensor, tensor.dim() - 2, rank, tp, (inter, inter) if tensor.shape[-2] == 2 * inter else None)
        if name.endswith(".experts.down_proj"):
            return shard(tensor, tensor.dim() - 1, rank, tp)
        if name == "lm_head.weight" and self.model.vocab_shards > 1:
            return shard(tensor, 0, rank, tp)
        return tensor

    def check_complete(self) -> None:
        experts = range(getattr(self.config, "num_experts", 0))
        complete = {
            ".experts.gate_up_proj": {str((e, half)) for e in experts for half in ("gate", "up")},
            ".experts.down_proj": {str(e) for e in experts},
        }
        missing = []
        for name, keys in self.written.items():
            stacked = next((want for suffix, want in complete.items() if name.endswith(suffix)), None)
            if keys == {"whole"} or (stacked is not None and keys == stacked):
                continue
            missing.append(name)
        if missing:
            raise ValueError(f"the checkpoint does not provide {len(missing)} parameters: {missing[:8]}")


def load_checkpoint(model, model_path: str, device: torch.device, download_dir: str | None) -> None:
    """Fill every parameter of ``model`` (a :class:`Qwen3_5NeuronForCausalLM`) from the checkpoint."""
    if any(p.is_meta for p in model.parameters()):
        model.to_empty(device=device)
    writer = _Writer(model)
    config = model.config
    has_tower = hasattr(model, "visual")
    for key, tensor in _checkpoint_tensors(checkpoint_files(model_path, download_dir)):
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


def _plan(name: str, tensor: torch.Tensor, config):
    """The ``(parameter, tensor, index into the parameter or None)`` writes of one checkpoint tensor."""
    return [write for flat_name, flat in flat_gdn_tensors(name, tensor, config) for write in _writes(flat_name, flat)]


def _writes(name: str, tensor: torch.Tensor):
    """The writes of one tensor in the flat layout."""
    if name.endswith(".linear_attn.conv1d.weight"):
        return [(name, tensor.reshape(tensor.shape[0], tensor.shape[-1]), None)]
    match = _EXPERT.match(name)
    if match:
        expert, proj = int(match["expert"]), match["proj"]
        if proj == "down":
            return [(match["prefix"] + ".down_proj", tensor, expert)]
        return [(match["prefix"] + ".gate_up_proj", tensor, (expert, proj))]
    return [(name, tensor, None)]
