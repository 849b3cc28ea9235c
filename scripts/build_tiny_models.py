"""Build random-weight Qwen3.5 / Qwen3-Next checkpoints (tiny, and real per-layer dims) with a local tokenizer.

    python scripts/build_tiny_models.py                 # all tiny models into configs/tiny-models/
    python scripts/build_tiny_models.py --only qwen3_5-dense --out /tmp/models
    python scripts/build_tiny_models.py --only qwen3-next-real --layers 4 --experts 8 --out /tmp/models

Each model is a Hugging Face checkpoint folder (config.json, sharded bf16 safetensors,
tokenizer with a ChatML chat template), built by transformers' own model classes so
the checkpoint names and layouts are the real ones:

| name | architecture | what it covers |
|---|---|---|
| qwen3_5-dense | Qwen3_5ForCausalLM | dense MLP, tied embeddings, GDN GQA 2:4, Dk != Dv |
| qwen3_5-moe | Qwen3_5MoeForCausalLM | routed experts + shared expert, untied lm_head |
| qwen3-next | Qwen3NextForCausalLM | packed per-key-head in_proj_qkvz / in_proj_ba, MoE every 2nd layer |
| qwen3_5-vl | Qwen3_5ForConditionalGeneration | text under model.language_model., a 2-block vision tower, M-RoPE, image processor |
| qwen3_5-moe-vl | Qwen3_5MoeForConditionalGeneration | the same for the MoE text decoder |

The vision-language ones carry the checkpoints' vision tokens (``VISION_TOKENS``, trained
as special tokens so their ids are inside the 512-token vocabulary), a chat template that
renders image parts as ``<|vision_start|><|image_pad|><|vision_end|>``, and a
``preprocessor_config.json`` for transformers' Qwen2-VL image processor with 8-pixel
patches and at most ``VL_MAX_PIXELS`` pixels per image (64 merged tokens). The dense one
also has a ``video_preprocessor_config.json``; the MoE one has none (a checkpoint without
video support).

Every tiny model also carries a random multi-token-prediction head (``mtp.*``, one
full-attention decoder layer with layer 0's MLP or MoE, in the published layout; see
:func:`mtp_head`): the target skips it, a ``method: "mtp"`` drafter reads it.
``--mtp-head repeat`` builds ``<name>-mtp-repeat`` instead, whose head mostly drafts the
token it was given again (tied embeddings only): a target that repeats itself then accepts
its drafts, so speculative steps keep more than one token.

``initializer_range`` is large (0.08) and the MoE routers are scaled up (ROUTER_GAIN) so
greedy decisions are decisive: near-flat logits or near-equal router scores let bf16
rounding flip ties between equally correct implementations. A folder appears only
once complete (built aside, then renamed), so ``--if-missing`` never keeps half a model.

Real dimensions (``REAL_MODELS``, built only when named: ~1.5-2.6 GB each in bf16): the
per-layer shapes of published checkpoints with only a few layers (``--layers``, default
4: three GatedDeltaNet layers and one attention layer) and the full 248,320-token
vocabulary, with a tokenizer of that many tokens: the 512 trained ones, then one
pseudo-word per id (``build_tokenizer``), so generated text is never empty; any id of
the vocabulary can be sent as ``prompt_token_ids``.

| name | architecture | dimensions of |
|---|---|---|
| qwen3_5-2b-real | Qwen3_5ForCausalLM | Qwen3.5-2B: hidden 2048, GDN 16/16 heads x 128, attention 8/2 x 256, MLP 6144, tied |
| qwen3_5-35b-a3b-real | Qwen3_5MoeForCausalLM | Qwen3.5-35B-A3B: hidden 2048, GDN 16/32 x 128, attention 16/2 x 256, experts of 512 + shared 512 |
| qwen3-next-real | Qwen3NextForCausalLM | the same dims in the Qwen3-Next layout (vLLM's built-in Qwen3-Next serves it too) |

Block-FP8 twins (``<name>-fp8``: every tiny model, and ``qwen3_5-35b-a3b-real-fp8``) are the
same seed's checkpoint rewritten in the published block-FP8 layout
(:func:`quantize_checkpoint`): the projections and every expert (one tensor per expert)
as float8_e4m3fn with a ``weight_scale_inv`` per 128 x 128 block, the rest bf16, and the
``quantization_config`` the published ones carry. Tiny weights are smaller than one block:
their blocks are clipped.

The ``-blocks`` models (``qwen3_5-moe-blocks``, ``qwen3-next-blocks`` and their ``-fp8`` twins,
built with ``--only``) are the tiny MoE and Qwen3-Next layouts at hidden 256 with every quantized
projection's parts whole 128 x 128 blocks, so vLLM's FP8 CPU kernels serve their twins.

The MoE ones keep ``--experts`` experts (default 8; the published 256 would not fit a
shared machine) and route the published top-8 (at most ``--experts``) per token.
"""

