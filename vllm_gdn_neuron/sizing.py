"""Memory arithmetic of a Qwen3.5 serving configuration on trn2.

    python -m vllm_gdn_neuron.sizing configs/trn2/qwen3_5-27b.yaml
    python -m vllm_gdn_neuron.sizing /models/Qwen3.5-27B --config configs/serve-trn2.yaml
    python -m vllm_gdn_neuron.sizing Qwen/Qwen3.5-9B --tensor-parallel-size 4 --max-model-len 8192

The argument is a ``vllm serve --config`` YAML (its ``model`` names the checkpoint), a
checkpoint folder (its ``config.json``), or the name of a published checkpoint whose
dimensions are built in (:data:`PUBLISHED`). It prints, per NeuronCore: the weights, the
KV per token, the GatedDeltaNet conv and recurrent states, the page geometry, the cache
the configured sequences need, and what is left of the core's HBM.

The model, stated so it can be checked:

- Weights: the text decoder only (the vision tower and the multi-token-prediction head
  are not served), every parameter counted once. Matrices split by tensor parallelism
  are divided by the TP size; norms, routers and gates are replicated; key/value heads
  are replicated when the TP size exceeds their count (one per core).
- GatedDeltaNet: one state page per sequence and layer holding the conv state ``[C, K]`` and
  the recurrent state ``[Hv, Dk, Dv]``, both float32 (the Neuron shell's page layout).
- Pages: vLLM's hybrid planner gives every layer's page one size. The attention block size
  becomes the smallest multiple of the attention kernel's block alignment (32 tokens) whose KV
  page holds a state page, and the state page is padded to it. Layers are grouped by kind
  (group size = the smaller layer count, so 3:1 gives 1 attention + 3 state groups); a block
  is ``group size x page``, handed out from one pool; a sequence takes ``ceil(max-model-len /
  block size)`` attention blocks and one block per state group.
- Blocks: ``num-gpu-blocks-override`` plus the null block vllm-neuron adds (and the Neuron
  shell's two reserved pages at the end of every view), or, without an
  override, as many as the memory cap leaves room for: vLLM's planner fills the whole budget
  with blocks no sequence reaches, which is why every trn2 config here sets the override to
  what ``max-num-seqs`` sequences take (:attr:`Sizing.blocks_for_max_num_seqs`).
- FP8 weights (``neuron_config.quantization: "fp8"``, :mod:`vllm_gdn_neuron.shells.neuron.fp8`):
  the projections a block-FP8 checkpoint quantizes (GatedDeltaNet ``in_proj_qkv`` / ``in_proj_z``
  / ``out_proj``, the attention projections, the dense MLP, the shared and routed experts) take
  1 byte a weight plus one float32 scale per output row on each core (a row-parallel weight's
  whole rows, a column-parallel one's rows of this core); everything else keeps the model dtype.
- Fit: weights + cache under the cap, the cache taken at an upper bound: if each layer kept a
  tensor of all the blocks (no sharing across groups), ``groups`` times the shared pool.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from dataclasses import dataclass, replace

from vllm_gdn_neuron.model.dims import ModelDims, WeightCount, count_weights
from vllm_gdn_neuron.shells.neuron.cache import STATE_DTYPE, hybrid_block_size
from vllm_gdn_neuron.shells.neuron.contract import NUM_RESERVED_PAGES
from vllm_gdn_neuron.shells.neuron.fp8 import FP8_ON_DEVICE
from vllm_gdn_neuron.units import DTYPE_BYTES, GiB, KiB, MiB


# trn2, from the Neuron documentation ("Trainium2 Architecture Guide for NKI"; "Logical
# NeuronCore configuration"): a Trainium2 chip has 8 physical NeuronCore-v3 and 4 HBM
# stacks of 96 GiB in total; at the default LNC=2 two physical cores form one logical
# core, so a chip shows 4 cores of 24 GiB each. A core cannot use its neighbours' HBM.
TRN2_HBM_PER_CHIP_GIB = 96
TRN2_PHYSICAL_CORES_PER_CHIP = 8
TRN2_DEFAULT_LNC = 2
TRN2_HBM_PER_CORE_GIB = TRN2_HBM_PER_CHIP_GIB * TRN2_DEFAULT_LNC / TRN2_PHYSICAL_CORES_PER_CHIP

# ``neuron_config.quantization`` values sized: weights in the model dtype, or FP8 on the device.
QUANTIZATIONS = (None, "bf16", FP8_ON_DEVICE)
# One FP8 weight, and the float32 scale of each of its rows.
FP8_WEIGHT_BYTES = 1
FP8_SCALE_BYTES = 4

# ``auto``: the model's own dtype (a cache dtype vLLM takes from the model).
_DTYPE_BYTES = {**DTYPE_BYTES, "auto": None}

# Published checkpoints: transformers' config class (whose defaults are the checkpoint
# named in its docstring) plus the model card's numbers where they differ.
PUBLISHED = {
    "Qwen/Qwen3.5-2B": (
        "Qwen3_5TextConfig",
        dict(
            hidden_size=2048, intermediate_size=6144, num_hidden_layers=24, num_attention_heads=8,
            num_key_value_heads=2, linear_num_key_heads=16, linear_num_value_heads=16,
            tie_word_embeddings=True,
        ),
        "model card (24 layers, hidden 2048, FFN 6144, attention 8 Q / 2 KV heads of 256, "
        "GatedDeltaNet 16 QK / 16 V heads of 128); tied embeddings is a guess from the 0.8B "
        "and 4B siblings, not read from the 2B's config.json",
    ),
    "Qwen/Qwen3.5-9B": (
        "Qwen3_5TextConfig",
        {},
        "transformers Qwen3_5TextConfig defaults ('Qwen3.5-9B style'), equal to the model card "
        "(32 layers, hidden 4096, FFN 12288, 16 Q / 4 KV heads, GatedDeltaNet 16 QK / 32 V heads)",
    ),
    "Qwen/Qwen3.5-27B": (
        "Qwen3_5TextConfig",
        dict(
            hidden_size=5120, intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24,
            num_key_value_heads=4, linear_num_value_heads=48,
        ),
        "model card (64 layers, hidden 5120, FFN 17408, attention 24 Q / 4 KV heads of 256, "
        "GatedDeltaNet 16 QK / 48 V heads of 128, untied lm_head)",
    ),
    "Qwen/Qwen3.5-35B-A3B": (
        "Qwen3_5MoeTextConfig",
        {},
        "transformers Qwen3_5MoeTextConfig defaults ('Qwen3.5-35B-A3B style'), equal to the model "
        "card (40 layers, hidden 2048, 256 experts of 512 top-8 + 1 shared expert of 512, "
        "16 Q / 2 KV heads, GatedDeltaNet 16 QK / 32 V heads)",
    ),
}


# The block-FP8 releases: the same dimensions as the bf16 checkpoint they were quantized from.
PUBLISHED.update({
    f"{name}-FP8": (class_name, overrides, f"{source}; the FP8 release has the bf16 checkpoint's dimensions")
    for name, (class_name, overrides, source) in list(PUBLISHED.items())
    if name in ("Qwen/Qwen3.5-27B", "Qwen/Qwen3.5-35B-A3B")
})


def published_dims(name: str) -> ModelDims:
    """The built-in dimensions of a published checkpoint (see :data:`PUBLISHED`)."""
    if name not in PUBLISHED:
        raise ValueError(f"model must be a checkpoint folder or one of {sorted(PUBLISHED)}; got {name!r}")
    import transformers

    class_name, overrides, source = PUBLISHED[name]
    return ModelDims.from_hf(getattr(transformers, class_name)(**overrides), name, source)


def checkpoint_dims(folder: pathlib.Path) -> ModelDims:
    """The dimensions in a checkpoint folder's ``config.json`` (read by transformers)."""
    if not (folder / "config.json").is_file():
        raise ValueError(f"checkpoint must be a folder with a config.json; got {str(folder)!r}")
    from transformers import AutoConfig

    return ModelDims.from_hf(AutoConfig.from_pretrained(folder), str(folder), f"{folder}/config.json")


