"""Images in the Neuron shell: the vision tower's bucket graphs, M-RoPE with distinct axes, the runner's vision inputs.

What vllm-neuron's runner (whn09/vllm-neuron@7ea99278, see ``runner_vision.py``) gives a
multimodal model, checked against transformers' ``Qwen3_5ForConditionalGeneration`` on a
tiny random vision-language checkpoint with an interleaved ``mrope_section``:

- the tower graph (``visual``, one static graph per ``num_vision_tokens_buckets`` entry,
  images packed into fixed attention blocks, attention masked by per-row bounds) writes
  transformers' ``Qwen3_5VisionModel`` output into the encoder cache (fp32 tight, bf16 loose),
  also with two images sharing one block;
- ``get_mrope_input_positions`` (the runner's ``SupportsMRoPE`` call) equals transformers'
  ``get_rope_index``; the rotary embedding turns q and k by ``[3, T]`` positions exactly as
  transformers' text rotary does;
- prompts with one and with three images of different sizes, split across prefill chunks,
  served through the runner stand-in (``_execute_mm_encoder`` calling the shell's
  ``embed_multimodal``, which packs, picks the bucket, allocates the cache blocks and runs the
  compiled tower; ``vision_embedding_blocks`` / ``vision_positions`` on prefill; M-RoPE
  positions on every step; one static graph per text and per vision bucket, no recompile
  after warm-up, no host read) give transformers' greedy ids in fp32, transformers fed its
  own tower's output rounded to the cache's bfloat16;
- bad vision inputs and images that fit no bucket are refused naming the argument, before
  any cache block is allocated.
"""

import types

import pytest
import torch

from vllm_gdn_neuron.model.rotary import PartialRotaryEmbedding
from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM
from vllm_gdn_neuron.model.vision import prompt_mrope_positions
from vllm_gdn_neuron.shells.neuron.vision import check_vision_inputs
from vllm_gdn_neuron.shells.neuron.vision_tower import NeuronVisionTower, VisionLayout, encode_images, pack_images

from .runner import GraphRecorder, EngineSettings, NeuronRunnerStandIn, Request, host_reads, symbolic_graphs
from .runner_vision import EncoderCacheStandIn, ImageFeature

IMAGE, VIDEO, START, END = 500, 501, 502, 503
SECTION = (4, 2, 2)  # of rotary_dim / 2 = 8 slots: height 1, 4; width 2, 5; temporal 0, 3, 6, 7
PREFILL_BUCKET, DECODE_BUCKET, NEW_TOKENS = 16, 2, 4
# Vision graphs of 1 and 2 attention blocks of 32 patches (8 merged rows each).
VISION = dict(num_vision_tokens_buckets=[32, 64], vision_attention_block_size=32, encoder_cache_num_blocks=8)


def vl_config(mrope_section=SECTION, partial_rotary_factor=0.5):
    import transformers as tf

    text = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                linear_value_head_dim=16, linear_conv_kernel_dim=4, intermediate_size=128,
                max_position_embeddings=4096, initializer_range=0.08, rms_norm_eps=1e-6, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "partial_rotary_factor": partial_rotary_factor,
                                 "mrope_section": list(mrope_section), "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=8,
                  spatial_merge_size=2, temporal_patch_size=2)
    return tf.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True, image_token_id=IMAGE,
                            video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import transformers as tf

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("qwen3_5-vl-mrope")
    tf.Qwen3_5ForConditionalGeneration(vl_config()).to(torch.bfloat16).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def hf(checkpoint):
    import transformers as tf

    return tf.Qwen3_5ForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()


def image_prompt(pieces, seed=0):
    """``(ids, images)`` of text runs (int: length) and images (tuple: grid) in order."""
    generator = torch.Generator().manual_seed(seed)
    ids, images = [], []
    for piece in pieces:
        if isinstance(piece, int):
            ids += torch.randint(3, IMAGE, (piece,), generator=generator).tolist()
        else:
            tokens = piece[1] * piece[2] // 4
            ids.append(START)
            images.append((len(ids), piece))
            ids += [IMAGE] * tokens + [END]
    return ids, images