import argparse
import json
import pathlib
import random
import shutil

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "configs" / "tiny-models"
MODELS = ("qwen3_5-dense", "qwen3_5-moe", "qwen3-next", "qwen3_5-vl", "qwen3_5-moe-vl")
REAL_MODELS = ("qwen3_5-2b-real", "qwen3_5-35b-a3b-real", "qwen3-next-real")
# Block-FP8 twins (``<name>-fp8``, ``FP8_SUFFIX``) of the tiny models and of the real-dims
# 35B-A3B (the smallest Qwen3.5 published in FP8 with the fewest per-layer weights).
FP8_SUFFIX = "-fp8"
FP8_MODELS = tuple(name + FP8_SUFFIX for name in MODELS)
REAL_FP8_MODELS = ("qwen3_5-35b-a3b-real" + FP8_SUFFIX,)
# Small models whose every quantized projection is whole 128 x 128 blocks (vLLM's CPU FP8 kernels
# take them), with their FP8 twins; built on request only.
BLOCK_SUFFIX = "-blocks"
BLOCK_MODELS = ("qwen3_5-moe" + BLOCK_SUFFIX, "qwen3-next" + BLOCK_SUFFIX)
BLOCK_FP8_MODELS = tuple(name + FP8_SUFFIX for name in BLOCK_MODELS)
# The block scales' dtype: bfloat16 as the Qwen3.5 FP8 releases store them; the Qwen3-Next
# twin stores float32 ones, so the loaders meet both.
FP8_SCALE_DTYPE = {"qwen3-next": "float32"}
ALL_MODELS = MODELS + REAL_MODELS + FP8_MODELS + REAL_FP8_MODELS + BLOCK_MODELS + BLOCK_FP8_MODELS
REAL_LAYERS = 4
REAL_EXPERTS = 8

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
VL_MODELS = ("qwen3_5-vl", "qwen3_5-moe-vl")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Content as a string or as OpenAI-style parts (text, image, video), as the published template takes it.
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ('image', 'image_url') %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] in ('video', 'video_url') %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The tiny vision tower: 8-pixel patches, 2x2 merge, an 8x8 learned position table.
VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=8,
              temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=64)
# Its image processor's pixel budget: from one merged token (16x16 pixels) to 64 of them.
VL_MIN_PIXELS = 16 * 16
VL_MAX_PIXELS = 64 * 16 * 16
# A clip's pixel budget (all its frames): 64 merged tokens in all.
VL_MAX_VIDEO_PIXELS = 2 * VL_MAX_PIXELS
# Interleaved M-RoPE over the tiny head's 4 rotary frequencies (the published ones use [11, 11, 10] of 32).
_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
VL_ROPE = dict(_ROPE, mrope_section=[2, 1, 1], mrope_interleaved=True)

_WORDS = (
    "the a state gate delta rule chunk token head key value query decay kernel cache slot "
    "prefill decode batch neuron tile matrix vector sum norm scale shift window conv layer "
    "model serve engine request stream reply fast correct boring deploy every last one two "
    "three four five six seven eight nine ten red green blue small large quiet loud river "
    "mountain city road house tree cloud rain sun moon star light dark warm cold"
).split()

_COMMON = dict(
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    max_position_embeddings=4096,
    initializer_range=0.08,
    rms_norm_eps=1e-6,
    rope_parameters=dict(_ROPE),
)


