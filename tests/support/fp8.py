"""The block-FP8 oracle: dequantization by a plain float64 loop over blocks, and a checkpoint's
dequantized twin (float32 weights, no ``quantization_config``) for transformers to load."""

import json
import pathlib
import shutil

import torch

SCALE_SUFFIX = "_scale_inv"


def blocks(shape: tuple[int, int], block: tuple[int, int]):
    """``(i, j, rows, cols)`` of each block of a ``shape`` weight: its scale's index and its clipped slices."""
    num_rows, num_cols = shape
    for i, r0 in enumerate(range(0, num_rows, block[0])):
        for j, c0 in enumerate(range(0, num_cols, block[1])):
            yield i, j, slice(r0, min(r0 + block[0], num_rows)), slice(c0, min(c0 + block[1], num_cols))


def _e4m3_table() -> tuple[torch.Tensor, torch.Tensor]:
    """Every finite non-negative-zero float8_e4m3fn value, sorted, in float64, with its bit pattern."""
    bits = torch.arange(256, dtype=torch.int32)
    values = bits.to(torch.uint8).view(torch.float8_e4m3fn).double()
    keep = values.isfinite() & ~((values == 0) & (bits >= 128))  # one zero
    order = values[keep].argsort()
    return values[keep][order], bits[keep][order]


def _nearest_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round float64 values to the nearest e4m3fn value, ties to the even bit pattern (saturating at +-448)."""
    table, bits = _e4m3_table()
    x = x.clamp(table[0], table[-1]).contiguous()
    upper_index = torch.searchsorted(table, x).clamp(max=len(table) - 1)
    lower_index = (upper_index - 1).clamp(min=0)
    lower, upper = table[lower_index], table[upper_index]
    below, above = (x - lower).abs(), (upper - x).abs()
    take_lower = (below < above) | ((below == above) & (bits[lower_index] % 2 == 0))
    return torch.where(take_lower, lower, upper)


def quantize_loop(w: torch.Tensor, block, scale_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Block quantization as the format defines it: per block, scale = amax / 448 (1 for an all-zero block)
    in ``scale_dtype``, each value / scale rounded to the nearest e4m3fn value (float64 results)."""
    grid = tuple(-(-n // b) for n, b in zip(w.shape, block))
    scale = torch.empty(grid, dtype=torch.float64)
    q = torch.empty(w.shape, dtype=torch.float64)
    for i, j, rows, cols in blocks(tuple(w.shape), block):
        amax = w[rows, cols].double().abs().max().item()
        stored = torch.tensor(amax / 448.0 if amax > 0 else 1.0, dtype=torch.float64).to(scale_dtype).double()
        scale[i, j] = stored
        # The quotient in float32 (as the quantizer divides), then rounded to e4m3fn here.
        q[rows, cols] = _nearest_e4m3((w[rows, cols].float() / stored.float()).double())
    return q, scale


def dequantize_loop(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``q * scale`` block by block, in float64."""
    out = torch.empty(q.shape, dtype=torch.float64)
    for i, j, rows, cols in blocks(tuple(q.shape), block):
        out[rows, cols] = q[rows, cols].double() * scale[i, j].double()
    return out


def dequantized_twin(folder: str, out: pathlib.Path) -> str:
    """Copy the block-FP8 checkpoint ``folder`` to ``out`` with every FP8 weight replaced by
    :func:`dequantize_loop` of it (rounded once, to float32) and no ``quantization_config``."""
    from safetensors.torch import load_file, save_file

    source = pathlib.Path(folder)
    config = json.loads((source / "config.json").read_text())
    block = tuple(config.pop("quantization_config")["weight_block_size"])
    out.mkdir(parents=True)
    weight_map = {}
    for shard in sorted(source.glob("*.safetensors")):
        tensors = load_file(str(shard))
        plain = {}
        for name, tensor in tensors.items():
            if name.endswith(SCALE_SUFFIX):
                continue
            if tensor.dtype == torch.float8_e4m3fn:
                plain[name] = dequantize_loop(tensor, tensors[name + SCALE_SUFFIX], block).float()
            else:
                plain[name] = tensor
        save_file(plain, str(out / shard.name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(plain, shard.name))
    for extra in source.iterdir():
        if extra.is_file() and not extra.name.endswith(".safetensors") and extra.name != "config.json":
            shutil.copy(extra, out / extra.name)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    index = json.loads((source / "model.safetensors.index.json").read_text())
    index["weight_map"] = weight_map
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return str(out)