def features_of(hf, images, seed=0):
    """``ImageFeature``s with random pixel patches (what the processor hands the runner)."""
    generator = torch.Generator().manual_seed(seed)
    vision = hf.config.vision_config
    patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    return [ImageFeature(f"image-{seed}-{i}", offset, grid, grid[1] * grid[2] // 4,
                         pixel_values=torch.randn(grid[1] * grid[2], patch, generator=generator))
            for i, (offset, grid) in enumerate(images)]


def hf_tower_rows(hf, features):
    """transformers' vision-tower output of each feature's pixels ``[length, out_hidden_size]``."""
    with torch.no_grad():
        return list(hf.model.get_image_features(torch.cat([f.pixel_values for f in features]),
                                                torch.tensor([f.grid_thw for f in features])).pooler_output)


def hf_rope_index(hf, ids, features):
    type_ids = torch.tensor([[int(t == IMAGE) for t in ids]])
    grids = torch.tensor([f.grid_thw for f in features]) if features else None
    positions, delta = hf.model.get_rope_index(torch.tensor([ids]), type_ids, image_grid_thw=grids)
    return positions[:, 0], int(delta)


def hf_greedy(hf, prompt, features, new_tokens):
    """Greedy ids of transformers, the image tokens' embeddings its own tower's rows rounded to bfloat16
    (the encoder cache's dtype)."""
    positions, delta = hf_rope_index(hf, prompt, features)
    image_rows = torch.cat(hf_tower_rows(hf, features)).to(torch.bfloat16).float() if features else None
    is_image = torch.tensor([t == IMAGE for t in prompt])
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new_tokens):
            embeds = hf.get_input_embeddings()(torch.tensor([ids]))
            if image_rows is not None:
                embeds[0, : len(prompt)][is_image] = image_rows
            later = (torch.arange(len(prompt), len(ids)) + delta).expand(3, -1)
            position_ids = torch.cat([positions, later], dim=1)[:, None]
            ids.append(int(hf(inputs_embeds=embeds, position_ids=position_ids).logits[0, -1].argmax()))
    return ids[len(prompt):]


# --- M-RoPE ----------------------------------------------------------------------------------


@pytest.mark.parametrize("section, partial", [(SECTION, 0.5), ((11, 11, 10), 0.25), ((1, 3, 0), 0.5)])
def test_rotation_by_distinct_mrope_axes_equals_transformers(section, partial):
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf_module

    config = vl_config(section, partial).text_config
    generator = torch.Generator().manual_seed(1)
    tokens = 13
    positions = torch.randint(0, 300, (3, tokens), generator=generator)
    q = torch.randn(tokens, 4, 32, generator=generator)
    k = torch.randn(tokens, 2, 32, generator=generator)
    rope = PartialRotaryEmbedding(32, config.rope_parameters)
    got_q, got_k = rope(positions, q, k)
    cos, sin = hf_module.Qwen3_5TextRotaryEmbedding(config)(q, positions[:, None])
    want_q, want_k = hf_module.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    assert torch.equal(got_q, want_q[0].transpose(0, 1)) and torch.equal(got_k, want_k[0].transpose(0, 1))
    text_q, _ = rope(positions[0], q, k)
    assert torch.equal(rope(positions[0].expand(3, -1), q, k)[0], text_q)  # equal axes: plain RoPE
    assert not torch.equal(got_q, text_q)


@pytest.mark.parametrize("pieces", [[7], [(1, 4, 6), 5], [3, (1, 4, 6), 2, (1, 6, 4), 4, (1, 2, 2)],
                                    [2, (1, 8, 2), (1, 2, 8)]])