_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64)
# The ``-blocks`` models: the tiny layouts with every quantized projection's parts whole 128 x 128 blocks
# (GatedDeltaNet q, k 128 and v, z 256 rows; attention 2 x 128 query and gate, 128 key and value; experts 128).
_BLOCKS = dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128, linear_num_key_heads=1,
               linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128, initializer_range=0.04,
               moe_intermediate_size=128, shared_expert_intermediate_size=128, intermediate_size=256)


def corpus(num_lines: int = 400, seed: int = 0) -> list[str]:
    """A few KB of word salad to train the tokenizer on (deterministic)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) + "." for _ in range(num_lines)]


def filler_words():
    """Pseudo-words (``bada``, ``badabe``, ...): two, then three consonant-vowel syllables, in a fixed order."""
    syllables = [c + v for c in "bdfghklmnprstvz" for v in "aeiou"]
    for first in syllables:
        for second in syllables:
            yield first + second
    for first in syllables:
        for second in syllables:
            for third in syllables:
                yield first + second + third


def build_tokenizer(vocab_size: int = VOCAB_SIZE, vision: bool = False, texts=None):
    """A byte-level BPE with ChatML special tokens and chat template, of ``vocab_size`` tokens
    (``vision``: also the vision tokens, and the template that renders image / video parts).

    The first VOCAB_SIZE tokens are trained on ``texts`` (default :func:`corpus`); past them (a real-dims
    vocabulary) each id is a space and a pseudo-word of :func:`filler_words`, so every id
    the model can produce decodes to text. No merge builds those tokens: text encodes
    into the trained ones only.
    """
    import json as json_lib

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < VOCAB_SIZE:
        raise ValueError(f"vocab_size must be >= {VOCAB_SIZE}; got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS + (VISION_TOKENS if vision else []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus() if texts is None else texts, trainer=trainer)
    if vocab_size > VOCAB_SIZE:
        spec = json_lib.loads(tokenizer.to_str())
        vocab = spec["model"]["vocab"]
        words = (word for word in filler_words() if "\u0120" + word not in vocab)
        while len(vocab) < vocab_size:
            vocab["\u0120" + next(words)] = len(vocab)  # \u0120: the byte-level space
        tokenizer = Tokenizer.from_str(json_lib.dumps(spec))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = VL_CHAT_TEMPLATE if vision else CHAT_TEMPLATE
    return fast


def _text_kwargs(tokenizer, dims: dict | None = None, **extra) -> dict:
    """The text config's fields: the tiny ones, ``extra``, then ``dims`` over both (the ``-blocks`` sizes)."""
    kwargs = dict(_COMMON, vocab_size=VOCAB_SIZE)
    kwargs.update(extra)
    kwargs.update(dims or {})
    kwargs.update(
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    return kwargs


def build_model(name: str, tokenizer, **dims):
    """A transformers model instance of the named tiny checkpoint, random weights."""
    import transformers as tf

    if name.endswith(BLOCK_SUFFIX):
        return build_model(name[: -len(BLOCK_SUFFIX)], tokenizer, **_BLOCKS)

    if name == "qwen3_5-dense":
        config = tf.Qwen3_5TextConfig(**_text_kwargs(tokenizer, dims, intermediate_size=128, tie_word_embeddings=True))
        return tf.Qwen3_5ForCausalLM(config)
    if name == "qwen3_5-moe":
        config = tf.Qwen3_5MoeTextConfig(**_text_kwargs(tokenizer, dims, **_MOE, tie_word_embeddings=False))
        return tf.Qwen3_5MoeForCausalLM(config)
    if name == "qwen3-next":
        config = tf.Qwen3NextConfig(
            **_text_kwargs(
                tokenizer, dims,
                intermediate_size=128,
                **_MOE,
                decoder_sparse_step=2,
                mlp_only_layers=[],
                tie_word_embeddings=False,
            )
        )
        return tf.Qwen3NextForCausalLM(config)
    vision_ids = dict(zip(("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"),
                          tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    if name == "qwen3_5-vl":
        text = _text_kwargs(tokenizer, dims, intermediate_size=128, tie_word_embeddings=True,
                            rope_parameters=dict(VL_ROPE))
        config = tf.Qwen3_5Config(text_config=text, vision_config=VISION, tie_word_embeddings=True, **vision_ids)
        return tf.Qwen3_5ForConditionalGeneration(config)
    if name == "qwen3_5-moe-vl":
        text = _text_kwargs(tokenizer, dims, **_MOE, tie_word_embeddings=False, rope_parameters=dict(VL_ROPE))
        config = tf.Qwen3_5MoeConfig(text_config=text, vision_config=VISION, tie_word_embeddings=False, **vision_ids)
        return tf.Qwen3_5MoeForConditionalGeneration(config)
    raise ValueError(f"name must be one of {list(MODELS)}; got {name!r}")


# Fields that give a checkpoint its shapes (and numerics); everything else keeps the
# config class's own default.
DIMENSION_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "head_dim", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "moe_intermediate_size",
    "shared_expert_intermediate_size", "num_experts", "num_experts_per_tok", "rms_norm_eps",
    "tie_word_embeddings",
)
# Published fields that transformers' config classes do not default to: Qwen3_5TextConfig's
# defaults are a 9B-style model, and Qwen/Qwen3.5-2B's own fields are the plugin's sizing table's
# (``vllm_gdn_neuron.sizing.PUBLISHED``). Both published Qwen3.5 configs use rope_theta 1e7 (the
# classes default to 1e4) and 262,144 positions.
PUBLISHED_ROPE = {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25}
PUBLISHED_MAX_POSITIONS = 262_144


def published_dims(name: str) -> dict:
    """The dimension fields of the published checkpoint behind a real-dims ``name``.

    Read from transformers' config classes: ``Qwen3_5MoeTextConfig()`` defaults are
    Qwen3.5-35B-A3B's (its documented checkpoint); Qwen3.5-2B is ``Qwen3_5TextConfig()``
    with the 2B's fields of ``vllm_gdn_neuron.sizing.PUBLISHED`` (its layer count aside: a
    real-dims checkpoint has ``REAL_LAYERS``). ``qwen3-next-real`` takes the 35B-A3B fields, which equal
    Qwen3-Next-80B-A3B's per-layer dims (``Qwen3NextConfig()``) but for the expert count,
    top-k and vocabulary.
    """
    import transformers as tf

    from vllm_gdn_neuron.sizing import PUBLISHED

    if name == "qwen3_5-2b-real":
        _, fields, _ = PUBLISHED["Qwen/Qwen3.5-2B"]
        defaults, extra = tf.Qwen3_5TextConfig(), {k: v for k, v in fields.items() if k != "num_hidden_layers"}
    elif name in ("qwen3_5-35b-a3b-real", "qwen3-next-real"):
        defaults, extra = tf.Qwen3_5MoeTextConfig(), {}
    else:
        raise ValueError(f"name must be one of {list(REAL_MODELS)}; got {name!r}")
    dims = {key: getattr(defaults, key) for key in DIMENSION_KEYS if hasattr(defaults, key)}
    dims.update(extra)
    return dims


def build_real_model(name: str, tokenizer, num_layers: int = REAL_LAYERS, num_experts: int = REAL_EXPERTS):
    """A transformers model with the published per-layer dims of ``name``, ``num_layers`` layers.

    The layer pattern is the published one (every 4th layer full attention); MoE
    models keep ``num_experts`` experts and route ``min(published top-k, num_experts)``.
    """
    import transformers as tf

    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1; got {num_layers}")
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1; got {num_experts}")
    dims = published_dims(name)
    if "num_experts" in dims:
        dims.update(num_experts=num_experts, num_experts_per_tok=min(dims["num_experts_per_tok"], num_experts))
    kwargs = dict(
        dims,
        num_hidden_layers=num_layers,
        max_position_embeddings=PUBLISHED_MAX_POSITIONS,
        rope_parameters=dict(PUBLISHED_ROPE),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    if name == "qwen3_5-2b-real":
        return tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**kwargs))
    if name == "qwen3_5-35b-a3b-real":
        return tf.Qwen3_5MoeForCausalLM(tf.Qwen3_5MoeTextConfig(**kwargs))
    config = tf.Qwen3NextConfig(**kwargs, decoder_sparse_step=1, mlp_only_layers=[])
    return tf.Qwen3NextForCausalLM(config)


ROUTER_GAIN = 4.0


def sharpen_router(model) -> None:
    """Scale the MoE router weights by ROUTER_GAIN so top-k choices are not near-ties.

    With near-equal router logits, bf16 rounding picks different experts in different
    (equally correct) implementations, and greedy ids then part ways.
    """
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".mlp.gate.weight"):
                param.mul_(ROUTER_GAIN)


