"""Qwen3.5 (dense, MoE), its vision-language checkpoints' text part, and Qwen3-Next for vllm-neuron.

The runner's contract (pinned in :mod:`.contract`):

1. ``model = cls.from_configs(hf_config, neuron_config)`` under ``torch.device("meta")``
   (refusals of :mod:`.checks` happen here, before any weight is read);
2. ``model.load_weights(model_path, device, download_dir)`` (:mod:`.weights`);
3. ``torch.compile(model, fullgraph=True)``, one graph per bucket;
4. ``model.get_kv_spec()`` -> the runner allocates -> ``model.bind_kv_cache({name: [pages]})``,
   one page-major tensor per layer (``kv_cache_page_major``);
5. ``model(input_ids, positions, attn_metadata, sampling_positions, ...)`` -> the logits of
   ``sampling_positions`` ``[num_reqs, vocab]`` (vLLM samples on the host), or, with
   ``neuron_config.on_device_sampling_config`` set, ``(token_ids [num_reqs] int32, logits or
   None)`` sampled in the graph from ``sampling_params`` (:mod:`.sampling`).

The decoder is :mod:`vllm_gdn_neuron.model.decoder`'s, built from the Neuron parts
(:class:`NeuronDecoderParts`); the per-step inputs travel as one :class:`.step.NeuronStep`:

```
hidden = model(embed(ids), step)                 # the shared TextModel
logits = lm_head(hidden[sampling_positions])
ids = sample(logits, sampling_params)            # on-device sampling only
```

GDN call points (where the NKI kernels plug in): :meth:`NeuronGatedDeltaNet.forward`
calls :func:`vllm_gdn_neuron.model.gated_deltanet.gdn_mix`, i.e. ``ops.paged_conv1d_*``
and ``ops.paged_gdn_*`` on the gathered state rows.
"""

import logging

import torch
from torch import nn

from vllm_gdn_neuron.model.causal_lm import CausalLM, ties_word_embeddings
from vllm_gdn_neuron.model.decoder import DecoderParts, TextModel
from vllm_gdn_neuron.model.dtypes import config_dtype
from vllm_gdn_neuron.model.norms import ZeroCentredRMSNorm
from vllm_gdn_neuron.model.vision import prompt_mrope_positions
from vllm_gdn_neuron.shells.neuron.attention import NeuronGatedAttention
from vllm_gdn_neuron.model.gdn_cache import gdn_state_shapes
from vllm_gdn_neuron.shells.neuron.cache import STATE_DTYPE, bind_allocations
from vllm_gdn_neuron.model.fp8 import block_size_of, held_fp8_config
from vllm_gdn_neuron.shells.neuron.checks import (check_engine_config, check_neuron_config, check_quantization,
                                           check_speculative_config, check_text_config, check_vision_neuron_config)
from vllm_gdn_neuron.shells.neuron.fp8 import keep_fp8_on_device
from vllm_gdn_neuron.shells.neuron.gdn import NeuronGatedDeltaNet
from vllm_gdn_neuron.shells.neuron.kv_spec import KVSpec
from vllm_gdn_neuron.shells.neuron.mlp import NeuronSparseMoE, NeuronSwiGLU
from vllm_gdn_neuron.shells.neuron.parallel import current_tp_group
from vllm_gdn_neuron.shells.neuron.sampling import OnDeviceSampler
from vllm_gdn_neuron.shells.neuron.spec_decode import commit_states, judge_drafts, verify_width
from vllm_gdn_neuron.shells.neuron.static_graphs import require_static_graphs
from vllm_gdn_neuron.shells.neuron.step import NeuronStep
from vllm_gdn_neuron.shells.neuron.weights import load_checkpoint
from vllm_gdn_neuron.shells.neuron.vision import check_vision_inputs, merge_vision_embeddings
from vllm_gdn_neuron.shells.neuron.vision_tower import (NeuronVisionTower, VisionLayout, encode_images,
                                                 synthetic_vision_inputs)

logger = logging.getLogger(f"vllm.plugins.{__name__}")