def test_prompt_mrope_positions_equal_transformers_rope_index(hf, pieces):
    ids, images = image_prompt(pieces)
    features = [ImageFeature(f"i{n}", offset, grid, grid[1] * grid[2] // 4) for n, (offset, grid) in enumerate(images)]
    got, got_delta = prompt_mrope_positions(ids, list(reversed(features)), {"image": IMAGE}, 2)
    want, want_delta = hf_rope_index(hf, ids, features)
    assert got.dtype == torch.int64 and torch.equal(got, want) and got_delta == want_delta


@pytest.mark.parametrize("feature, message", [
    (types.SimpleNamespace(modality="video", mm_position=types.SimpleNamespace(offset=1)), "images only; got a 'video'"),
    (ImageFeature("odd", 1, (1, 3, 4), 3), r"image_grid_thw must be \[1, h, w\] .*got \[1, 3, 4\]"),
    (ImageFeature("long", 4, (1, 4, 4), 4), "runs past the prompt of 6 tokens"),
])
def test_prompt_mrope_positions_refuse_what_they_cannot_place(feature, message):
    with pytest.raises(ValueError, match=message):
        prompt_mrope_positions([1] * 6, [feature], {"image": IMAGE}, 2)


# --- the runner's vision inputs ----------------------------------------------------------------


def _blocks(n=2, rows=4, width=64, dtype=torch.bfloat16):
    return tuple(torch.zeros(rows, width, dtype=dtype) for _ in range(n))


@pytest.mark.parametrize("blocks, positions, is_decode, message", [
    (_blocks(), None, False, "must be passed together; got vision_embedding_blocks=given, vision_positions=None"),
    (_blocks(), torch.zeros(2, 4, dtype=torch.int64), True, "passed on a decode step"),
    ((), torch.zeros(0, 4, dtype=torch.int64), False, "non-empty tuple"),
    (_blocks(), torch.zeros(2, 4, dtype=torch.int32), False, r"\[2, block_size\] int64 tensor .*torch.int32"),
    (_blocks(3), torch.zeros(2, 4, dtype=torch.int64), False, r"\[3, block_size\] int64"),
    (_blocks(width=128), torch.zeros(2, 4, dtype=torch.int64), False,
     r"vision_embedding_blocks\[0\] must be a \[4, 64\] float tensor .*no deep-stack levels.*got \[4, 128\]"),
    (_blocks(rows=8), torch.zeros(2, 4, dtype=torch.int64), False, r"\[4, 64\] float tensor"),
])
def test_bad_vision_inputs_are_refused_naming_the_argument(blocks, positions, is_decode, message):
    with pytest.raises(ValueError, match=message):
        check_vision_inputs(blocks, positions, 16, 64, is_decode)


def make_runner(checkpoint, architectures=None, compile=True, backend=None, vision_backend=None):
    neuron = dict(on_device_sampling_config=None, num_batched_tokens_buckets=[PREFILL_BUCKET],
                  num_seqs_buckets=[DECODE_BUCKET])
    settings = EngineSettings(model=checkpoint, dtype="float32", max_num_seqs=DECODE_BUCKET, uses_mrope=True,
                              multimodal=True, architectures=architectures, num_gpu_blocks_override=16,
                              additional_config={"neuron_config": neuron, "vision_neuron_config": VISION})
    return NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, settings, compile=compile, backend=backend,
                               vision_backend=vision_backend)


def serve_images(runner, requests):
    """Prefill each request in chunks of the prefill bucket, then decode them together."""
    for request in requests:
        while request.computed < len(request.prompt):
            token = runner.prefill(request, min(PREFILL_BUCKET, len(request.prompt) - request.computed))
        request.output.append(token)
    while not all(r.done for r in requests):
        for request, token in zip(requests, runner.decode(requests)):
            request.output.append(token)
    return [r.output for r in requests]


def graph_counts(runner):
    """Dynamo graphs of the text and the vision backend (the same one unless the test split them)."""
    return len(runner.recorder.dynamo_graphs), len(runner.vision_recorder.dynamo_graphs)


def serve_image_prompts(checkpoint, hf, architectures=None, backend=None, vision_backend=None):
    """Start the runner stand-in, then serve a three-image prompt beside a one-image prompt, decoded
    together, under ``fail_on_recompile``. The three-image prompt's first chunk encodes two images
    (the second straddles the chunk boundary at 16: the 2-block vision graph), its second chunk the
    third (straddling 32: the 1-block graph); the one-image prompt takes the 1-block graph.
    Returns ``(runner, requests, ids)``."""
    runner = make_runner(checkpoint, architectures, backend=backend, vision_backend=vision_backend)
    runner.start()
    text, vision = len(runner.prefill_buckets) + len(runner.decode_buckets), len(VISION["num_vision_tokens_buckets"])
    graphs = (text + vision,) * 2 if runner.vision_recorder is runner.recorder else (text, vision)
    assert graph_counts(runner) == graphs
    prompts = [image_prompt([3, (1, 2, 2), 6, (1, 6, 4), 9, (1, 4, 6), 5], seed=1),
               image_prompt([2, (1, 2, 2), 7], seed=2)]
    requests = [Request(ids, NEW_TOKENS, mm_features=features_of(hf, images, seed=n))
                for n, (ids, images) in enumerate(prompts)]
    torch._dynamo.utils.counters.clear()
    with torch.compiler.set_stance("fail_on_recompile"):
        got = serve_images(runner, requests)
    assert graph_counts(runner) == graphs, "a step recompiled after warm-up"
    return runner, requests, got


PLUGIN_ARCHITECTURE = ["VllmGdnNeuronQwen3_5ForConditionalGeneration"]


@pytest.mark.slow
def test_prompts_with_images_give_transformers_greedy_ids(checkpoint, hf):
    """Under the checkpoint's own architecture name, which vllm-neuron's model list knows: merge factor 4."""
    runner, requests, got = serve_image_prompts(checkpoint, hf)
    assert runner.encoder_cache.block_size == 32 // 4
    assert symbolic_graphs(runner.recorder) == 0
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
    assert [r for g in runner.recorder.dynamo_graphs + runner.recorder.aten_graphs for r in host_reads(g)] == []
    for request, ids in zip(requests, got):
        assert ids == hf_greedy(hf, request.prompt, request.mm_features, NEW_TOKENS)


@pytest.mark.slow
def test_the_buckets_with_vision_inputs_lower_to_stablehlo_and_equal_eager(checkpoint, hf):
    """The prefill bucket with its vision inputs (the scatter of the cache rows), the decode bucket and
    the vision tower's two block buckets, lowered through torch-mlir (``xla_lowering.XlaLoweringBackend``:
    no float64 on run-time values, no host transfer, no custom call), run on XLA:CPU: equal to eager
    (the tower's written encoder-cache rows too), and transformers' greedy ids. Under the plugin's
    architecture name, which the runner's merge-factor lookup does not know: factor 1, blocks of 32
    rows. (torchax's lowering carries the tower's LayerNorm variance as a float64 NaN constant that
    its module computes with; torch-mlir's has none.)"""
    from .test_xla_lowering import assert_equal_to_eager, report
    from .xla_lowering import XlaLoweringBackend

    backend, tower = XlaLoweringBackend(), XlaLoweringBackend()
    runner, requests, got = serve_image_prompts(checkpoint, hf, PLUGIN_ARCHITECTURE, backend=backend,
                                                vision_backend=tower)
    blocks = VISION["num_vision_tokens_buckets"]
    print("\n" + report("qwen3_5-vl (torch_mlir)", [f"prefill {PREFILL_BUCKET}", f"decode {DECODE_BUCKET}"], backend)
          + "\n" + report("qwen3_5-vl tower (torch_mlir)", [f"vision {b} tokens" for b in blocks], tower))
    assert runner.encoder_cache.block_size == 32
    assert_equal_to_eager(backend, 2)
    assert len(tower.buckets) == len(blocks) and all(b.calls > 1 for b in tower.buckets)
    assert all(b.max_cache_diff <= 1e-4 and b.nan_mismatches == 0 for b in tower.buckets), tower.buckets
    for request, ids in zip(requests, got):
        assert ids == hf_greedy(hf, request.prompt, request.mm_features, NEW_TOKENS)


def test_the_image_embeddings_and_their_positions_change_the_logits(checkpoint, hf):
    """The same prompt without its image embeddings, or with 1-D positions, predicts differently."""
    ids, images = image_prompt([2, (1, 4, 6), 3], seed=3)
    features = features_of(hf, images, seed=3)
    logits = []
    for variant in ("images", "no embeddings", "1-D positions"):
        runner = make_runner(checkpoint, compile=False)
        runner.load_model()
        runner.initialize_kv_cache(runner.get_kv_cache_spec())
        request = Request(ids, 1, mm_features=features if variant != "no embeddings" else [])
        request.mrope = ((torch.arange(len(ids)).expand(3, -1), 0) if variant == "1-D positions"
                         else runner.model.get_mrope_input_positions(ids, features))
        tap = []
        forward = runner.forward
        runner.forward = lambda **kwargs: tap.append(forward(**kwargs)) or tap[-1]
        runner.prefill(request, len(ids))
        logits.append(tap[-1])
    assert not torch.allclose(logits[0], logits[1]) and not torch.allclose(logits[0], logits[2])


# --- the tower graph ------------------------------------------------------------------------------


def tower_like(hf, dtype):
    """The shell's ``visual`` with transformers' tower weights, and its layout for ``VISION``."""
    vision_config = hf.config.vision_config
    visual = NeuronVisionTower(vision_config, dtype)
    missing, unexpected = visual.tower.load_state_dict(hf.model.visual.state_dict(), strict=False)
    assert missing == [] and all("inv_freq" in name for name in unexpected), (missing, unexpected)
    visual.tower.to(dtype)
    return visual, VisionLayout.of(types.SimpleNamespace(**VISION, dp_size=1), vision_config)


def pack_shared_block(layout, features, dtype):
    """Several images in one attention block (end to end, each attending within its own span)."""
    packed = pack_images(layout, 1, None, [], dtype)
    start = 0
    for feature in features:
        one = pack_images(layout, 1, feature.pixel_values, [feature.grid_thw], dtype)
        rows = slice(start, start + feature.pixel_values.shape[0])
        for key in packed:
            length = rows.stop - rows.start
            packed[key][0, rows] = one[key][0, :length] + (start if key.startswith("bound_") else 0)
        start = rows.stop
    return packed


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tolerance, compiler", [(torch.float32, 2e-5, "aot_eager"),
                                                       (torch.bfloat16, 0.1, "aot_eager"),
                                                       (torch.float32, 2e-5, "torch_mlir")])