MTP_SHARD = "model-mtp.safetensors"
MTP_HEADS = ("random", "repeat")


def mtp_head(text_config, seed: int = 0, kind: str = "random"):
    """The MTP head of a tiny model as transformers modules (float32), keyed by checkpoint name under ``mtp.``.

    ``fc`` (Linear 2H -> H), ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``, ``norm`` (the
    decoder's RMSNorm) and ``layers.0``: the model family's decoder layer built as a
    full-attention layer 0 (so its feed-forward follows layer 0's MLP / MoE rule, as vLLM
    builds the head). Weights ~ N(0, initializer_range), norms ~ N(0, 0.1), routers scaled
    by ROUTER_GAIN. ``kind="repeat"``: the embedding half of ``fc`` is the identity and the
    layer's output projections are scaled by 0.1, so the draft hidden state is nearly the
    given token's embedding.
    """
    import copy

    import torch
    import transformers as tf
    from torch import nn

    if kind not in MTP_HEADS:
        raise ValueError(f"kind must be one of {list(MTP_HEADS)}; got {kind!r}")
    families = {
        "qwen3_5_text": (tf.models.qwen3_5.modeling_qwen3_5, "Qwen3_5"),
        "qwen3_5_moe_text": (tf.models.qwen3_5_moe.modeling_qwen3_5_moe, "Qwen3_5Moe"),
        "qwen3_next": (tf.models.qwen3_next.modeling_qwen3_next, "Qwen3Next"),
    }
    module, family = families[text_config.model_type]
    layer_config = copy.deepcopy(text_config)
    layer_config.layer_types = ["full_attention"] + list(text_config.layer_types[1:])
    layer_config._attn_implementation = "sdpa"
    hidden, eps = text_config.hidden_size, text_config.rms_norm_eps
    norm = getattr(module, f"{family}RMSNorm")
    head = nn.ModuleDict({
        "fc": nn.Linear(2 * hidden, hidden, bias=False),
        "pre_fc_norm_embedding": norm(hidden, eps=eps),
        "pre_fc_norm_hidden": norm(hidden, eps=eps),
        "layers": nn.ModuleList([getattr(module, f"{family}DecoderLayer")(layer_config, 0)]),
        "norm": norm(hidden, eps=eps),
    })
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in head.named_parameters():
            std = 0.1 if name.endswith("norm.weight") else text_config.initializer_range
            param.copy_(std * torch.randn(param.shape, generator=gen))
            if name.endswith(".mlp.gate.weight"):
                param.mul_(ROUTER_GAIN)
        if kind == "repeat":
            head["fc"].weight[:, :hidden] = torch.eye(hidden)
            head["fc"].weight[:, hidden:].mul_(0.1)
            for name, param in head.named_parameters():
                if name.endswith(("o_proj.weight", "down_proj.weight", "down_proj")):
                    param.mul_(0.1)
    return head.float().eval()