def checkpoint_quantization(hf_config) -> dict | None:
    """The checkpoint's ``quantization_config`` (top-level, or its text config's), or the one the
    plugin's config hook moved out of vLLM's sight under an engine
    (:func:`vllm_gdn_neuron.model.fp8.held_fp8_config`); None for an unquantized checkpoint."""
    for config in (hf_config, getattr(hf_config, "text_config", None)):
        quantization = getattr(config, "quantization_config", None) or held_fp8_config(config)
        if quantization:
            return dict(quantization)
    return None


def text_config_of(hf_config):
    """The text decoder's config (``text_config`` of a vision-language checkpoint)."""
    return getattr(hf_config, "text_config", None) or hf_config


def current_vllm_config():
    """vLLM's current ``VllmConfig`` (the runner builds the model inside one), or None."""
    import sys

    vllm_config_module = sys.modules.get("vllm.config")
    if vllm_config_module is None:
        return None
    try:
        return vllm_config_module.get_current_vllm_config()
    except AssertionError:  # no engine config set (e.g. a model built outside an engine)
        return None


def engine_limits(vllm_config) -> dict:
    """The engine settings the start-up checks bound the model by (None where unknown).

    Keys: ``max_model_len``, ``max_num_seqs``, ``dtype``, ``image_limit`` /
    ``video_limit`` (``limit-mm-per-prompt``; 0 when the model takes no multimodal input)
    ``seed`` (``--seed``, the on-device sampler's key), ``max_num_batched_tokens`` and
    ``async_scheduling``.
    """
    limits = dict(max_model_len=None, max_num_seqs=None, dtype=None, image_limit=None, video_limit=None, seed=None,
                  max_num_batched_tokens=None, async_scheduling=False)
    if vllm_config is None:
        return limits
    scheduler = vllm_config.scheduler_config
    limits.update(max_num_seqs=scheduler.max_num_seqs,
                  max_num_batched_tokens=getattr(scheduler, "max_num_batched_tokens", None),
                  async_scheduling=bool(getattr(scheduler, "async_scheduling", False)))
    model_config = vllm_config.model_config
    if model_config is None:
        return limits
    multimodal = getattr(model_config, "multimodal_config", None)
    limits.update(
        seed=getattr(model_config, "seed", None),
        max_model_len=model_config.max_model_len,
        dtype=model_config.dtype,
        image_limit=multimodal.get_limit_per_prompt("image") if multimodal is not None else 0,
        video_limit=multimodal.get_limit_per_prompt("video") if multimodal is not None else 0,
    )
    return limits


