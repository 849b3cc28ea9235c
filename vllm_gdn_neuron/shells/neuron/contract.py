"""The vllm-neuron version this shell is written against, and the runner's fields it reads.

Pinned: **whn09/vllm-neuron @ 7ea992789fa624ea6b0d7ad4cb0789e784863904** (a fork of
vllm-neuron ``release-0.24.0.1.1.0``: vLLM 0.24, Neuron SDK 2.32). No official vllm-neuron
release has the recurrent-cache path this shell needs (upstream proposes it in
https://github.com/vllm-project/vllm-neuron/pull/54, open; upstream ``main`` @ ``9fc042ea``
binds ``[k, v]`` per attention layer and refuses any other spec). Read at the pin:

- ``vllm_neuron/vllm/worker/neuron_model_runner.py``: ``get_kv_cache_spec`` turns
  ``KVSpec.recurrent_layers`` into vLLM ``MambaSpec``s; ``initialize_kv_cache`` gives a
  ``kv_cache_page_major`` model one int8 buffer per vLLM ``KVCacheTensor`` (shared by one
  layer of every cache group) plus two reserved pages past ``num_blocks`` (a zero page that
  dead rows read, then a sink that they write), bound as dtype views; ``NULL_BLOCK_ID = 0``
  pads slot mappings, block tables reach the model with 0 replaced by ``PAD_SLOT_ID = -1``;
- ``vllm_neuron/vllm/platform.py``: ``_align_hybrid_page_sizes`` (block 32, ``MultipleOf(32)``);
- ``vllm_neuron/model/kv_cache.py``: ``KVSpec.recurrent_layers`` of
  ``RecurrentLayerSpec(name, shapes, dtypes)``;
- ``vllm_neuron/model/neuron_config.py``: ``num_batched_tokens_buckets``,
  ``num_seqs_buckets``, ``on_device_sampling_config`` (an ``OnDeviceSamplingConfig``; on
  by default, off when given as null), ``max_logprobs``;
- prefill steps (``_prepare_model_input_impl``, ``_build_prefill_synthetic_inputs``): one
  block-table row per request, no ``query_start_loc``; the scheduler of that release line
  (``max_prefills_per_batch = 1``) sends one prompt, or one chunk of one, per prefill step,
  and prefill warm-up traces one request. The shell also serves packed prefill steps
  described by the same fields (:mod:`.packing`).
- on-device sampling (``build_sampling_params_tensor``, ``_execute_model_forward``,
  ``_sample``): :mod:`.sampling`.

Page conventions (the recurrent slot of a request is ``block_table_tensor[:, 0]``, a live
token has ``slot_mapping > 0``) as in upstream's Qwen3.5 port model files
(vllm-project/vllm-neuron ``vllm_neuron/model/qwen3_5/model.py`` @ ``aa9b76b7``).

Nothing here imports vllm-neuron: the names below are the fields this shell reads and
writes, checked by ``tests/neuron`` against the stand-ins in :mod:`.kv_spec`.
"""

VLLM_NEURON_REPOSITORY = "https://github.com/whn09/vllm-neuron"
VLLM_NEURON_COMMIT = "7ea992789fa624ea6b0d7ad4cb0789e784863904"
VLLM_NEURON_PIN = f"vllm-neuron (release-0.24.0.1.1.0 line, vLLM 0.24): whn09/vllm-neuron @ {VLLM_NEURON_COMMIT[:8]}"

# Keys of one layer's entry in the forward's ``attn_metadata`` that this shell reads.
METADATA_KEYS = ("block_table_tensor", "slot_mapping", "max_query_len", "decode_token_threshold", "block_size")

# Keyword arguments of ``forward``: whn09/vllm-neuron@7ea99278's runner always passes the
# first eight; ``inputs_embeds`` / ``is_token_ids`` with prompt embeds enabled (text-only
# engines), ``rotary_position_ids`` when the model config uses M-RoPE, and
# ``vision_embedding_blocks`` / ``vision_positions`` on the prefill steps of a multimodal
# engine (``_gather_mm_embeddings``, ``_build_prefill_synthetic_inputs``).
FORWARD_KEYWORDS = (
    "input_ids",
    "positions",
    "attn_metadata",
    "sampling_positions",
    "sampling_params",
    "spec_decode_metadata",
    "logit_mask",
    "rank",
    "inputs_embeds",
    "is_token_ids",
    "rotary_position_ids",
    "vision_embedding_blocks",
    "vision_positions",
)

# Pages the runner appends past ``num_blocks`` under ``kv_cache_page_major``.
NUM_RESERVED_PAGES = 2


def reserved_pages(num_pages: int) -> tuple[int, int]:
    """``(zero_page, sink)`` of a page-major cache of ``num_pages`` pages (reserved included).

    Padding rows read the zero page (nothing writes it) and write the sink.
    """
    return num_pages - NUM_RESERVED_PAGES, num_pages - NUM_RESERVED_PAGES + 1