def test_the_tower_graph_writes_transformers_vision_output_into_the_cache(hf, dtype, tolerance, compiler):
    """Images packed one per block (the 2-block bucket, one block empty) and two images sharing a block,
    one compiled graph per shape (the second 2-block call under ``fail_on_recompile``); a float32 cache buffer keeps
    the rows unrounded. Tolerances: fp32 tight; bf16 against transformers' fp32 tower, loose. ``torch_mlir``:
    each graph lowered to StableHLO through torch-mlir and run on XLA:CPU (``xla_lowering.XlaLoweringBackend``)."""
    from .xla_lowering import XlaLoweringBackend

    visual, layout = tower_like(hf, dtype)
    recorder = GraphRecorder() if compiler == "aot_eager" else XlaLoweringBackend()
    compiled = torch.compile(visual, backend=recorder, fullgraph=True)
    features = features_of(hf, [(0, (1, 4, 6)), (0, (1, 2, 2)), (0, (1, 2, 6))], seed=7)
    want = hf_tower_rows(hf, features)
    buffer = torch.full((5, 8, 64), float("nan"))
    packed = pack_images(layout, 2, torch.cat([f.pixel_values for f in features[:1]]), [features[0].grid_thw], dtype)
    ids = torch.tensor([3, 4])  # block 1 is empty: its rows go to the scratch block 4
    compiled(**packed, encoder_cache_buffer=buffer, write_block_ids=ids)
    with torch.compiler.set_stance("fail_on_recompile"):
        packed = pack_images(layout, 2, torch.cat([f.pixel_values for f in features[1:]]),
                             [f.grid_thw for f in features[1:]], dtype)
        compiled(**packed, encoder_cache_buffer=buffer, write_block_ids=torch.tensor([0, 1]))
    torch.testing.assert_close(buffer[3, :6], want[0], atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(buffer[0, :1], want[1], atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(buffer[1, :3], want[2], atol=tolerance, rtol=tolerance)
    assert buffer[2].isnan().all(), "a block no write_block_ids names was written"
    shared = torch.full((1, 8, 64), float("nan"))
    compiled(**pack_shared_block(layout, features[1:], dtype), encoder_cache_buffer=shared,
             write_block_ids=torch.tensor([0]))
    torch.testing.assert_close(shared[0, :4], torch.cat(want[1:]), atol=tolerance, rtol=tolerance)
    assert len(recorder.dynamo_graphs) == 2 and symbolic_graphs(recorder) == 0  # one per bucket shape
    assert [r for g in recorder.dynamo_graphs + recorder.aten_graphs for r in host_reads(g)] == []


def _encode(visual, layout, cache, grids, hashes=None, patches=None):
    patch = layout.patch_elements
    pixels = torch.zeros(sum(h * w for _, h, w in grids), patch) if patches is None else patches
    encode_images(visual, layout, torch.float32, cache, hashes or [f"h{i}" for i in range(len(grids))], pixels,
                  torch.tensor(grids))


@pytest.mark.parametrize("grids, change, message", [
    ([(1, 2, 2)] * 3, {}, r"image_grid_thw: 3 images need 3 vision attention blocks .*has 2"),
    ([(1, 8, 6)], {}, r"image_grid_thw\[0\]: an image of h \* w = 48 patches must fit one vision attention block "
                      r"of vision_attention_block_size=32"),
    ([(2, 2, 2)], {}, r"image_grid_thw\[0\] must have t = 1"),
    ([(1, 3, 2)], {}, r"grid_thw\[0\] must have t >= 1 and h, w positive multiples of spatial_merge_size=2"),
    ([(1, 2, 2)], {"patches": torch.zeros(5, 3 * 2 * 64)}, r"pixel_values must be a \[4, 384\] float tensor"),
    ([(1, 2, 2), (1, 2, 2)], {"hashes": ["only-one"]}, "mm_hashes must name each of the 2 images .*got 1"),
    ([(1, 2, 2)], {"cache": EncoderCacheStandIn(4, 4, 64)}, "encoder_cache.block_size must be at least .* = 8"),
    ([(1, 2, 2)], {"cache": EncoderCacheStandIn(4, 8, 128)}, "encoder_cache.fat_dim must be out_hidden_size=64"),
])
def test_images_the_buckets_cannot_take_are_refused_before_any_block_is_allocated(hf, grids, change, message):
    visual, layout = tower_like(hf, torch.float32)
    cache = change.pop("cache", EncoderCacheStandIn(4, 8, 64))
    with pytest.raises(ValueError, match=message):
        _encode(visual, layout, cache, grids, **change)
    assert cache.items == {} and len(cache.free_queue) == 3


def test_embed_multimodal_refuses_videos(checkpoint):
    runner = make_runner(checkpoint, compile=False)
    runner.load_model()
    with pytest.raises(ValueError, match="pixel_values_videos / video_grid_thw were given; .*images only"):
        runner.model.embed_multimodal(encoder_cache=runner.encoder_cache, mm_hashes=["v"],
                                      pixel_values_videos=torch.zeros(8, 384), video_grid_thw=torch.tensor([[2, 2, 2]]))
