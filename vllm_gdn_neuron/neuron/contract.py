"""The vllm-neuron version this shell is written against, and the runner's fields it reads.

Pinned: vllm-neuron's native generation (vLLM 0.24, SDK 2.32+ containers), in the form of
the upstream Qwen3.5 port:

- ``vllm-project/vllm-neuron`` ``vllm_neuron/model/qwen3_5/model.py`` at commit
  ``aa9b76b7bce2d153ce22ceabdf9e45fde9b02c22`` and ``deltanet.py`` at
  ``b3a5a71f235f9c4f8167674a0d26ee2dc00c7983``: ``kv_cache_page_major = True``, one
  page-major tensor per layer, two reserved pages past ``num_blocks`` (a zero page that
  dead rows read, then a sink that they write), the recurrent slot of a request is
  ``block_table_tensor[:, 0]``, a live token has ``slot_mapping > 0``;
- ``vllm_neuron/model/kv_cache.py`` in the same form (``KVSpec.recurrent_layers`` of
  ``RecurrentLayerSpec(name, shapes, dtypes)``), as read in the forks that carry that
  file whole (whn09/vllm-neuron ``7ea992789fa624ea6b0d7ad4cb0789e784863904``,
  qingzwang/vllm-neuron ``76172ca7bff91ffa78bddc5ae43c3f51a8ba00d7``);
- ``vllm_neuron/vllm/worker/neuron_model_runner.py`` at
  ``9fc042eaa7e50fbfda292b75c980bf56a9a0e8b6``: ``NULL_BLOCK_ID = 0`` pads block tables
  and slot mappings, ``PAD_SLOT_ID = -1`` is the read-side sentinel;
- ``vllm_neuron/model/neuron_config.py`` (whn09 at the commit above):
  ``num_batched_tokens_buckets``, ``num_seqs_buckets``, ``on_device_sampling_config``.

Nothing here imports vllm-neuron: the names below are the fields this shell reads and
writes, checked by ``tests/neuron`` against the stand-ins in :mod:`.kv_spec`.
"""

VLLM_NEURON_PIN = "vllm-neuron native (vLLM 0.24): vllm-project/vllm-neuron qwen3_5 @ aa9b76b7"

# Keys of one layer's entry in the forward's ``attn_metadata`` that this shell reads.
METADATA_KEYS = ("block_table_tensor", "slot_mapping", "max_query_len", "decode_token_threshold", "block_size")

# Keyword arguments of ``forward``: whn09/vllm-neuron@7ea99278's runner always passes the
# first eight; ``inputs_embeds`` / ``is_token_ids`` with prompt embeds enabled, and
# ``rotary_position_ids`` when the model config uses M-RoPE.
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
)

# Pages the runner appends past ``num_blocks`` under ``kv_cache_page_major``.
NUM_RESERVED_PAGES = 2


def reserved_pages(num_pages: int) -> tuple[int, int]:
    """``(zero_page, sink)`` of a page-major cache of ``num_pages`` pages (reserved included).

    Padding rows read the zero page (nothing writes it) and write the sink.
    """
    return num_pages - NUM_RESERVED_PAGES, num_pages - NUM_RESERVED_PAGES + 1