@dataclass(frozen=True)
class ServingConfig:
    """The ``vllm serve`` settings that size the cache (names as the flags spell them)."""

    tensor_parallel_size: int = 1
    max_model_len: int = 4096
    max_num_seqs: int = 8
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    dtype: str = "bfloat16"
    kv_cache_dtype: str = "auto"
    prefill_buckets: tuple[int, ...] = ()
    hbm_per_core_gib: float = TRN2_HBM_PER_CORE_GIB
    quantization: str | None = None  # neuron_config.quantization: "fp8" keeps FP8 weights on the device

    _FLAGS = (
        "tensor-parallel-size", "max-model-len", "max-num-seqs", "gpu-memory-utilization",
        "num-gpu-blocks-override", "dtype", "kv-cache-dtype",
    )

    @classmethod
    def from_yaml(cls, settings: dict) -> "ServingConfig":
        """From the mapping of a ``vllm serve --config`` YAML (unknown keys are not sizing's business)."""
        values = {key.replace("-", "_"): settings[key] for key in cls._FLAGS if key in settings}
        if values.get("dtype") == "auto":
            values["dtype"] = "bfloat16"
        additional = settings.get("additional-config") or {}
        if isinstance(additional, str):
            additional = json.loads(additional)
        neuron_config = additional.get("neuron_config", {})
        buckets = neuron_config.get("num_batched_tokens_buckets")
        if buckets:
            values["prefill_buckets"] = tuple(buckets)
        if neuron_config.get("quantization") is not None:
            values["quantization"] = neuron_config["quantization"]
        return cls(**values)

    def check(self) -> None:
        """Refuse values no server could run with, naming the setting."""
        for flag in ("tensor_parallel_size", "max_model_len", "max_num_seqs"):
            if int(getattr(self, flag)) < 1:
                raise ValueError(f"{flag.replace('_', '-')} must be >= 1; got {getattr(self, flag)}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu-memory-utilization must be in (0, 1]; got {self.gpu_memory_utilization}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError(f"num-gpu-blocks-override must be >= 1; got {self.num_gpu_blocks_override}")
        for name, value in (("dtype", self.dtype), ("kv-cache-dtype", self.kv_cache_dtype)):
            if value not in _DTYPE_BYTES:
                raise ValueError(f"{name} must be one of {sorted(_DTYPE_BYTES)}; got {value!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"neuron_config.quantization must be one of {list(QUANTIZATIONS)}; got {self.quantization!r}")
        if self.prefill_buckets:
            buckets = list(self.prefill_buckets)
            if buckets != sorted(set(buckets)) or buckets[0] < 1:
                raise ValueError(f"num_batched_tokens_buckets must be strictly increasing positive ints; got {buckets}")
            if buckets[-1] > self.max_model_len:
                raise ValueError(
                    f"the largest num_batched_tokens_buckets entry must be <= max-model-len={self.max_model_len}; "
                    f"got {buckets[-1]}"
                )


def _check_heads(dims: ModelDims, tp: int) -> None:
    if dims.num_attention_heads % tp or (dims.num_key_value_heads % tp and tp % dims.num_key_value_heads):
        raise ValueError(
            f"tensor-parallel-size must divide num_attention_heads={dims.num_attention_heads} and divide or "
            f"be a multiple of num_key_value_heads={dims.num_key_value_heads}; got {tp}"
        )
    if dims.linear_num_key_heads % tp or dims.linear_num_value_heads % tp:
        raise ValueError(
            f"tensor-parallel-size must divide linear_num_key_heads={dims.linear_num_key_heads} and "
            f"linear_num_value_heads={dims.linear_num_value_heads}; got {tp}"
        )


def fp8_weights_per_core(dims: ModelDims, tp: int) -> tuple[float, float]:
    """``(weights, scales)`` one core holds in FP8 with ``neuron_config.quantization: "fp8"``: the
    elements of the projections a block-FP8 checkpoint quantizes, and their per-row scales."""
    h, d = dims.hidden_size, dims.head_dim
    kv_heads_per_core = max(1, dims.num_key_value_heads // tp)
    value_width = dims.linear_num_value_heads * dims.linear_value_head_dim
    split = kv = 0
    rows_split = rows_whole = 0.0  # column-parallel rows (split over the cores), row-parallel rows (whole)
    for index, kind in enumerate(dims.layer_types):
        if kind == "linear_attention":  # in_proj_qkv, in_proj_z | out_proj
            split += h * (dims.conv_channels + value_width) + value_width * h
            rows_split += dims.conv_channels + value_width
        else:  # q_proj (query and gate), o_proj | k_proj, v_proj (by key-value heads)
            split += 2 * dims.num_attention_heads * d * h + dims.num_attention_heads * d * h
            kv += 2 * dims.num_key_value_heads * d * h
            rows_split += 2 * dims.num_attention_heads * d
            rows_whole += 2 * kv_heads_per_core * d  # a core's k / v rows (replicated past one head)
        rows_whole += h  # out_proj / o_proj
        if dims.is_moe_layer(index):
            inner = dims.num_experts * dims.moe_intermediate_size + dims.shared_expert_intermediate_size
            split += 3 * h * inner
            rows_split += 2 * inner
            rows_whole += (dims.num_experts + 1) * h  # every expert's and the shared expert's down_proj
        else:
            split += 3 * h * dims.intermediate_size
            rows_split += 2 * dims.intermediate_size
            rows_whole += h
    weights = WeightCount(split=split, replicated=0, kv_projections=kv).per_core(dims, tp)
    return weights, rows_split / tp + rows_whole


# The Neuron shell's GDN page holds both states in one dtype (float32) per page-major view.
STATE_BYTES = STATE_DTYPE.itemsize
# Token alignment of an attention block: vllm-neuron's Qwen3.5 example measured 35B-A3B's
# page geometry as "block_size 32 -> 544", i.e. 32-token steps (the attention kernel's).
ATTENTION_BLOCK_ALIGNMENT = 32


@dataclass(frozen=True)
class Sizing:
    """Bytes per NeuronCore of one model under one serving configuration."""

    dims: ModelDims
    serving: ServingConfig
    weights_total: int
    weights_per_core: float
    kv_per_token: int     # one attention layer: K and V of one token on this core
    conv_state: int       # one GatedDeltaNet layer's conv state
    recurrent_state: int  # one GatedDeltaNet layer's recurrent state
    blocks: int = 0       # blocks in the pool (the null block included)

    @property
    def state_page(self) -> int:
        return self.conv_state + self.recurrent_state

    @property
    def attention_block_size(self) -> int:
        """Tokens per attention block: the aligned size whose KV page holds a state page."""
        if not self.dims.num_gdn_layers:
            return self.serving.max_model_len
        return hybrid_block_size(self.kv_per_token, self.state_page, ATTENTION_BLOCK_ALIGNMENT)

    @property
    def page(self) -> int:
        """One layer's page, attention and state alike (the state page padded to the KV page)."""
        return self.attention_block_size * self.kv_per_token

    @property
    def group_size(self) -> int:
        """Layers per cache group (vLLM: the smaller layer count, or the larger when they are close)."""
        counts = [n for n in (self.dims.num_attention_layers, self.dims.num_gdn_layers) if n]
        small, large = min(counts), max(counts)
        return large if large < 1.5 * small else small

    @property
    def attention_groups(self) -> int:
        return math.ceil(self.dims.num_attention_layers / self.group_size)

    @property
    def state_groups(self) -> int:
        return math.ceil(self.dims.num_gdn_layers / self.group_size)

    @property
    def num_groups(self) -> int:
        return self.attention_groups + self.state_groups

    @property
    def block(self) -> int:
        return self.group_size * self.page

    @property
    def blocks_per_sequence(self) -> int:
        """A full-length sequence: its attention blocks in every attention group, one block per state group."""
        attention = math.ceil(self.serving.max_model_len / self.attention_block_size)
        return self.attention_groups * attention + self.state_groups

    @property
    def blocks_for_max_num_seqs(self) -> int:
        """The ``num-gpu-blocks-override`` that holds ``max-num-seqs`` full-length sequences."""
        return self.serving.max_num_seqs * self.blocks_per_sequence

    @property
    def per_sequence_unpadded(self) -> int:
        kv = self.dims.num_attention_layers * self.serving.max_model_len * self.kv_per_token
        return kv + self.dims.num_gdn_layers * self.state_page

    @property
    def per_sequence(self) -> int:
        return self.blocks_per_sequence * self.block

    @property
    def sequences(self) -> int:
        """Full-length sequences the pool holds at once (the null block serves none)."""
        return max(0, self.blocks - 1) // self.blocks_per_sequence

    @property
    def cache(self) -> int:
        return (self.blocks + NUM_RESERVED_PAGES) * self.block

    @property
    def cache_upper(self) -> int:
        """The cache if every layer kept its own tensor of all the blocks (no sharing across groups)."""
        return self.cache * self.num_groups

    @property
    def hbm(self) -> float:
        return self.serving.hbm_per_core_gib * GiB

    @property
    def cap(self) -> float:
        return self.hbm * self.serving.gpu_memory_utilization

    @property
    def headroom(self) -> float:
        """HBM left on the core once weights and cache (upper bound) are placed."""
        return self.hbm - self.weights_per_core - self.cache_upper

    @property
    def fits(self) -> bool:
        return self.weights_per_core + self.cache_upper <= self.cap and self.sequences >= self.serving.max_num_seqs


def size(dims: ModelDims, serving: ServingConfig) -> Sizing:
    """The memory arithmetic of ``dims`` served with ``serving``.

    Raises:
        ValueError: naming the setting, when the heads do not split over the TP size or a
            serving value is out of range.
    """
    serving.check()
    tp = serving.tensor_parallel_size
    _check_heads(dims, tp)
    model_bytes = _DTYPE_BYTES[serving.dtype]
    kv_bytes = _DTYPE_BYTES[serving.kv_cache_dtype] or model_bytes
    weights = count_weights(dims)
    weights_per_core = weights.per_core(dims, tp) * model_bytes
    if serving.quantization == FP8_ON_DEVICE:
        fp8, scales = fp8_weights_per_core(dims, tp)
        weights_per_core += fp8 * (FP8_WEIGHT_BYTES - model_bytes) + scales * FP8_SCALE_BYTES
    sizing = Sizing(
        dims=dims,
        serving=serving,
        weights_total=weights.total * model_bytes,
        weights_per_core=weights_per_core,
        kv_per_token=2 * max(1, dims.num_key_value_heads // tp) * dims.head_dim * kv_bytes,
        conv_state=dims.conv_channels // tp * dims.linear_conv_kernel_dim * STATE_BYTES,
        recurrent_state=dims.linear_num_value_heads // tp * dims.linear_key_head_dim * dims.linear_value_head_dim
        * STATE_BYTES,
    )
    if serving.num_gpu_blocks_override is not None:
        blocks = serving.num_gpu_blocks_override + 1
    else:
        blocks = max(0, math.floor((sizing.cap - sizing.weights_per_core) / sizing.block))
    return replace(sizing, blocks=blocks)


def _gib(value: float) -> str:
    return f"{value / GiB:.2f} GiB" if abs(value) >= 0.01 * GiB or value == 0 else _mib(value)


def _mib(value: float) -> str:
    return f"{value / MiB:.2f} MiB" if abs(value) >= 0.01 * MiB or value == 0 else f"{value / KiB:.1f} KiB"


def _smallest_fitting_tp(sizing: Sizing) -> Sizing | None:
    """The sizing at the smallest larger tensor-parallel size the heads allow whose weights fit the cap."""
    for tp in range(sizing.serving.tensor_parallel_size + 1, 65):
        try:
            wider = size(sizing.dims, replace(sizing.serving, tensor_parallel_size=tp))
        except ValueError:
            continue
        if wider.weights_per_core < wider.cap:
            return wider
    return None


def verdict(sizing: Sizing) -> str:
    """``fits``, or ``DOES NOT FIT:`` and the first cause: weights over the cap, too few blocks, the cache."""
    s = sizing.serving
    if sizing.weights_per_core >= sizing.cap:
        wider = _smallest_fitting_tp(sizing)
        remedy = (f"; tensor-parallel-size {wider.serving.tensor_parallel_size} gives "
                  f"{_gib(wider.weights_per_core)} of weights per core" if wider else
                  "; no tensor-parallel size up to 64 that the heads allow brings them under it")
        return (f"DOES NOT FIT: the weights alone take {_gib(sizing.weights_per_core)} per core at "
                f"tensor-parallel-size {s.tensor_parallel_size}, over the memory cap of {_gib(sizing.cap)}{remedy}")
    if sizing.sequences < s.max_num_seqs:
        if s.num_gpu_blocks_override is not None:
            cause = f"set num-gpu-blocks-override to {sizing.blocks_for_max_num_seqs}"
        else:
            cause = (f"the {_gib(sizing.cap - sizing.weights_per_core)} the cap leaves after the weights holds "
                     f"{sizing.blocks} blocks of {_mib(sizing.block)}; {s.max_num_seqs} sequences need "
                     f"{sizing.blocks_for_max_num_seqs}")
        held = f"{sizing.sequences} sequence{'' if sizing.sequences == 1 else 's'}"
        return f"DOES NOT FIT: the blocks hold {held}, max-num-seqs is {s.max_num_seqs} ({cause})"
    if not sizing.fits:
        return (f"DOES NOT FIT: weights + cache (upper bound) exceed the memory cap by "
                f"{_gib(sizing.weights_per_core + sizing.cache_upper - sizing.cap)}")
    return "fits"


def report(sizing: Sizing) -> str:
    """The arithmetic of :func:`size`, one line per figure, formula beside value."""
    d, s = sizing.dims, sizing.serving
    tp = s.tensor_parallel_size
    kv_heads = max(1, d.num_key_value_heads // tp)
    model_bytes = _DTYPE_BYTES[s.dtype]
    moe = (
        f", {d.num_experts} experts of {d.moe_intermediate_size} + shared {d.shared_expert_intermediate_size}"
        if d.num_experts else ""
    )
    ffn = f", FFN {d.intermediate_size}" if d.intermediate_size else ""
    if s.num_gpu_blocks_override is not None:
        blocks = f"num-gpu-blocks-override {s.num_gpu_blocks_override} + 1 null block"
    else:
        blocks = f"no num-gpu-blocks-override: the planner fills ({_gib(sizing.cap)} - weights) / block"
    if s.hbm_per_core_gib == TRN2_HBM_PER_CORE_GIB:
        hbm = (f"{TRN2_HBM_PER_CHIP_GIB} GiB per trn2 chip x LNC {TRN2_DEFAULT_LNC} / "
               f"{TRN2_PHYSICAL_CORES_PER_CHIP} physical cores = {_gib(sizing.hbm)}")
    else:
        hbm = f"{_gib(sizing.hbm)} (given)"
    attention_blocks = math.ceil(s.max_model_len / sizing.attention_block_size)
    lines = [
        f"{d.name}",
        f"  dims from: {d.source}",
        f"  {len(d.layer_types)} layers ({d.num_gdn_layers} GatedDeltaNet + {d.num_attention_layers} attention), "
        f"hidden {d.hidden_size}, vocab {d.vocab_size}{ffn}{moe}, "
        f"{'tied' if d.tie_word_embeddings else 'untied'} lm_head",
        f"  attention {d.num_attention_heads} Q / {d.num_key_value_heads} KV heads of {d.head_dim}; GatedDeltaNet "
        f"{d.linear_num_key_heads} QK / {d.linear_num_value_heads} V heads of "
        f"{d.linear_key_head_dim}/{d.linear_value_head_dim}, conv {d.linear_conv_kernel_dim}",
        f"  serving: tensor-parallel-size {tp}, max-model-len {s.max_model_len}, max-num-seqs {s.max_num_seqs}, "
        f"gpu-memory-utilization {s.gpu_memory_utilization}, {s.dtype}"
        + (" (FP8 weights on the device)" if s.quantization == FP8_ON_DEVICE else "")
        + (f", prefill buckets {list(s.prefill_buckets)}" if s.prefill_buckets else ""),
        f"  HBM per NeuronCore          = {hbm}",
        f"  weights                     = {sizing.weights_total // model_bytes:,} parameters x {model_bytes} B"
        f" = {_gib(sizing.weights_total)}",
        f"  weights per core            = split / {tp} + replicated (norms, routers, KV heads past one per core)"
        + (f", FP8 projections at {FP8_WEIGHT_BYTES} B + {FP8_SCALE_BYTES} B a row"
           if s.quantization == FP8_ON_DEVICE else "")
        + f" = {_gib(sizing.weights_per_core)}",
        f"  KV per token (1 layer)      = 2 (K, V) x {kv_heads} KV heads x {d.head_dim} x "
        f"{sizing.kv_per_token // (2 * kv_heads * d.head_dim)} B = {sizing.kv_per_token / KiB:.1f} KiB",
        f"  GDN conv state (1 layer)    = {d.conv_channels // tp} channels x {d.linear_conv_kernel_dim} x "
        f"{STATE_BYTES} B = {_mib(sizing.conv_state)}",
        f"  GDN recurrent (1 layer)     = {d.linear_num_value_heads // tp} heads x {d.linear_key_head_dim} x "
        f"{d.linear_value_head_dim} x {STATE_BYTES} B = {_mib(sizing.recurrent_state)}",
        f"  attention block             = {ATTENTION_BLOCK_ALIGNMENT} x ceil(state page / ({ATTENTION_BLOCK_ALIGNMENT}"
        f" x KV per token)) = {sizing.attention_block_size} tokens",
        f"  page (every layer)          = {sizing.attention_block_size} tokens x KV per token = {_mib(sizing.page)}"
        f" (state page {_mib(sizing.state_page)} padded)",
        f"  block                       = {sizing.group_size} layers x page = {_mib(sizing.block)}"
        f" ({sizing.attention_groups} attention + {sizing.state_groups} state groups)",
        f"  per sequence, unpadded      = {d.num_attention_layers} x {s.max_model_len} x KV per token + "
        f"{d.num_gdn_layers} x state page = {_mib(sizing.per_sequence_unpadded)}",
        f"  per sequence                = {sizing.attention_groups} x {attention_blocks} attention + "
        f"{sizing.state_groups} state blocks = {sizing.blocks_per_sequence} blocks = {_mib(sizing.per_sequence)}",
        f"  blocks                      = {sizing.blocks} ({blocks}) -> {sizing.sequences} full-length sequences;"
        f" {s.max_num_seqs} need num-gpu-blocks-override {sizing.blocks_for_max_num_seqs}",
        f"  cache per core              = ({sizing.blocks} + {NUM_RESERVED_PAGES} reserved pages) x {_mib(sizing.block)}"
        f" = {_gib(sizing.cache)} (one pool shared by the groups)",
        f"  cache per core, upper bound = {sizing.num_groups} groups x {_gib(sizing.cache)}"
        f" = {_gib(sizing.cache_upper)} (every layer its own tensor)",
        f"  memory cap                  = {_gib(sizing.hbm)} x {s.gpu_memory_utilization} = {_gib(sizing.cap)}",
        f"  weights + cache (upper)     = {_gib(sizing.weights_per_core + sizing.cache_upper)}"
        f" ({'under' if sizing.weights_per_core + sizing.cache_upper <= sizing.cap else 'OVER'} the cap)",
        f"  headroom per core           = HBM - weights - cache (upper) = {_gib(sizing.headroom)}"
        " (activations, compiler scratch: not modelled)" if sizing.headroom >= 0 else
        f"  headroom per core           = none: weights + cache (upper) exceed the HBM by {_gib(-sizing.headroom)}",
        f"  {verdict(sizing)}",
    ]
    return "\n".join(lines)


def load_yaml(path: pathlib.Path) -> dict:
    import yaml

    settings = yaml.safe_load(path.read_text())
    if not isinstance(settings, dict):
        raise ValueError(f"config must be a YAML mapping of vllm serve flags; got {type(settings).__name__} in {path}")
    return settings


def resolve(target: str, config: pathlib.Path | None, overrides: dict) -> Sizing:
    """Size ``target`` (a YAML, a checkpoint folder or a published name) with optional settings."""
    settings: dict = {}
    path = pathlib.Path(target)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ValueError(f"config must be an existing YAML file; got {target!r}")
        settings = load_yaml(path)
        if "model" not in settings:
            raise ValueError(f"{target} has no 'model'; size it as: sizing CHECKPOINT --config {target}")
        target = str(settings["model"])
        path = pathlib.Path(target)
    if config is not None:
        settings = {**settings, **load_yaml(config)}
    serving = ServingConfig.from_yaml(settings)
    serving = replace(serving, **{key: value for key, value in overrides.items() if value is not None})
    dims = checkpoint_dims(path) if path.is_dir() else published_dims(target)
    return size(dims, serving)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_gdn_neuron.sizing", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a vllm serve --config YAML, a checkpoint folder, or a published checkpoint name")
    parser.add_argument("--config", type=pathlib.Path, help="serving settings for a checkpoint (a vllm serve --config YAML)")
    parser.add_argument("--tensor-parallel-size", type=int)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--num-gpu-blocks-override", type=int)
    parser.add_argument("--hbm-per-core-gib", type=float, help=f"default {TRN2_HBM_PER_CORE_GIB} (trn2, LNC=2)")
    args = parser.parse_args(argv)
    overrides = {key: value for key, value in vars(args).items() if key not in ("target", "config")}
    try:
        sizing = resolve(args.target, args.config, overrides)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(report(sizing))
    return 0 if sizing.fits else 1


if __name__ == "__main__":
    sys.exit(main())