class GatheredLogits(nn.Module):
    """The logits of a vocabulary-sharded LM head, every rank's shard gathered (``vocab_shards`` > 1)."""

    def __init__(self, tp_group, vocab_shards: int) -> None:
        super().__init__()
        self.tp_group = tp_group
        self.vocab_shards = vocab_shards

    def forward(self, lm_head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """``[R, H]`` hidden rows -> ``[R, V]`` logits."""
        logits = lm_head(hidden)
        return self.tp_group.all_gather(logits, dim=-1) if self.vocab_shards > 1 else logits


class NeuronDecoderParts(DecoderParts):
    """The Neuron pieces of the shared decoder: plain per-rank linears in the model dtype,
    attention and GatedDeltaNet over page-major pages, the all-reduce after the feed-forward,
    and an LM head split by vocabulary over the ranks where they divide it (else replicated)."""

    def __init__(self, tp_group, dtype: torch.dtype, vocab_size: int) -> None:
        self.tp_group = tp_group
        self.dtype = dtype
        self.feed_forward_reduce = tp_group.all_reduce
        tp = tp_group.world_size
        self.vocab_shards = tp if vocab_size % tp == 0 else 1

    def embedding(self, config) -> nn.Module:
        """Replicated on every rank."""
        return nn.Embedding(config.vocab_size, config.hidden_size, dtype=self.dtype)

    def norm(self, hidden_size: int, eps: float) -> nn.Module:
        return ZeroCentredRMSNorm(hidden_size, eps=eps).to(self.dtype)

    def linear_attention(self, config, prefix: str) -> nn.Module:
        return NeuronGatedDeltaNet(config, prefix, self.tp_group, self.dtype)

    def full_attention(self, config, prefix: str) -> nn.Module:
        return NeuronGatedAttention(config, prefix, self.tp_group, self.dtype)

    def dense_mlp(self, config, prefix: str) -> nn.Module:
        return NeuronSwiGLU(config.hidden_size, config.intermediate_size // self.tp_group.world_size, self.dtype)

    def sparse_moe(self, config, prefix: str) -> nn.Module:
        return NeuronSparseMoE(config, self.tp_group.world_size, self.dtype)

    def lm_head(self, config, tied_embedding: nn.Module | None) -> nn.Module:
        """This rank's vocabulary rows; a tied head gets a copy of the (replicated) embedding at load."""
        return nn.Linear(config.hidden_size, config.vocab_size // self.vocab_shards, bias=False, dtype=self.dtype)

    def logits_processor(self, config) -> nn.Module:
        return GatheredLogits(self.tp_group, self.vocab_shards)


class Qwen3_5NeuronForCausalLM(CausalLM):
    """The Qwen3.5 hybrid decoder driven by vllm-neuron's runner.

    One class serves every layout (dense or MoE layers come from the config; the loader
    reads both GatedDeltaNet checkpoint layouts and the vision-language prefixes).

    Args:
        hf_config: the checkpoint's Hugging Face config (a ``text_config`` is used if present).
        neuron_config: vllm-neuron's ``NeuronConfig`` or None.
        tp_group: the tensor-parallel group; default: vLLM's, else a single rank.
    """

    # vllm-neuron: bind one page-major view per layer (block b of every layer in page b).
    kv_cache_page_major = True
    # vLLM's model inspection (hybrid planner): GDN state layers beside attention layers.
    is_hybrid = True
    has_inner_state = True

    def __init__(self, hf_config, neuron_config=None, tp_group=None) -> None:
        config = text_config_of(hf_config)
        tp_group = tp_group if tp_group is not None else current_tp_group()
        check_text_config(config, tp_group.world_size)
        vllm_config = current_vllm_config()
        limits = engine_limits(vllm_config)
        check_engine_config(vllm_config)
        check_neuron_config(neuron_config, config, limits["max_model_len"], limits["max_num_seqs"])
        quantization_config = checkpoint_quantization(hf_config)
        fp8_on_device = check_quantization(quantization_config, getattr(neuron_config, "quantization", None))
        check_speculative_config(getattr(vllm_config, "speculative_config", None), neuron_config, config,
                                 async_scheduling=limits["async_scheduling"], max_num_seqs=limits["max_num_seqs"],
                                 max_num_batched_tokens=limits["max_num_batched_tokens"])
        dtype = limits["dtype"] or config_dtype(config)
        parts = NeuronDecoderParts(tp_group, dtype, config.vocab_size)
        super().__init__(config, parts, TextModel(config, parts, prefix="model"), ties_word_embeddings(hf_config))
        self.tp_group = tp_group
        self.dtype = dtype
        self.vocab_shards = parts.vocab_shards
        # Block-FP8 checkpoints: their block size (None: unquantized), and whether FP8 stays on the device.
        self.checkpoint_block_size = block_size_of(quantization_config) if quantization_config else None
        self.fp8_on_device = fp8_on_device
        self.fp8_params: set[str] = set()
        self.spatial_merge_size = getattr(getattr(hf_config, "vision_config", None), "spatial_merge_size", 1)
        image_token_id = getattr(hf_config, "image_token_id", None)
        self.vision_token_ids = {} if image_token_id is None else {"image": image_token_id}
        self.uses_mrope = "mrope_section" in (config.rope_parameters or {})
        sampling_config = getattr(neuron_config, "on_device_sampling_config", None)
        self.sampler = None if sampling_config is None else OnDeviceSampler(sampling_config, limits["seed"] or 0)
        # With on-device sampling the runner reads logits back only for logprobs (max_logprobs != 0)
        # or its debug logits dump; otherwise only the ids leave the device.
        self.returns_logits = self.sampler is not None and bool(
            getattr(neuron_config, "max_logprobs", 0) != 0 or getattr(neuron_config, "debug_logits_dir", None))

    # --- construction and weights (runner steps 1 and 2) ---------------------------------

    @classmethod
    def from_configs(cls, hf_config, neuron_config=None, *, text_neuron_config=None, vision_neuron_config=None):
        """Build the model (the runner calls this under ``torch.device("meta")``).

        The multimodal form (``text_neuron_config=``, ``vision_neuron_config=``) builds a
        :class:`Qwen3_5NeuronForConditionalGeneration` (the text decoder and its ``visual``
        tower) where the engine takes images (:func:`.checks.check_vision_neuron_config`),
        else the text decoder only.
        """
        limits = engine_limits(current_vllm_config())
        serves_images = check_vision_neuron_config(vision_neuron_config, getattr(hf_config, "vision_config", None),
                                                   limits["image_limit"], limits["video_limit"])
        neuron_config = neuron_config if neuron_config is not None else text_neuron_config
        if serves_images:
            return Qwen3_5NeuronForConditionalGeneration(hf_config, neuron_config,
                                                         vision_neuron_config=vision_neuron_config)
        return cls(hf_config, neuron_config)

    def load_weights(self, model_path: str, device, download_dir: str | None = None) -> None:
        """Load this rank's shards of the checkpoint at ``model_path`` onto ``device``.

        Meta parameters (a model fresh from ``from_configs``) are materialised on ``device``
        first; every parameter must then be written exactly once, or this raises naming
        the ones the checkpoint did not provide. A block-FP8 checkpoint is dequantized on the
        host; with ``neuron_config.quantization: "fp8"`` its FP8 projections and experts are
        then requantized per output row and kept in FP8 (:mod:`.fp8`).
        """
        load_checkpoint(self, model_path, torch.device(device), download_dir)
        if self.fp8_on_device:
            converted = keep_fp8_on_device(self, self.fp8_params)
            logger.info("FP8 weights on the device: %d projections and expert stacks kept in FP8 "
                        "(per-row scales, e4m3 range +-240)", len(converted))

    # --- the cache (runner step 4) --------------------------------------------------------

    def get_kv_spec(self) -> KVSpec:
        """Paged KV for the attention layers, two float32 states for the GDN layers."""
        attention, recurrent = [], []
        for layer in self.model.layers:
            (recurrent if layer.is_linear else attention).append(layer.mixer.kv_spec())
        return KVSpec(layers=attention, recurrent_layers=recurrent)

    def bind_kv_cache(self, kv_caches: dict[str, list[torch.Tensor]]) -> None:
        """Bind one page-major tensor per layer; all are checked against the spec before any is bound.

        Layers whose views share one allocation (the runner's one int8 buffer per vLLM
        ``KVCacheTensor``, viewed in bf16 by an attention layer and in float32 by GDN layers)
        keep that allocation as one int8 tensor and take their views inside the traced step
        (:mod:`.cache`): aot_autograd refuses in-place writes into inputs that alias in
        different dtypes.

        Also turns Dynamo's automatic dynamic shapes off (:mod:`.static_graphs`): the runner's
        compile call passes no ``dynamic=``, and each bucket must trace one static graph.
        """
        for layer in self.model.layers:
            name = layer.mixer.layer_name
            if name not in kv_caches:
                raise ValueError(f"bind_kv_cache: no cache for layer {name!r}; got {sorted(kv_caches)}")
            tensors = kv_caches[name]
            if len(tensors) != 1:
                raise ValueError(f"bind_kv_cache: layer {name!r} takes one page-major tensor; got {len(tensors)}")
            layer.mixer.check_cache(tensors[0])
        bound = bind_allocations({layer.mixer.layer_name: kv_caches[layer.mixer.layer_name][0]
                                  for layer in self.model.layers})
        for layer in self.model.layers:
            layer.mixer.bind(bound[layer.mixer.layer_name])
        if self.sampler is not None:
            self.sampler.bind(self.lm_head.weight.device)
        require_static_graphs()

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        """The GDN state shapes vLLM's hybrid planner sizes pages from (same as ``get_kv_spec``)."""
        return gdn_state_shapes(text_config_of(vllm_config.model_config.hf_config),
                                vllm_config.parallel_config.tensor_parallel_size)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        return STATE_DTYPE, STATE_DTYPE

    def get_mrope_input_positions(self, input_tokens, mm_features) -> tuple[torch.Tensor, int]:
        """vllm-neuron's ``SupportsMRoPE``: ``([3, L] int64 positions, delta)`` of a prompt with images
        (:func:`~vllm_gdn_neuron.model.vision.prompt_mrope_positions`; videos are refused).

        The runner calls it once per request of a model config that uses M-RoPE, when the request
        is first scheduled, keeps the positions for the prompt's prefill chunks and gives each later
        token ``delta + cache position`` on all three axes.
        """
        return prompt_mrope_positions(input_tokens, mm_features, self.vision_token_ids, self.spatial_merge_size)

    # --- forward (runner step 5) ----------------------------------------------------------

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: dict,
        sampling_positions: torch.Tensor,
        sampling_params: torch.Tensor | None = None,
        spec_decode_metadata=None,
        logit_mask: torch.Tensor | None = None,
        rank: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        is_token_ids: torch.Tensor | None = None,
        rotary_position_ids: torch.Tensor | None = None,
        vision_embedding_blocks: tuple[torch.Tensor, ...] | None = None,
        vision_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One engine step over a bucket-padded batch.

        The keywords are those of vllm-neuron's runner (``_execute_model_forward`` and the
        warm-up input builders of whn09/vllm-neuron@7ea99278 ``neuron_model_runner.py``).

        Dimensions:
            T: tokens of the step (a prefill bucket, or one per decode row); R: logit rows
            (``sampling_positions``); H: hidden size; V: vocabulary size.

        Args:
            input_ids: ``[T]`` int32 / int64 token ids (padding tokens: any id).
            positions: ``[T]`` int64 cache positions (padded prefill tokens repeat the last one).
            attn_metadata: per-layer dicts (``block_table_tensor``, ``slot_mapping`` with
                padding ``<= 0``, ``max_query_len``, ``decode_token_threshold``).
            sampling_positions: ``[R]`` int64, the token whose logits each row returns.
            sampling_params: with on-device sampling, ``[R, 3]`` float32 ``[top_k, top_p,
                temperature]`` rows (:mod:`.sampling`); unused (the runner passes None) without.
            rank: accepted, not used (every rank samples the all-gathered logits).
            spec_decode_metadata: None, or on a verify step (decode, W = 1 + N tokens per row:
                the last token, then N drafts) vLLM's ``SpecDecodeMetadata`` of the runner; only
                ``draft_token_ids [R * N]`` int32 is read (:mod:`.spec_decode`). Needs on-device
                sampling.
            logit_mask: ``[R, V]`` bool, True where a token is allowed, or None. The runner
                passes an all-True mask when ``neuron_config.enable_structured_outputs`` is
                set (the grammar itself is applied to the returned logits on the host);
                disallowed tokens get ``-inf`` here, in the graph.
            inputs_embeds: ``[T, H]`` prompt embeddings (the runner sends bfloat16; cast to
                the model dtype), or None.
            is_token_ids: ``[T]`` bool, True where the token id's embedding is used and
                False where ``inputs_embeds`` is; None with ``inputs_embeds`` means every
                token comes from ``inputs_embeds``.
            rotary_position_ids: ``[3, T]`` int64 M-RoPE positions (temporal, height,
                width), passed when the model config uses M-RoPE, or None. q and k turn by
                them (``mrope_section``, :mod:`vllm_gdn_neuron.model.rotary`); text tokens
                carry one value on all three axes, image tokens their grid position;
                ``positions`` stays the cache position. Without an ``mrope_section`` only
                the temporal row is read.
            vision_embedding_blocks, vision_positions: on a prefill step of a multimodal
                engine, ``NB`` encoder-cache blocks ``[BS, H]`` and ``[NB, BS]`` int64
                token indices (sentinel ``T``) of the image embeddings replacing the
                image tokens' (:mod:`.vision`); None otherwise.

        Returns:
            ``[R, V]`` logits in the model dtype; with on-device sampling ``(ids, logits)``:
            ``[R]`` int32 token ids and the logits when the runner may read them for logprobs
            (``neuron_config.max_logprobs != 0``), else None. A verify step returns ids
            ``[rows, W]`` int32 instead: each row's ids up to its first rejected draft's
            correction (or the bonus id), ``-1`` after.
        """
        step = self._engine_step(input_ids.shape[0], positions, rotary_position_ids, attn_metadata,
                                 spec_decode_metadata)
        if self.sampler is not None:
            self.sampler.check(sampling_params, sampling_positions.shape[0])
        hidden = self._input_embeddings(input_ids, inputs_embeds, is_token_ids)
        if vision_embedding_blocks is not None or vision_positions is not None:
            check_vision_inputs(vision_embedding_blocks, vision_positions, hidden.shape[0], hidden.shape[1],
                                step.is_decode)
            hidden = merge_vision_embeddings(hidden, vision_embedding_blocks, vision_positions)
        hidden = self.model(hidden, step)
        logits = self.compute_logits(hidden.index_select(0, sampling_positions.to(torch.int64)))
        logits = logits if logit_mask is None else self._apply_logit_mask(logits, logit_mask)
        if self.sampler is None:
            return logits
        ids = self.sampler(logits, sampling_params)
        if step.width > 1:
            ids, kept = judge_drafts(ids, spec_decode_metadata.draft_token_ids, step.width)
            commit_states(step.pending, kept)
        return ids, (logits if self.returns_logits else None)

    def _engine_step(self, num_tokens: int, positions, rotary_position_ids, attn_metadata,
                     spec_decode_metadata) -> NeuronStep:
        """The step object the mixers read: decode or prefill (from the first layer's metadata), the
        tokens per decode row (1, or 1 + N on a verify step) and the rotary positions.

        Raises:
            ValueError: for ``spec_decode_metadata`` on a prefill step, or without on-device sampling.
        """
        first = attn_metadata[self.model.layers[0].mixer.layer_name]
        is_decode = first["max_query_len"] <= first["decode_token_threshold"]
        width = 1
        if is_decode:
            width = verify_width(num_tokens, first["block_table_tensor"].shape[0], spec_decode_metadata)
        elif spec_decode_metadata is not None:
            raise ValueError("spec_decode_metadata must be None on a prefill step (max_query_len "
                             f"{first['max_query_len']} > decode_token_threshold {first['decode_token_threshold']})")
        if width > 1 and self.sampler is None:
            raise ValueError("spec_decode_metadata needs on-device sampling: the drafts are judged in the step's "
                             "graph (set neuron_config.on_device_sampling_config)")
        rope_positions = (positions if rotary_position_ids is None
                          else self._rope_positions(rotary_position_ids, positions.shape[0]))
        # A verify step's GDN states go to ``pending``, written once the drafts are judged.
        return NeuronStep(positions, rope_positions, attn_metadata, is_decode, width,
                          pending=[] if width > 1 else None)

    def _input_embeddings(self, input_ids, inputs_embeds, is_token_ids) -> torch.Tensor:
        """``[T, H]``: the embedding of each id, or the prompt embedding where ``is_token_ids`` is False."""
        if inputs_embeds is None:
            if is_token_ids is not None:
                raise ValueError("is_token_ids was given without inputs_embeds: pass both or neither")
            return self.embed_input_ids(input_ids)
        tokens, hidden_size = input_ids.shape[0], self.config.hidden_size
        if tuple(inputs_embeds.shape) != (tokens, hidden_size):
            raise ValueError(f"inputs_embeds must be [{tokens}, {hidden_size}] (tokens, hidden_size); "
                             f"got {list(inputs_embeds.shape)}")
        embeds = inputs_embeds.to(self.dtype)
        if is_token_ids is None:
            return embeds
        if tuple(is_token_ids.shape) != (tokens,) or is_token_ids.dtype != torch.bool:
            raise ValueError(f"is_token_ids must be a [{tokens}] bool tensor; "
                             f"got {list(is_token_ids.shape)} {is_token_ids.dtype}")
        return torch.where(is_token_ids[:, None], self.embed_input_ids(input_ids), embeds)

    def _rope_positions(self, rotary_position_ids, tokens: int) -> torch.Tensor:
        """``[3, T]`` M-RoPE positions, or their temporal row ``[T]`` for a config without
        ``mrope_section`` (no M-RoPE: the runner passes none, and text rows are all equal)."""
        if tuple(rotary_position_ids.shape) != (3, tokens) or rotary_position_ids.dtype.is_floating_point:
            raise ValueError(f"rotary_position_ids must be a [3, {tokens}] integer tensor (M-RoPE axes, tokens); "
                             f"got {list(rotary_position_ids.shape)} {rotary_position_ids.dtype}")
        return rotary_position_ids if self.uses_mrope else rotary_position_ids[0]

    def _apply_logit_mask(self, logits, logit_mask) -> torch.Tensor:
        """``logits`` with ``-inf`` where ``logit_mask`` ``[R, V]`` (bool) is False."""
        if tuple(logit_mask.shape) != tuple(logits.shape) or logit_mask.dtype != torch.bool:
            raise ValueError(f"logit_mask must be a {list(logits.shape)} bool tensor (logit rows, vocab_size); "
                             f"got {list(logit_mask.shape)} {logit_mask.dtype}")
        return logits.masked_fill(~logit_mask, float("-inf"))


class Qwen3_5NeuronForConditionalGeneration(Qwen3_5NeuronForCausalLM):
    """The text decoder and its vision tower ``visual`` (:mod:`.vision_tower`), built by
    :meth:`Qwen3_5NeuronForCausalLM.from_configs` where the engine takes images.

    The runner compiles ``visual`` beside the model (one graph per vision bucket), warms it up
    with :meth:`build_vision_synthetic_inputs` (vllm-neuron's ``SupportsVisionWarmup``) and
    calls :meth:`embed_multimodal` for a prefill step's uncached images.

    Args:
        hf_config: the vision-language checkpoint's config (``vision_config``, ``text_config``).
        neuron_config: the text ``NeuronConfig`` or None.
        tp_group: the tensor-parallel group (the tower is replicated on every rank).
        vision_neuron_config: vllm-neuron's ``VisionNeuronConfig`` (checked by ``from_configs``).
    """

    def __init__(self, hf_config, neuron_config=None, tp_group=None, vision_neuron_config=None) -> None:
        super().__init__(hf_config, neuron_config, tp_group)
        self.vision_config = hf_config.vision_config
        self.vision_layout = VisionLayout.of(vision_neuron_config, self.vision_config)
        self.visual = NeuronVisionTower(self.vision_config, self.dtype)

    def embed_multimodal(self, encoder_cache=None, mm_hashes=None, pixel_values=None, image_grid_thw=None,
                         pixel_values_videos=None, video_grid_thw=None, **kwargs) -> None:
        """Encode a step's images into the runner's encoder cache (:func:`.vision_tower.encode_images`).

        Args:
            encoder_cache: the runner's ``EncoderCacheBlocks``.
            mm_hashes: one identifier per image, in ``image_grid_thw`` order.
            pixel_values: ``[sum(h * w), C*Tp*P*P]`` patches; image_grid_thw: ``[M, 3]`` ``(1, h, w)``.
            pixel_values_videos, video_grid_thw: refused (videos are not served), as is any
                other multimodal keyword that is not None.

        Raises:
            ValueError: for videos, or images that do not fit the vision buckets, naming the argument.
        """
        if pixel_values_videos is not None or video_grid_thw is not None:
            raise ValueError("embed_multimodal: pixel_values_videos / video_grid_thw were given; the Neuron shell "
                             "serves images only (set limit-mm-per-prompt video to 0)")
        unexpected = sorted(key for key, value in kwargs.items() if value is not None)
        if unexpected:
            raise ValueError(f"embed_multimodal takes pixel_values and image_grid_thw; got also {unexpected}")
        encode_images(self.visual, self.vision_layout, self.dtype, encoder_cache, mm_hashes, pixel_values,
                      image_grid_thw)

    def build_vision_synthetic_inputs(self, bucket: int, vision_neuron_config, device) -> dict:
        """The warm-up inputs of the vision graph of ``bucket`` (every row padding); the runner adds
        ``encoder_cache_buffer`` and ``write_block_ids``."""
        return synthetic_vision_inputs(VisionLayout.of(vision_neuron_config, self.vision_config), bucket,
                                       self.dtype, device)
