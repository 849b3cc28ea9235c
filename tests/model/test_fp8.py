"""Block-FP8 quantization, dequantization and checks against a plain float64 loop over blocks."""

import pytest
import torch

from tests.support.fp8 import blocks, dequantize_loop, quantize_loop
from vllm_gdn_neuron.model import fp8

# Shapes on, off and under the 128-block: one clipped block, clipped last row / column blocks, exact blocks.
SHAPES = [(1, 1), (64, 32), (127, 129), (128, 128), (130, 257), (256, 64)]
BLOCKS = [(128, 128), (4, 3)]


def _random_fp8(shape, gen) -> torch.Tensor:
    bits = torch.randint(0, 256, shape, generator=gen, dtype=torch.int32).to(torch.uint8)
    bits[(bits & 0x7F) == 0x7F] = 0  # no NaN patterns
    return bits.view(torch.float8_e4m3fn)


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_dequantize_matches_block_loop(shape, block, scale_dtype):
    gen = torch.Generator().manual_seed(0)
    q = _random_fp8(shape, gen)
    scale = (torch.rand(fp8.scale_shape(shape, block), generator=gen) * 0.01 + 1e-4).to(scale_dtype)
    out = fp8.dequantize_blocks(q, scale, block)
    assert out.dtype == torch.float32 and out.shape == shape
    torch.testing.assert_close(out.double(), dequantize_loop(q, scale, block), rtol=2**-24, atol=0)


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_quantize_matches_block_loop(shape, block, scale_dtype):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(shape, generator=gen) * torch.logspace(-3, 1, shape[1])  # columns of very different scale
    w[: block[0], : block[1]] = 0  # an all-zero block: scale 1
    q, scale = fp8.quantize_blocks(w, block, scale_dtype)
    q_ref, scale_ref = quantize_loop(w, block, scale_dtype)
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == scale_dtype
    assert scale.shape == fp8.scale_shape(shape, block)
    torch.testing.assert_close(scale.double(), scale_ref, rtol=0, atol=0)
    torch.testing.assert_close(q.double(), q_ref, rtol=0, atol=0)
    # The round trip is within half an e4m3 step (2^-4 relative) of each block's own values.
    back = fp8.dequantize_blocks(q, scale, block).double()
    for i, j, rows, cols in blocks(shape, block):
        step = scale[i, j].double() * 2**-9  # e4m3fn's smallest subnormal, in the block's units
        bound = w[rows, cols].double().abs() * 2**-4 + step
        assert ((back[rows, cols] - w[rows, cols].double()).abs() <= bound).all()


def test_quantize_refuses_bad_input():
    with pytest.raises(ValueError, match=r"weight must be 2-D \[N, K\]; got shape \(2, 3, 4\)"):
        fp8.quantize_blocks(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="scale_dtype must be one of .*got torch.float16"):
        fp8.quantize_blocks(torch.zeros(2, 3), scale_dtype=torch.float16)


def test_dequantize_refuses_misshaped_scale_and_non_fp8():
    q = torch.zeros(130, 257).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"w.weight_scale_inv: shape must be \(2, 3\) .*\(130, 257\).*got \(1, 3\)"):
        fp8.dequantize_blocks(q, torch.ones(1, 3), name="w.weight")
    with pytest.raises(ValueError, match="w.weight: a block-quantized weight must be torch.float8_e4m3fn; got torch.bfloat16"):
        fp8.dequantize_blocks(torch.zeros(4, 4, dtype=torch.bfloat16), torch.ones(1, 1), name="w.weight")


@pytest.mark.parametrize("name, quantized", [
    ("model.layers.0.linear_attn.in_proj_qkv.weight", True),
    ("model.layers.0.linear_attn.in_proj_z.weight", True),
    ("model.layers.0.linear_attn.in_proj_qkvz.weight", True),
    ("model.layers.0.linear_attn.out_proj.weight", True),
    ("model.language_model.layers.3.self_attn.o_proj.weight", True),
    ("model.layers.0.mlp.down_proj.weight", True),
    ("model.layers.0.mlp.shared_expert.up_proj.weight", True),
    ("model.layers.0.mlp.experts.17.gate_proj.weight", True),
    ("mtp.layers.0.self_attn.q_proj.weight", True),
    ("model.layers.0.linear_attn.in_proj_a.weight", False),
    ("model.layers.0.linear_attn.in_proj_ba.weight", False),
    ("model.layers.0.linear_attn.conv1d.weight", False),
    ("model.layers.0.linear_attn.A_log", False),
    ("model.layers.0.mlp.gate.weight", False),
    ("model.layers.0.mlp.shared_expert_gate.weight", False),
    ("model.embed_tokens.weight", False),
    ("lm_head.weight", False),
    ("mtp.fc.weight", False),
    ("model.visual.blocks.0.attn.proj.weight", False),
    ("model.layers.0.self_attn.q_norm.weight", False),
])
def test_which_tensors_are_quantized(name, quantized):
    assert fp8.is_quantized_weight(name) is quantized