def mtp_tensors(head) -> dict:
    """The head's tensors by published checkpoint name (``mtp.*``, routed experts one by one)."""
    tensors = {}
    for name, tensor in head.state_dict().items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            for expert, fused in enumerate(tensor):
                gate, up = fused.chunk(2, dim=0)
                tensors[f"mtp.{prefix}{expert}.gate_proj.weight"] = gate
                tensors[f"mtp.{prefix}{expert}.up_proj.weight"] = up
        elif name.endswith(".mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for expert, weight in enumerate(tensor):
                tensors[f"mtp.{prefix}{expert}.down_proj.weight"] = weight
        else:
            tensors[f"mtp.{name}"] = tensor
    return tensors


def add_mtp_shard(folder: pathlib.Path, text_config, seed: int = 0, kind: str = "random") -> None:
    """Add the :func:`mtp_head` tensors (bf16, one shard) as real Qwen3.5 checkpoints carry them."""
    import torch
    from safetensors.torch import save_file

    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in mtp_tensors(mtp_head(text_config, seed, kind)).items()}
    save_file(tensors, str(folder / MTP_SHARD), metadata={"format": "pt"})
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update({key: MTP_SHARD for key in tensors})
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    text = config.get("text_config", config)
    key = "num_nextn_predict_layers" if text_config.model_type == "qwen3_next" else "mtp_num_hidden_layers"
    text[key] = 1
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def save_image_processor(folder: pathlib.Path, vision_config) -> None:
    """``preprocessor_config.json``: transformers' Qwen2-VL image processor sized for the tiny tower.

    Its PIL implementation (``Qwen2VLImageProcessorPil``) is what loads it without torchvision.
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil(
        patch_size=vision_config.patch_size, temporal_patch_size=vision_config.temporal_patch_size,
        merge_size=vision_config.spatial_merge_size, size={"shortest_edge": VL_MIN_PIXELS, "longest_edge": VL_MAX_PIXELS},
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )
    processor.save_pretrained(folder)


def save_video_processor(folder: pathlib.Path, vision_config) -> None:
    """``video_preprocessor_config.json`` (Qwen3-VL's video processor fields) sized for the tiny tower.

    Written as JSON: transformers' video processor classes need torchvision to be built.
    """
    config = {
        "video_processor_type": "Qwen3VLVideoProcessor", "processor_class": "Qwen3VLProcessor",
        "patch_size": vision_config.patch_size, "temporal_patch_size": vision_config.temporal_patch_size,
        "merge_size": vision_config.spatial_merge_size, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "rescale_factor": 1 / 255, "do_rescale": True, "do_normalize": True, "do_resize": True,
        "size": {"shortest_edge": VL_MIN_PIXELS * vision_config.temporal_patch_size, "longest_edge": VL_MAX_VIDEO_PIXELS},
        "fps": 2, "min_frames": 2, "max_frames": 16,
    }
    (folder / "video_preprocessor_config.json").write_text(json.dumps(config, indent=2) + "\n")


def build(
    name: str, out_dir: pathlib.Path, seed: int = 0, num_layers: int = REAL_LAYERS, num_experts: int = REAL_EXPERTS,
    mtp_head_kind: str = "random",
) -> pathlib.Path:
    """Build one checkpoint into ``out_dir / name`` (written whole, then renamed into place).

    ``num_layers`` and ``num_experts`` apply to the ``REAL_MODELS`` only, the MTP head
    (``mtp_head_kind``, see :func:`mtp_head`) to the tiny ones only; a head other than
    ``"random"`` goes to ``out_dir / f"{name}-mtp-{mtp_head_kind}"``.
    """
    import torch

    if name not in ALL_MODELS:
        raise ValueError(f"name must be one of {list(ALL_MODELS)}; got {name!r}")
    if mtp_head_kind not in MTP_HEADS:
        raise ValueError(f"mtp_head_kind must be one of {list(MTP_HEADS)}; got {mtp_head_kind!r}")
    fp8 = name.endswith(FP8_SUFFIX)
    base = name[: -len(FP8_SUFFIX)] if fp8 else name
    real = base in REAL_MODELS
    folder = name if mtp_head_kind == "random" else f"{name}-mtp-{mtp_head_kind}"
    target = out_dir / folder
    staging = staging_folder(target)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tokenizer = build_tokenizer(published_dims(base)["vocab_size"] if real else VOCAB_SIZE, vision=base in VL_MODELS)
    if real:
        # Initialised in bf16 directly: an fp32 copy of a 2.6 GB checkpoint would double the peak.
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = build_real_model(base, tokenizer, num_layers, num_experts)
        finally:
            torch.set_default_dtype(default_dtype)
    else:
        model = build_model(base, tokenizer)
    sharpen_router(model)
    model = model.to(torch.bfloat16)
    # Tiny: small shards so the loader is exercised on a multi-file checkpoint.
    model.save_pretrained(staging, max_shard_size="1GB" if real else "200KB")
    tokenizer.save_pretrained(staging)
    if not real:
        add_mtp_shard(staging, model.config.get_text_config(), seed, mtp_head_kind)
    if base in VL_MODELS:
        save_image_processor(staging, model.config.vision_config)
    if base == "qwen3_5-vl":  # the MoE one stands for a checkpoint without video support
        save_video_processor(staging, model.config.vision_config)
    if fp8:
        quantize_checkpoint(staging, getattr(torch, FP8_SCALE_DTYPE.get(base, "bfloat16")))
    record = {"name": name, "seed": seed, "mtp_head": mtp_head_kind}
    if real:
        record.update(num_layers=num_layers, num_experts=num_experts)
    (staging / "tiny-model.json").write_text(json.dumps(record) + "\n")
    del model
    return move_into_place(staging, target)


def quantize_checkpoint(folder: pathlib.Path, scale_dtype) -> None:
    """Rewrite the bf16 checkpoint in ``folder`` as a block-FP8 one, in the published layout.

    Every tensor :func:`vllm_gdn_neuron.model.fp8.is_quantized_weight` names becomes
    float8_e4m3fn plus its ``_scale_inv`` (``scale_dtype``, one value per 128 x 128 block,
    clipped at the edges: every tiny weight is one clipped block); the rest stays bf16.
    ``config.json`` gains the published ``quantization_config``, whose
    ``modules_to_not_convert`` names every kept 2-D weight's module by its full checkpoint
    name (``model.language_model.layers.0.mlp.gate`` in a vision-language wrapper).
    """
    from safetensors.torch import load_file, save_file

    from vllm_gdn_neuron.model import fp8

    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    weight_map, kept, total = {}, set(), 0
    for shard in sorted(set(index["weight_map"].values())):
        tensors = {}
        for name, tensor in load_file(str(folder / shard)).items():
            if fp8.is_quantized_weight(name):
                tensors[name], tensors[fp8.scale_name(name)] = fp8.quantize_blocks(tensor, fp8.BLOCK_SIZE, scale_dtype)
            else:
                tensors[name] = tensor
                if name.endswith(".weight") and tensor.dim() == 2:
                    kept.add(name[: -len(".weight")])
        save_file(tensors, str(folder / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
        total += sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    index["weight_map"] = dict(sorted(weight_map.items()))
    index.setdefault("metadata", {})["total_size"] = total
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = {
        "quant_method": fp8.FP8_METHOD, "fmt": fp8.SUPPORTED_FMT, "activation_scheme": fp8.SUPPORTED_ACTIVATION_SCHEME,
        "weight_block_size": list(fp8.BLOCK_SIZE), "modules_to_not_convert": sorted(kept),
    }
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def staging_folder(target: pathlib.Path) -> pathlib.Path:
    """An empty-to-be folder next to ``target`` to write a checkpoint into (a leftover one removed)."""
    staging = target.parent / f".{target.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    return staging


def move_into_place(staging: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """Replace ``target`` by the complete ``staging`` folder: a checkpoint appears only whole."""
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="folder to build into")
    parser.add_argument(
        "--only", choices=ALL_MODELS, action="append",
        help="build only these (repeatable; default: every tiny model and its FP8 twin)",
    )
    parser.add_argument("--if-missing", action="store_true", help="skip models whose folder already exists")
    parser.add_argument("--layers", type=int, default=REAL_LAYERS, help="layers of a real-dims model")
    parser.add_argument("--experts", type=int, default=REAL_EXPERTS, help="experts of a real-dims MoE model")
    parser.add_argument("--mtp-head", choices=MTP_HEADS, default="random",
                        help="the tiny models' MTP head (not 'random': built as <name>-mtp-<kind>)")
    args = parser.parse_args(argv)
    for name in args.only or MODELS + FP8_MODELS:
        folder = name if args.mtp_head == "random" else f"{name}-mtp-{args.mtp_head}"
        if args.if_missing and (args.out / folder / "config.json").exists():
            continue
        built = build(name, args.out, num_layers=args.layers, num_experts=args.experts, mtp_head_kind=args.mtp_head)
        print(f"[tiny-models] {name} -> {built}")


if __name__ == "__main__":
    main()
