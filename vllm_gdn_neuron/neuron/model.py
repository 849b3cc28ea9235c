"""Qwen3.5 (dense, MoE), its vision-language checkpoints' text part, and Qwen3-Next for vllm-neuron.

The runner's contract (pinned in :mod:`.contract`):

1. ``model = cls.from_configs(hf_config, neuron_config)`` under ``torch.device("meta")``
   (refusals of :mod:`.checks` happen here, before any weight is read);
2. ``model.load_weights(model_path, device, download_dir)`` (:mod:`.weights`);
3. ``torch.compile(model, fullgraph=True)``, one graph per bucket;
4. ``model.get_kv_spec()`` -> the runner allocates -> ``model.bind_kv_cache({name: [pages]})``,
   one page-major tensor per layer (``kv_cache_page_major``);
5. ``model(input_ids, positions, attn_metadata, sampling_positions, ...)`` -> the logits of
   ``sampling_positions`` ``[num_reqs, vocab]`` (vLLM samples on the host).

```
x = embed(ids)
for layer:  h, r = norm_in(x, r); h = mixer(h); h, r = norm_post(h, r); x = ffn(h)
logits = lm_head(norm(x, r)[sampling_positions])
```

GDN call points (where the NKI kernels plug in): :meth:`NeuronGatedDeltaNet.forward`
calls :func:`vllm_gdn_neuron.layers.gated_deltanet.gdn_mix`, i.e. ``ops.paged_conv1d_*``
and ``ops.paged_gdn_*`` on the gathered state rows.
"""

import torch
from torch import nn

from vllm_gdn_neuron.layers.checkpoint import is_sparse_layer
from vllm_gdn_neuron.layers.norms import ZeroCentredRMSNorm
from vllm_gdn_neuron.neuron.attention import NeuronGatedAttention
from vllm_gdn_neuron.layers.gdn_cache import gdn_state_shapes
from vllm_gdn_neuron.neuron.cache import STATE_DTYPE, bind_allocations
from vllm_gdn_neuron.neuron.checks import check_neuron_config, check_text_config
from vllm_gdn_neuron.neuron.gdn import NeuronGatedDeltaNet
from vllm_gdn_neuron.neuron.kv_spec import KVSpec
from vllm_gdn_neuron.neuron.mlp import NeuronSparseMoE, NeuronSwiGLU
from vllm_gdn_neuron.neuron.parallel import current_tp_group
from vllm_gdn_neuron.neuron.static_graphs import require_static_graphs
from vllm_gdn_neuron.neuron.weights import load_checkpoint

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def text_config_of(hf_config):
    """The text decoder's config (``text_config`` of a vision-language checkpoint)."""
    return getattr(hf_config, "text_config", None) or hf_config


def model_dtype(text_config) -> torch.dtype:
    raw = getattr(text_config, "dtype", None) or getattr(text_config, "torch_dtype", None) or torch.bfloat16
    return raw if isinstance(raw, torch.dtype) else _DTYPES[str(raw).replace("torch.", "")]


def _engine_settings() -> tuple[int | None, int | None, torch.dtype | None]:
    """``(max_model_len, max_num_seqs, dtype)`` of the engine being set up, when vLLM has a current
    config (the runner builds the model inside one), else Nones."""
    import sys

    vllm_config_module = sys.modules.get("vllm.config")
    if vllm_config_module is None:
        return None, None, None
    try:
        vllm_config = vllm_config_module.get_current_vllm_config()
    except AssertionError:  # no engine config set (e.g. a model built outside an engine)
        return None, None, None
    model_config = vllm_config.model_config
    if model_config is None:
        return None, vllm_config.scheduler_config.max_num_seqs, None
    return model_config.max_model_len, vllm_config.scheduler_config.max_num_seqs, model_config.dtype


