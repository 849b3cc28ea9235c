"""The vision tower and M-RoPE against transformers' Qwen3.5 modules.

The tower takes transformers' ``Qwen3_5VisionModel`` weights by name; images of different
sizes (square, wide, tall), a two-frame-pair video and a one-merged-token image go through
in one call, as a batch of requests does.
"""

import pytest
import torch

from vllm_gdn_neuron.model.checkpoint import vision_tensor_name
from vllm_gdn_neuron.model.rotary import PartialRotaryEmbedding, mrope_axes
from vllm_gdn_neuron.model.vision import VisionTower, check_grid_thw, mrope_positions, vision_grid_inputs

# (t, h, w) in patches: a wide image, a tall one, a video of 2 temporal patches, a 2x2 image.
GRIDS = [[1, 4, 6], [1, 8, 2], [2, 4, 4], [1, 2, 2]]


def _vision_config(**overrides):
    from transformers import Qwen3_5VisionConfig

    dims = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=24, patch_size=4,
                temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)
    return Qwen3_5VisionConfig(**{**dims, **overrides})


@pytest.fixture(scope="module")
def towers():
    """(transformers' tower, ours with its weights), fp32, random weights with non-trivial biases and norms."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    torch.manual_seed(0)
    config = _vision_config()
    theirs = Qwen3_5VisionModel._from_config(config, attn_implementation="sdpa").eval()
    with torch.no_grad():
        for param in theirs.parameters():
            param.copy_(0.3 * torch.randn_like(param))
    ours = VisionTower(config)
    missing = ours.load_state_dict(
        {vision_tensor_name(f"model.visual.{name}"): value for name, value in theirs.state_dict().items()})
    assert not missing.missing_keys and not missing.unexpected_keys
    return theirs, ours.eval()


def _pixels(tower, grids, seed=1):
    generator = torch.Generator().manual_seed(seed)
    patches = sum(t * h * w for t, h, w in grids)
    return torch.randn(patches, tower.patch_elements, generator=generator)


@torch.no_grad()
def test_tower_matches_transformers_fp32(towers):
    theirs, ours = towers
    pixels, grid_thw = _pixels(ours, GRIDS), torch.tensor(GRIDS)
    want = theirs(pixels, grid_thw=grid_thw).pooler_output
    got = ours(pixels, grid_thw)
    assert got.shape == (sum(t * h * w for t, h, w in GRIDS) // 4, 24)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_tower_items_are_independent(towers):
    """Each item attends within its own frames: encoding items one by one gives the same rows."""
    _, ours = towers
    pixels, grid_thw = _pixels(ours, GRIDS), torch.tensor(GRIDS)
    whole = ours(pixels, grid_thw)
    lengths = vision_grid_inputs(grid_thw, 2, 4).merged_lengths
    parts = [ours(p, torch.tensor([g])) for p, g in zip(pixels.split([t * h * w for t, h, w in GRIDS]), GRIDS)]
    assert lengths == [6, 4, 8, 1]
    torch.testing.assert_close(whole, torch.cat(parts), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_tower_bf16_error_within_transformers_own(towers):
    """In bf16 the tower strays from transformers' fp32 output by no more than transformers' own bf16 does (x1.5)."""
    import copy

    theirs, ours = towers
    pixels, grid_thw = _pixels(ours, GRIDS), torch.tensor(GRIDS)
    reference = theirs(pixels, grid_thw=grid_thw).pooler_output
    theirs_bf16 = copy.deepcopy(theirs).to(torch.bfloat16)
    ours_bf16 = copy.deepcopy(ours).to(torch.bfloat16)
    got = ours_bf16(pixels, grid_thw)
    assert got.dtype == torch.bfloat16
    their_error = (theirs_bf16(pixels, grid_thw=grid_thw).pooler_output.float() - reference).abs().mean()
    our_error = (got.float() - reference).abs().mean()
    assert our_error <= 1.5 * their_error, (float(our_error), float(their_error))


def test_grid_inputs_follow_merge_blocks():
    """Patches come in merge-block order: the 2x2 patches of one merged token are consecutive."""
    grid = vision_grid_inputs(torch.tensor([[1, 2, 4]]), 2, 4)
    assert grid.rows.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert grid.cols.tolist() == [0, 1, 0, 1, 2, 3, 2, 3]
    assert grid.segment_lengths == [8] and grid.merged_lengths == [2]
    torch.testing.assert_close(grid.table_weight.sum(-1), torch.ones(8))


@pytest.mark.parametrize("grid, why", [
    ([[1, 3, 4]], "h, w positive multiples of spatial_merge_size=2"),
    ([[0, 2, 2]], "t >= 1"),
    ([[1, 2]], "integer \\[M, 3\\]"),
])
def test_bad_grid_is_refused(grid, why):
    with pytest.raises(ValueError, match=f"grid_thw.*{why}"):
        check_grid_thw(torch.tensor(grid), 2)


def test_patch_rows_must_match_grid(towers):
    _, ours = towers
    with pytest.raises(ValueError, match=r"pixel_patches must be \[16, 96\].*got \[15, 96\]"):
        ours(torch.zeros(15, 96), torch.tensor([[1, 4, 4]]))


def test_tensor_names():
    assert vision_tensor_name("model.visual.merger.linear_fc1.weight") == "merger.linear_fc1.weight"
    assert vision_tensor_name("visual.blocks.0.attn.qkv.bias") == "blocks.0.attn.qkv.bias"
    assert vision_tensor_name("model.language_model.embed_tokens.weight") is None


# --- M-RoPE of the text decoder -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mrope_matches_transformers(dtype):
    """3-axis positions with distinct axes (an image's tokens) rotate q and k as transformers does."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding, apply_rotary_pos_emb

    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10], "mrope_interleaved": True}
    config = Qwen3_5TextConfig(head_dim=256, num_attention_heads=2, num_key_value_heads=1, rope_parameters=rope)
    torch.manual_seed(0)
    tokens = 9
    positions = torch.stack([torch.arange(tokens), torch.arange(tokens) % 3 + 2, torch.arange(tokens) // 3 + 5])
    q, k = torch.randn(tokens, 2, 256).to(dtype), torch.randn(tokens, 1, 256).to(dtype)
    cos, sin = Qwen3_5TextRotaryEmbedding(config)(q, positions[:, None, :])
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    got_q, got_k = PartialRotaryEmbedding(256, rope)(positions, q, k)
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1), rtol=0, atol=0)
    torch.testing.assert_close(got_k, want_k[0].transpose(0, 1), rtol=0, atol=0)


