"""The trained tiny checkpoint at a larger per-step cost, computing the same function.

    python scripts/scale_checkpoint.py SRC DST --layers 24              # 24 decoder layers
    python scripts/scale_checkpoint.py SRC DST --value-head-dim 32      # GDN value heads of 32
    python scripts/scale_checkpoint.py SRC DST --key-head-dim 64 --value-head-dim 64   # what vLLM's C++ GDN kernels take

Speculative decoding pays off when a forward of the target costs much more than one of the
drafter. The trained tiny model (4 decoder layers, hidden 64) is too small for that: a decode
step is mostly the runner's fixed cost. These transforms make a checkpoint that decodes exactly
the trained model's tokens (so its MTP drafts are accepted as often) with more work per step:

- :func:`deepen` repeats the decoder layers (their ``layer_types`` pattern with them) up to
  ``num_layers``; every added layer's output projections (``linear_attn.out_proj``,
  ``self_attn.o_proj``, ``mlp.down_proj``) are zero, so it adds nothing to the residual
  stream but costs a real layer's time. The MTP head is untouched.
- :func:`widen_value_heads` widens each GatedDeltaNet value head from Dv to ``value_head_dim``
  (a multiple of Dv) by repeating its value channels: the rows of ``in_proj_qkv`` (its v
  part), ``conv1d`` and ``in_proj_z`` and the gated norm's weight repeat, so the recurrent
  state holds each value column that many times (columns of the delta rule are independent)
  and the gated RMSNorm over a head sees the same mean square; only the first copy's columns
  of ``out_proj`` are non-zero. Zero padding would not do: the norm's epsilon would then act
  on a smaller mean square.
- :func:`widen_key_heads` widens each query / key head from Dk to ``key_head_dim`` (r times
  Dk) the same way (the rows of ``in_proj_qkv`` and ``conv1d``). After the in-kernel L2 norm
  each copy carries ``1 / sqrt(r)`` of the head, so q.k and the state's response to a key are
  unchanged, but the output's ``1 / sqrt(Dk)`` scale falls by ``sqrt(r)``; the gated RMSNorm
  that follows undoes that exactly once its epsilon is divided by r. The config's
  ``rms_norm_eps`` is shared by every RMSNorm, so the others (on hidden states of order one)
  run with that smaller epsilon too: the function is the source's to within that epsilon.

vLLM's C++ GDN kernels take Dk in {64, 128} and Dv a multiple of 32; the tiny model's are 32 and
16, so ``--key-head-dim 64 --value-head-dim 64`` makes a checkpoint vLLM's built-in Qwen3-Next runs.

Each writes a complete checkpoint folder (config, bf16 safetensors, tokenizer files).
"""

import argparse
import json
import pathlib
import shutil

ZEROED_OUTPUTS = ("linear_attn.out_proj.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight")


def _layer_index(name: str) -> tuple[int, str] | None:
    """(i, rest) of ``model.layers.{i}.{rest}``, else None."""
    prefix = "model.layers."
    if not name.startswith(prefix):
        return None
    index, rest = name[len(prefix):].split(".", 1)
    return int(index), rest


def deepen_tensors(tensors: dict, num_layers: int, source_layers: int) -> dict:
    """Tensors of ``source_layers`` decoder layers -> ``num_layers``: layer ``i >= source_layers``
    is a copy of layer ``i % source_layers`` with its output projections zero."""
    out = dict(tensors)
    for name, tensor in tensors.items():
        parsed = _layer_index(name)
        if parsed is None:
            continue
        index, rest = parsed
        for target in range(index + source_layers, num_layers, source_layers):
            copy = tensor.clone()
            if rest in ZEROED_OUTPUTS:
                copy.zero_()
            out[f"model.layers.{target}.{rest}"] = copy
    return out


def _repeat_heads(weight, dim: int, heads: int, size: int, repeats: int, zero_copies: bool = False):
    """``weight`` whose ``dim`` is ``heads`` heads of ``size``, each head's channels repeated
    ``repeats`` times in place (``zero_copies``: every copy but the first zero)."""
    import torch

    split = weight.unflatten(dim, (heads, 1, size))
    if zero_copies:
        zeros = split.new_zeros(split.shape[:dim + 1] + (repeats - 1,) + split.shape[dim + 2:])
        wide = torch.cat([split, zeros], dim=dim + 1)
    else:
        wide = split.repeat_interleave(repeats, dim=dim + 1)
    return wide.flatten(dim, dim + 2).contiguous()