class NeuronDecoderLayer(nn.Module):
    """One block: token mixer (GatedDeltaNet or gated attention) + feed-forward, pre-norm."""

    def __init__(self, config, layer_idx: int, tp_group, dtype: torch.dtype) -> None:
        super().__init__()
        self.tp_group = tp_group
        self.is_linear = config.layer_types[layer_idx] == "linear_attention"
        if self.is_linear:
            self.linear_attn = NeuronGatedDeltaNet(config, f"model.layers.{layer_idx}.linear_attn", tp_group, dtype)
        else:
            self.self_attn = NeuronGatedAttention(config, f"model.layers.{layer_idx}.self_attn", tp_group, dtype)
        tp = tp_group.world_size
        if is_sparse_layer(config, layer_idx):
            self.mlp = NeuronSparseMoE(config, tp, dtype)
        else:
            self.mlp = NeuronSwiGLU(config.hidden_size, config.intermediate_size // tp, dtype)
        self.input_layernorm = ZeroCentredRMSNorm(config.hidden_size, eps=config.rms_norm_eps).to(dtype)
        self.post_attention_layernorm = ZeroCentredRMSNorm(config.hidden_size, eps=config.rms_norm_eps).to(dtype)

    @property
    def mixer(self):
        return self.linear_attn if self.is_linear else self.self_attn

    def forward(self, positions, hidden, residual, attn_metadata, is_decode):
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        name = self.mixer.layer_name
        if name not in attn_metadata:
            raise ValueError(f"attn_metadata has no entry for layer {name!r}: the step cannot advance its cache")
        hidden = self.mixer(positions, hidden, attn_metadata[name], is_decode)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.tp_group.all_reduce(self.mlp(hidden)), residual


class NeuronTextModel(nn.Module):
    """Embeddings (replicated on every rank), the decoder layers and the final norm (``model.*``)."""

    def __init__(self, config, tp_group, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            NeuronDecoderLayer(config, idx, tp_group, dtype) for idx in range(config.num_hidden_layers)
        )
        self.norm = ZeroCentredRMSNorm(config.hidden_size, eps=config.rms_norm_eps).to(dtype)


class Qwen3_5NeuronForCausalLM(nn.Module):
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
        super().__init__()
        config = text_config_of(hf_config)
        self.tp_group = tp_group if tp_group is not None else current_tp_group()
        tp = self.tp_group.world_size
        check_text_config(config, tp)
        max_model_len, max_num_seqs, engine_dtype = _engine_settings()
        check_neuron_config(neuron_config, config, max_model_len, max_num_seqs)
        self.config = config
        self.dtype = engine_dtype or model_dtype(config)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False)
                                        or getattr(config, "tie_word_embeddings", False))
        self.vocab_shards = tp if config.vocab_size % tp == 0 else 1
        self.model = NeuronTextModel(config, self.tp_group, self.dtype)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size // self.vocab_shards, bias=False,
                                 dtype=self.dtype)

    # --- construction and weights (runner steps 1 and 2) ---------------------------------

    @classmethod
    def from_configs(cls, hf_config, neuron_config=None, *, text_neuron_config=None, vision_neuron_config=None):
        """Build the model (the runner calls this under ``torch.device("meta")``).

        The multimodal form (``text_neuron_config=``, ``vision_neuron_config=``) builds the
        text decoder only; a vision config is refused unless it is None.
        """
        if vision_neuron_config is not None:
            raise ValueError("vision_neuron_config must be None: the Neuron shell serves the text decoder only")
        return cls(hf_config, neuron_config if neuron_config is not None else text_neuron_config)

    def load_weights(self, model_path: str, device, download_dir: str | None = None) -> None:
        """Load this rank's shards of the checkpoint at ``model_path`` onto ``device``.

        Meta parameters (a model fresh from ``from_configs``) are materialised on ``device``
        first; every parameter must then be written exactly once, or this raises naming
        the ones the checkpoint did not provide.
        """
        load_checkpoint(self, model_path, torch.device(device), download_dir)

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
        require_static_graphs()

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        """The GDN state shapes vLLM's hybrid planner sizes pages from (same as ``get_kv_spec``)."""
        return gdn_state_shapes(text_config_of(vllm_config.model_config.hf_config),
                                vllm_config.parallel_config.tensor_parallel_size)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        return STATE_DTYPE, STATE_DTYPE

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
    ) -> torch.Tensor:
        """One engine step over a bucket-padded batch.

        Args:
            input_ids: ``[T]`` token ids (padding tokens: any id).
            positions: ``[T]`` positions (padded prefill tokens repeat the last one).
            attn_metadata: per-layer dicts (``block_table_tensor``, ``slot_mapping`` with
                padding ``<= 0``, ``max_query_len``, ``decode_token_threshold``).
            sampling_positions: ``[num_reqs]`` the token whose logits each request samples.
            sampling_params, rank, is_token_ids: accepted, not used (host sampling).
            spec_decode_metadata, logit_mask: must be None (no speculative decoding; no
                on-device structured-output mask).
            inputs_embeds: ``[T, H]`` instead of ``input_ids``, or None.

        Returns:
            ``[num_reqs, vocab]`` logits in the model dtype.
        """
        if spec_decode_metadata is not None or logit_mask is not None:
            raise ValueError("spec_decode_metadata and logit_mask must be None (not supported by this model)")
        layers = self.model.layers
        first = attn_metadata[layers[0].mixer.layer_name]
        is_decode = first["max_query_len"] <= first["decode_token_threshold"]
        hidden = self.model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        for layer in layers:
            hidden, residual = layer(positions, hidden, residual, attn_metadata, is_decode)
        hidden, _ = self.model.norm(hidden, residual)
        logits = self.lm_head(hidden.index_select(0, sampling_positions.to(torch.int64)))
        return self.tp_group.all_gather(logits, dim=-1) if self.vocab_shards > 1 else logits