def test_mrope_on_text_equals_plain_rope():
    rope = {"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1], "mrope_interleaved": True}
    q, k = torch.randn(5, 2, 16), torch.randn(5, 1, 16)
    plain = PartialRotaryEmbedding(16, {"rope_theta": 10000.0, "partial_rotary_factor": 0.5})(torch.arange(5), q, k)
    three = PartialRotaryEmbedding(16, rope)(torch.arange(5).expand(3, -1), q, k)
    for a, b in zip(plain, three):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_mrope_axes():
    assert mrope_axes(8, [4, 2, 2], interleaved=True) == [0, 1, 2, 0, 1, 2, 0, 0]
    assert mrope_axes(4, [2, 1, 1], interleaved=False) == [0, 0, 1, 2]
    with pytest.raises(ValueError, match="mrope_section must sum to rotary_dim / 2 = 4"):
        mrope_axes(4, [2, 2, 2], interleaved=False)
    with pytest.raises(ValueError, match=r"positions must be \[T\], or \[3, T\]"):
        PartialRotaryEmbedding(16, {"rope_theta": 1e4})(torch.zeros(3, 4, dtype=torch.long), torch.zeros(4, 1, 16),
                                                        torch.zeros(4, 1, 16))


# --- the tower's size -----------------------------------------------------------------------------

@pytest.mark.parametrize("out_hidden_size", [2048, 4096, 5120])
def test_vision_weight_count_equals_transformers(out_hidden_size):
    """The published tower (transformers' Qwen3_5VisionConfig defaults: depth 27, width 1152) and the tiny one."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    from vllm_gdn_neuron.model.dims import count_vision_weights

    for config in (_vision_config(out_hidden_size=out_hidden_size), _published_vision(out_hidden_size)):
        with torch.device("meta"):
            theirs = sum(p.numel() for p in Qwen3_5VisionModel._from_config(config).parameters())
            ours = sum(p.numel() for p in VisionTower(config).parameters())
        assert count_vision_weights(config) == theirs == ours
        assert count_vision_weights(config.to_dict()) == theirs


def _published_vision(out_hidden_size):
    from transformers import Qwen3_5VisionConfig

    return Qwen3_5VisionConfig(out_hidden_size=out_hidden_size)


# --- M-RoPE positions of a prompt -----------------------------------------------------------------

def test_prompt_positions_match_transformers_rope_index():
    """Text, a 2x3 image, text, a video of two 1x2 temporal patches (each its own group), text."""
    import types

    from transformers import Qwen3_5Config
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model

    from vllm_gdn_neuron.model.vision import token_runs

    image, video, text = 9, 8, 1
    tokens = [text] * 3 + [image] * 6 + [text] * 4 + [video] * 2 + [text] * 2 + [video] * 2 + [text] * 5
    types_ = [1 if t == image else 2 if t == video else 0 for t in tokens]
    fake = types.SimpleNamespace(config=Qwen3_5Config(vision_config={"spatial_merge_size": 2}),
                                 get_vision_position_ids=lambda *a, **k: Qwen3_5Model.get_vision_position_ids(None, *a, **k))
    want, want_delta = Qwen3_5Model.get_rope_index(
        fake, torch.tensor([tokens]), torch.tensor([types_]), image_grid_thw=torch.tensor([[1, 4, 6]]),
        video_grid_thw=torch.tensor([[2, 2, 4]]))
    groups = [(start, 2, 3) for start, _ in token_runs(tokens, image)] + [(s, 1, 2) for s, _ in token_runs(tokens, video)]
    got, delta = mrope_positions(len(tokens), groups)
    assert torch.equal(got, want[:, 0])
    assert delta == int(want_delta)


def test_prompt_positions_of_text_only_and_bad_groups():
    got, delta = mrope_positions(5, [])
    assert torch.equal(got, torch.arange(5).expand(3, -1)) and delta == 0
    with pytest.raises(ValueError, match="runs past the prompt of 4 tokens"):
        mrope_positions(4, [(2, 2, 2)])