def widen_value_tensors(tensors: dict, config: dict, value_head_dim: int) -> dict:
    """GatedDeltaNet value heads of Dv = ``config["linear_value_head_dim"]`` -> ``value_head_dim``
    (a multiple of Dv) by repeating each head's value channels; every other tensor unchanged."""
    import torch

    hk, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
    hv, dv = config["linear_num_value_heads"], config["linear_value_head_dim"]
    repeats = value_head_dim // dv
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight")):
            q, k, v = tensor.split([hk * dk, hk * dk, hv * dv])
            out[name] = torch.cat([q, k, _repeat_heads(v, 0, hv, dv, repeats)])
        elif name.endswith("linear_attn.in_proj_z.weight"):
            out[name] = _repeat_heads(tensor, 0, hv, dv, repeats)
        elif name.endswith("linear_attn.norm.weight"):
            out[name] = tensor.repeat(repeats)
        elif name.endswith("linear_attn.out_proj.weight"):
            out[name] = _repeat_heads(tensor, 1, hv, dv, repeats, zero_copies=True)
        else:
            out[name] = tensor
    return out


def widen_key_tensors(tensors: dict, config: dict, key_head_dim: int) -> dict:
    """GatedDeltaNet query / key heads of Dk = ``config["linear_key_head_dim"]`` -> ``key_head_dim``
    (a multiple of Dk) by repeating each head's query and key channels."""
    import torch

    hk, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
    repeats = key_head_dim // dk
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight")):
            q, k, v = tensor.split([hk * dk, hk * dk, tensor.shape[0] - 2 * hk * dk])
            out[name] = torch.cat([_repeat_heads(q, 0, hk, dk, repeats), _repeat_heads(k, 0, hk, dk, repeats), v])
        else:
            out[name] = tensor
    return out


def _rewrite(source: pathlib.Path, target: pathlib.Path, transform_tensors, transform_config) -> pathlib.Path:
    """Copy the folder ``source`` to ``target`` with its tensors and config transformed."""
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    tensors = transform_tensors(load_file(str(source / "model.safetensors")), config)
    if target.resolve() != source.resolve():
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target)
    (target / "config.json").write_text(json.dumps(transform_config(config), indent=2) + "\n")
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def deepen(source: pathlib.Path, target: pathlib.Path, num_layers: int) -> pathlib.Path:
    """Write ``source`` with ``num_layers`` decoder layers to ``target`` (:func:`deepen_tensors`)."""
    config = json.loads((source / "config.json").read_text())
    source_layers = config["num_hidden_layers"]
    if num_layers < source_layers:
        raise ValueError(f"num_layers must be at least the source's {source_layers} layers, got {num_layers}")

    def new_config(c):
        pattern = c["layer_types"]
        return {**c, "num_hidden_layers": num_layers,
                "layer_types": [pattern[i % source_layers] for i in range(num_layers)]}

    return _rewrite(source, target, lambda t, c: deepen_tensors(t, num_layers, source_layers), new_config)


def widen_value_heads(source: pathlib.Path, target: pathlib.Path, value_head_dim: int) -> pathlib.Path:
    """Write ``source`` with GatedDeltaNet value heads of ``value_head_dim`` to ``target``."""
    dv = json.loads((source / "config.json").read_text())["linear_value_head_dim"]
    if value_head_dim < dv or value_head_dim % dv:
        raise ValueError(f"value_head_dim must be a multiple of the source's linear_value_head_dim {dv}, "
                         f"got {value_head_dim}")
    return _rewrite(source, target, lambda t, c: widen_value_tensors(t, c, value_head_dim),
                    lambda c: {**c, "linear_value_head_dim": value_head_dim})


def widen_key_heads(source: pathlib.Path, target: pathlib.Path, key_head_dim: int) -> pathlib.Path:
    """Write ``source`` with GatedDeltaNet query / key heads of ``key_head_dim`` to ``target``."""
    dk = json.loads((source / "config.json").read_text())["linear_key_head_dim"]
    if key_head_dim < dk or key_head_dim % dk:
        raise ValueError(f"key_head_dim must be a multiple of the source's linear_key_head_dim {dk}, "
                         f"got {key_head_dim}")
    repeats = key_head_dim // dk
    return _rewrite(source, target, lambda t, c: widen_key_tensors(t, c, key_head_dim),
                    lambda c: {**c, "linear_key_head_dim": key_head_dim, "rms_norm_eps": c["rms_norm_eps"] / repeats})


def scale(source: pathlib.Path, target: pathlib.Path, *, key_head_dim: int | None = None,
          value_head_dim: int | None = None, num_layers: int | None = None) -> pathlib.Path:
    """Write ``source`` to ``target`` with the given GDN head sizes and decoder layers (each
    None: the source's), widening the heads first."""
    current = source
    for size, transform in ((key_head_dim, widen_key_heads), (value_head_dim, widen_value_heads),
                            (num_layers, deepen)):
        if size:
            current = transform(current, target, size)
    return current


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=pathlib.Path)
    parser.add_argument("target", type=pathlib.Path)
    parser.add_argument("--layers", type=int, help="decoder layers of the target")
    parser.add_argument("--key-head-dim", type=int, help="GatedDeltaNet query / key head size of the target")
    parser.add_argument("--value-head-dim", type=int, help="GatedDeltaNet value head size of the target")
    args = parser.parse_args(argv)
    print(scale(args.source, args.target, key_head_dim=args.key_head_dim, value_head_dim=args.value_head_dim,
                num_layers=args.layers))


if __name__ == "__main__":
    main()