def test_modules_to_not_convert_by_full_name():
    name = "model.language_model.layers.1.mlp.experts.0.up_proj.weight"
    assert not fp8.is_quantized_weight(name, ["model.language_model.layers.1.mlp.experts.0.up_proj"])
    assert not fp8.is_quantized_weight(name, ["model.language_model.layers.1"])
    assert fp8.is_quantized_weight(name, ["model.language_model.layers.10"])


def _headers(**overrides):
    tensors = {
        "a.weight": ("F8_E4M3", (130, 257)), "a.weight_scale_inv": ("BF16", (2, 3)),
        "b.weight": ("F8_E4M3", (64, 32)), "b.weight_scale_inv": ("F32", (1, 1)),
        "n.weight": ("BF16", (64,)),
    }
    tensors.update(overrides)
    return {name: spec for name, spec in tensors.items() if spec is not None}


def test_checkpoint_scales_pass():
    fp8.check_checkpoint_scales(_headers())


@pytest.mark.parametrize("overrides, message", [
    (dict(**{"a.weight_scale_inv": None}), r"a.weight_scale_inv: missing; the FP8 weight a.weight \(130, 257\) needs "
                                            r"block scales of shape \(2, 3\)"),
    (dict(**{"a.weight_scale_inv": ("BF16", (1, 3))}), r"a.weight_scale_inv: shape must be \(2, 3\) .*got \(1, 3\)"),
    (dict(**{"b.weight_scale_inv": ("F16", (1, 1))}), r"b.weight_scale_inv: dtype must be one of \['F32', 'BF16'\]; got F16"),
    (dict(**{"n.weight_scale_inv": ("F32", (1,))}), r"n.weight: must be an F8_E4M3 weight beside its n.weight_scale_inv; got BF16"),
    (dict(**{"c.weight_scale_inv": ("F32", (1, 1))}), r"c.weight: must be an F8_E4M3 weight .*; got missing"),
    (dict(**{"c.weight": ("F8_E4M3", (2, 3, 4)), "c.weight_scale_inv": ("F32", (1, 1))}),
     r"c.weight: a block-quantized weight must be 2-D; got shape \(2, 3, 4\)"),
])
def test_checkpoint_scales_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        fp8.check_checkpoint_scales(_headers(**overrides))


def test_read_tensor_headers_reads_no_data(tmp_path):
    from safetensors.torch import save_file

    q, scale = fp8.quantize_blocks(torch.randn(130, 257))
    save_file({"a.weight": q, "a.weight_scale_inv": scale, "n.weight": torch.ones(3, dtype=torch.bfloat16)},
              str(tmp_path / "model.safetensors"))
    assert fp8.read_tensor_headers(tmp_path) == {
        "a.weight": ("F8_E4M3", (130, 257)), "a.weight_scale_inv": ("F32", (2, 3)), "n.weight": ("BF16", (3,)),
    }


@pytest.mark.parametrize("config, message", [
    ({"fmt": "e5m2", "weight_block_size": [128, 128]}, "quantization_config.fmt must be 'e4m3' .*got 'e5m2'"),
    ({"activation_scheme": "static", "weight_block_size": [128, 128]},
     "quantization_config.activation_scheme must be 'dynamic' .*got 'static'"),
    ({}, r"quantization_config.weight_block_size must be two positive ints .*per-tensor FP8 is not supported\); got None"),
    ({"weight_block_size": [128]}, r"weight_block_size must be two positive ints .*got \[128\]"),
])
def test_fp8_config_refused(config, message):
    with pytest.raises(ValueError, match=message):
        fp8.check_fp8_config({"quant_method": "fp8", **config})


def test_fp8_config_published_passes():
    config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
              "modules_to_not_convert": ["lm_head"]}
    fp8.check_fp8_config(config)
    assert fp8.block_size_of(config) == (128, 128)


@pytest.mark.parametrize("scale_first", [False, True])
def test_dequantized_tensors_stream(scale_first):
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(130, 257, generator=gen)
    q, scale = fp8.quantize_blocks(w)
    norm = torch.ones(5, dtype=torch.bfloat16)
    pair = [("a.weight_scale_inv", scale), ("a.weight", q)] if scale_first else [("a.weight", q), ("a.weight_scale_inv", scale)]
    out = dict(fp8.dequantized_tensors([("n.weight", norm), *pair, ("m.weight", norm)], dtype=torch.bfloat16))
    assert list(out) == ["n.weight", "a.weight", "m.weight"]
    assert out["n.weight"] is norm
    assert out["a.weight"].dtype == torch.bfloat16
    torch.testing.assert_close(out["a.weight"].double(), dequantize_loop(q, scale, (128, 128)).bfloat16().double(),
                               rtol=0, atol=0)


def test_dequantized_tensors_refuse_unpaired():
    q, scale = fp8.quantize_blocks(torch.randn(4, 4))
    with pytest.raises(ValueError, match=r"a.weight_scale_inv: missing; the FP8 weight a.weight \(4, 4\)"):
        list(fp8.dequantized_tensors([("a.weight", q)]))
    with pytest.raises(ValueError, match="a.weight_scale_inv: block scales without their FP8 weight a.weight"):
        list(fp8.dequantized_tensors([("a.weight_scale_inv", scale)]))
