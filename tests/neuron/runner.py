"""A CPU stand-in for vllm-neuron's model runner, built from that runner's own code paths.

Read (facts only, no code copied): whn09/vllm-neuron @
``7ea992789fa624ea6b0d7ad4cb0789e784863904`` (the fork's base is vllm-neuron
``release-0.24.0.1.1.0``; upstream proposes the same recurrent-cache path in
https://github.com/vllm-project/vllm-neuron/pull/54), ``vllm_neuron/vllm/worker/neuron_model_runner.py``:

- ``__init__``: ``NeuronConfig.from_dict(additional_config["neuron_config"])``; a
  ``vision_neuron_config`` in ``additional_config`` switches ``load_model`` to the multimodal
  ``from_configs`` form; async scheduling without on-device sampling raises.
- ``load_model``: ``from_configs`` under ``torch.device("meta")``,
  ``load_weights(model_path, device, download_dir)`` on the meta model, ``.to(device)``,
  ``torch._dynamo.config.cache_size_limit = 2 ** 62``, then
  ``torch.compile(model, backend=..., fullgraph=True, options=...)``: no ``dynamic=``.
- ``get_kv_cache_spec`` / ``initialize_kv_cache``: :mod:`runner_cache`.
- ``_prepare_model_input_impl``, ``_create_padded_inputs``, ``_compute_slot_mapping_cpu``,
  ``_apply_decode_slot_mapping_padding``, ``_pad_to_compiled_shapes``,
  ``_save_block_table_to_device`` / ``_remap_null_block_to_sentinel``,
  ``_build_attention_metadata``: input ids int32; prefill padding ids 0 at the last real
  position; decode padding ids and positions 0, sampling positions padded with the last
  real one; slot ``block_table[row, pos // bs] * bs + pos % bs`` per cache group, padding
  slots ``NULL_BLOCK_ID = 0``; the block table the model sees has vLLM's null block 0
  replaced by ``-1``, and rows past the step's requests keep what earlier requests left.
- ``_execute_model_forward``: the keywords below; ``rotary_position_ids`` only for an M-RoPE
  config, ``inputs_embeds`` / ``is_token_ids`` only with prompt embeds enabled. With
  on-device sampling (``neuron_config.on_device_sampling_config`` not None: the default when
  the key is absent, ``NeuronConfig.from_dict``) ``sampling_params`` is
  ``build_sampling_params_tensor`` of the batch's sampling metadata (float32 ``[num_reqs, 3]``
  ``[top_k, top_p, temperature]``, absent columns ``-1`` / ``1`` / ``0``) zero-padded to the
  block-table rows, and the model returns ``(token_ids, logits or None)``; without it
  ``sampling_params`` is None and the model returns logits (sampled on the host: argmax
  here). ``__init__`` sets ``neuron_config.max_logprobs`` to the engine's ``max_logprobs``
  unless given.
- ``warmup_prefill`` / ``warmup_decode`` and their ``_build_*_synthetic_inputs`` /
  ``_build_warmup_attention_metadata``: ids ``arange(1, n + 1)`` (prefill) or ones (decode),
  positions ``arange(n)`` or ``context_len - 1 = 255``, block tables ``arange(W)`` per row,
  slot mappings ``arange(T)``, a dummy ``sampling_params`` tensor, ``W`` rounded up to a
  multiple of ``128 // block_size``. After warm-up the worker runs under
  ``torch.compiler.set_stance("fail_on_recompile")`` (stated in the runner; the worker file
  itself was not in the stored snapshot).
- multimodal engines (:mod:`runner_vision`): the encoder cache, ``model.visual`` compiled
  beside the model and warmed up per vision bucket, the step's images encoded by the model's
  ``embed_multimodal``, the vision keywords of prefill steps and warm-up, and the M-RoPE
  positions from the model's ``get_mrope_input_positions``.

Prefill steps, read at the same pin: ``_prepare_model_input_impl`` takes the scheduler's
``num_scheduled_tokens`` and ``num_scheduled_tokens_padded`` per request and lays the
requests out in batch-row order, each followed by its own padding (``_create_padded_inputs``:
ids 0, positions repeating its last one; ``slot_mapping`` of padding ``NULL_BLOCK_ID``);
``sampling_positions`` is each request's last real token; ``block_table_tensor`` has one row
per request of the batch; ``max_query_len`` is the largest padded count and the step decodes
when it is at most ``decode_token_threshold`` (``1 + num_speculative_tokens``); no
``query_start_loc`` or ``seq_lens`` is passed, and ``cached_seq_len`` is the batch's largest
computed count ("Neuron currently only supports a prefill batch size of 1",
``_compute_cached_seq_len``). Prefill warm-up traces one request (block table ``[1, W]``,
``sampling_positions [1]``), so a prefill step of any other row count would recompile. The
scheduler (that file is not in the pin's stored snapshot; read in the same release line,
AWShtokoyo/vllm-neuron @ ``8e6b66ac`` ``vllm_neuron/vllm/core/scheduler.py``, and two other
forks of it): ``max_prefills_per_batch = 1``, ``can_schedule`` admits no new prompt while a
prefill (or a chunk of one) is running, prefill and decode requests never share a step
(``_apply_padding_and_log_stats`` raises on a mixed batch), each prefill request is padded to
the smallest bucket that holds it. So **the pinned runner sends one prompt (or one chunk of
one) per prefill step.**

The stand-in serves that way by default (``prefill_rows=1``). With ``prefill_rows=R > 1`` it
packs up to R requests into one prefill bucket: a continuing chunk first, then new prompts,
end to end in batch-row order, the bucket's padding after the last one (what the runner's
input preparation makes of ``num_scheduled_tokens_padded`` equal to the real count for all
but the last request, which takes the padding), a block table of R rows (rows past the step's
requests stale), ``sampling_positions [R]`` padded with the last real one, and a warm-up of
R rows; the step is checked on the host by ``vllm_gdn_neuron.shells.neuron.packing.check_prefill_rows``
before the compiled forward. Its ``max_query_len`` is the bucket's token count, as the warm-up
passes it: the runner's own rule (the largest padded count) gives the bucket only when one
request takes the whole bucket, and Dynamo guards on that int, so a runner packing prompts
must pass the bucket there or recompile per composition (measured here: the second packed
step recompiled under ``fail_on_recompile``). Decode steps are as the runner builds them. Requests not
scheduled in a step leave the persistent batch (vLLM's ``InputBatch``) and come back at the
lowest free row (:func:`serve`).

Speculative decoding (``EngineSettings.speculative_config``, read at the same pin; the whole
contract in ``docs/neuron-mtp.md``): warm-up traces per decode bucket the verify graph
(``_build_decode_synthetic_inputs(spec_decode_enabled=True)``: ``rows * (1 + N)`` tokens,
``decode_token_threshold = max_query_len = 1 + N``, ``_create_warmup_spec_decode_metadata``)
before the one-token graph; every decode step is then a verify step
(:meth:`NeuronRunnerStandIn.verify`). The pinned runner's ``__init__`` refuses any method but
eagle3 and builds no MTP drafter; the stand-in takes the drafts from a host ``drafter``
callable instead (the tests: the reference MTP head), and skips that refusal.

The compile backend is a parameter (``backend=``): by default :class:`GraphRecorder`
(``aot_eager``, keeping every graph); any callable ``(gm, example_inputs, options=None)``.
"""

import dataclasses
import math

import numpy as np
import torch
from torch._dynamo.backends.common import aot_autograd

from vllm_gdn_neuron.shells.neuron.kv_spec import STAND_INS
from vllm_gdn_neuron.shells.neuron.packing import check_prefill_rows

from . import runner_cache
from . import runner_vision

NULL_BLOCK_ID = 0
PAD_SLOT_ID = -1
WARMUP_CONTEXT_LEN = 256
# torch.compile options the runner passes (the Neuron backend's; a CPU backend ignores them).
COMPILE_OPTIONS = {"alias_meta_to_neuron": True, "compiler_args": ["--auto-cast=none"]}


class OnDeviceSamplingConfigStandIn:
    """``OnDeviceSamplingConfig(**kwargs)``: its fields and defaults."""

    DEFAULTS = dict(all_greedy=False, max_top_k=256, deterministic=False, sampling_dp_degree=1, capture_topk=False)

    def __init__(self, **fields) -> None:
        for key, value in {**self.DEFAULTS, **fields}.items():
            setattr(self, key, value)


class NeuronConfigStandIn:
    """``NeuronConfig.from_dict``: every key of ``additional_config["neuron_config"]`` as an
    attribute, over defaults for the fields the runner and the shell read.

    ``on_device_sampling_config``: a dict becomes an :class:`OnDeviceSamplingConfigStandIn`,
    None stays None (host sampling), and an absent key means the default config (on).
    """

    DEFAULTS = dict(quantization=None, num_batched_tokens_buckets=None, max_logprobs=0, debug_logits_dir=None,
                    num_seqs_buckets=None, enable_structured_outputs=False, hlo2tensorizer_options=None,
                    kv_segment_size_buckets=None, decode_context_length_buckets=None, lm_head_dp_size=1)

    def __init__(self, values: dict | None = None, **fields) -> None:
        given = {**(values or {}), **fields}
        sampling = given.pop("on_device_sampling_config", OnDeviceSamplingConfigStandIn())
        for key, value in {**self.DEFAULTS, **given}.items():
            setattr(self, key, value)
        self.on_device_sampling_config = (OnDeviceSamplingConfigStandIn(**sampling) if isinstance(sampling, dict)
                                          else sampling)


class GraphRecorder:
    """A ``torch.compile`` backend: ``aot_eager`` that keeps every Dynamo and ATen graph it compiles."""

    def __init__(self) -> None:
        self.dynamo_graphs = []
        self.aten_graphs = []
        self._aot = aot_autograd(fw_compiler=self._keep)

    def _keep(self, gm, example_inputs):
        self.aten_graphs.append(gm)
        return gm

    def __call__(self, gm, example_inputs, options=None):
        self.dynamo_graphs.append(gm)
        return self._aot(gm, example_inputs)


# ATen ops that read device values back to the host, or whose output shape depends on them.
HOST_READ_OPS = frozenset({"_local_scalar_dense", "item", "nonzero", "nonzero_static", "unique", "_unique",
                           "_unique2", "unique_consecutive", "unique_dim", "masked_select", "argwhere"})
# Tensor methods of a Dynamo graph that leave the device.
HOST_READ_METHODS = frozenset({"item", "tolist", "cpu", "numpy", "nonzero", "unique"})


def _device_of(node):
    value = node.meta.get("val", node.meta.get("example_value")) if isinstance(node, torch.fx.Node) else None
    return getattr(value, "device", None)


def host_reads(graph_module) -> list[str]:
    """Nodes of a Dynamo or ATen graph that read device data on the host, or copy a tensor to another
    device (a dtype cast that names its own device, as decompositions write them, is no copy)."""
    found = []
    for node in graph_module.graph.nodes:
        if node.op == "call_method" and node.target in HOST_READ_METHODS:
            found.append(f"Tensor.{node.target}")
        if node.op != "call_function":
            continue
        overload = getattr(node.target, "_overloadpacket", None)
        op = getattr(overload, "__name__", str(node.target))
        if op in HOST_READ_OPS:
            found.append(op)
        if op in ("_to_copy", "copy", "to") and "device" in node.kwargs and node.args \
                and torch.device(node.kwargs["device"]) != _device_of(node.args[0]):
            found.append(f"{op}(device={node.kwargs['device']})")
    return found


def symbolic_graphs(recorder: GraphRecorder) -> int:
    """Dynamo graphs with a symbolic (dynamic) size among their inputs."""
    count = 0
    for gm in recorder.dynamo_graphs:
        for node in gm.graph.nodes:
            value = node.meta.get("example_value")
            if node.op == "placeholder" and isinstance(value, (torch.SymInt, torch.Tensor)) and (
                    isinstance(value, torch.SymInt) or any(isinstance(s, torch.SymInt) for s in value.shape)):
                count += 1
                break
    return count


@dataclasses.dataclass
class EngineSettings:
    """The vLLM engine arguments the runner reads (names as ``vllm serve`` spells them, with ``_``)."""

    model: str
    dtype: str = "float32"
    max_model_len: int = 512
    max_num_seqs: int = 4
    block_size: int | None = None
    num_gpu_blocks_override: int = 64
    async_scheduling: bool = False
    max_logprobs: int = 20  # vLLM's ModelConfig default
    enable_prompt_embeds: bool = False
    uses_mrope: bool = False
    # vLLM's multimodal registry verdict for the model (``supports_multimodal_inputs``).
    multimodal: bool = False
    # ``--hf-overrides '{"architectures": [...]}'`` (None: the checkpoint's own).
    architectures: list | None = None
    download_dir: str | None = None
    additional_config: dict = dataclasses.field(default_factory=dict)
    # ``--speculative-config`` (``{"method": "mtp", "num_speculative_tokens": N}``) or None.
    speculative_config: dict | None = None


@dataclasses.dataclass
class Sampling:
    """The ``SamplingParams`` fields the runner's sampling tensor carries (default: greedy)."""

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0


SAMPLING_EPS = 1e-5  # vLLM: a temperature below it makes a request greedy


def sampling_params_tensor(samplings: list[Sampling], rows: int, vocab_size: int) -> torch.Tensor:
    """``build_sampling_params_tensor`` of vLLM's ``InputBatch`` metadata for ``samplings``, padded to ``rows``.

    InputBatch keeps temperature 0 for a greedy request and top_k ``vocab_size`` for one without
    top-k, and drops a column (None) when no request uses it; the runner fills a dropped column
    with top_k -1, top_p 1, temperature 0 and pads with zero rows.
    """
    top_k = [s.top_k if 0 < s.top_k < vocab_size else vocab_size for s in samplings]
    temperature = [0.0 if s.temperature < SAMPLING_EPS else s.temperature for s in samplings]
    columns = [
        [-1.0] * len(samplings) if all(k == vocab_size for k in top_k) else [float(k) for k in top_k],
        [1.0] * len(samplings) if all(s.top_p >= 1 for s in samplings) else [s.top_p for s in samplings],
        temperature if any(temperature) else [0.0] * len(samplings),
    ]
    params = torch.stack([torch.tensor(column, dtype=torch.float32) for column in columns], dim=1)
    return torch.nn.functional.pad(params, (0, 0, 0, rows - len(samplings)), value=0) if rows > len(samplings) \
        else params


@dataclasses.dataclass(eq=False)
class Request:
    prompt: list[int]
    max_new_tokens: int
    sampling: Sampling = dataclasses.field(default_factory=Sampling)
    output: list[int] = dataclasses.field(default_factory=list)
    computed: int = 0  # tokens whose K/V and state are in the cache
    blocks: dict = dataclasses.field(default_factory=dict)  # group index -> block ids
    mm_features: list = dataclasses.field(default_factory=list)  # runner_vision.ImageFeature
    mrope: tuple | None = None  # ([3, len(prompt)] positions, delta), set when first scheduled

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens


def meta_model(model_cls, hf_config, neuron_config, vision_neuron_config=None):
    """``load_model``'s construction: ``from_configs`` under ``torch.device("meta")``, in the
    multimodal form (``text_neuron_config=``, ``vision_neuron_config=``) where a vision config is given."""
    with torch.device("meta"):
        if vision_neuron_config is not None:
            return model_cls.from_configs(hf_config=hf_config, text_neuron_config=neuron_config,
                                          vision_neuron_config=vision_neuron_config)
        return model_cls.from_configs(hf_config, neuron_config)


def block_table_width(max_model_len: int, block_size: int) -> int:
    """Columns of a group's block table: ``cdiv(max_model_len, block_size)`` rounded up to a
    multiple of ``128 // block_size`` (the runner's warm-up matches InputBatch's alignment)."""
    width = math.ceil(max_model_len / block_size)
    alignment = 128 // block_size if block_size <= 128 else 1
    return math.ceil(width / alignment) * alignment


class NeuronRunnerStandIn:
    """The runner's start-up (``__init__``, :meth:`load_model`, :meth:`initialize_kv_cache`,
    :meth:`warm_up`) and its steps (:meth:`prefill`, :meth:`decode`) on CPU.

    Args:
        model_cls: the class vLLM's registry resolves (its ``from_configs`` builds the model).
        settings: the engine settings.
        backend: the compile backend (default: a fresh :class:`GraphRecorder`).
        compile: compile (the runner always does); False runs eagerly, for debugging.
        prefill_rows: requests one prefill step holds (its block-table rows): 1 as the pinned
            runner schedules; more packs prompts into one bucket (at most ``max_num_seqs``).
        vision_backend: the backend of ``model.visual`` (default: ``backend``, as the runner
            compiles both with one).
        drafter: with a ``speculative_config``, the host function (token ids -> N draft ids)
            that stands in for the runner's drafter model.
    """

    def __init__(self, model_cls, settings: EngineSettings, *, backend=None, compile: bool = True,
                 prefill_rows: int = 1, vision_backend=None, drafter=None) -> None:
        if not 1 <= prefill_rows <= settings.max_num_seqs:
            raise ValueError(f"prefill_rows: expected 1 .. max_num_seqs = {settings.max_num_seqs}, got {prefill_rows}")
        self.prefill_rows = prefill_rows
        self.settings = settings
        neuron_config = dict(settings.additional_config.get("neuron_config", {}))
        neuron_config.setdefault("max_logprobs", settings.max_logprobs)
        self.neuron_config = NeuronConfigStandIn(neuron_config)
        self.on_device_sampling = self.neuron_config.on_device_sampling_config is not None
        self.outputs = []  # (what the forward returned, the rows' Sampling) per step after warm-up
        vision = settings.additional_config.get("vision_neuron_config")
        self.vision_neuron_config = None
        if vision is not None:
            self.vision_neuron_config = runner_vision.VisionNeuronConfigStandIn.from_dict(dict(vision))
            self.vision_neuron_config.resolve_tp_dp(1)
        if settings.async_scheduling and not self.on_device_sampling:
            raise RuntimeError("On-device sampling must be enabled for async execution")
        if not self.neuron_config.num_batched_tokens_buckets or not self.neuron_config.num_seqs_buckets:
            raise ValueError("the harness needs num_batched_tokens_buckets and num_seqs_buckets in neuron_config")
        self.prefill_buckets = sorted(self.neuron_config.num_batched_tokens_buckets)
        self.decode_buckets = sorted(self.neuron_config.num_seqs_buckets)
        self.model_cls = model_cls
        speculative = settings.speculative_config or {}
        self.num_speculative_tokens = int(speculative.get("num_speculative_tokens", 0))
        if self.num_speculative_tokens and drafter is None:
            raise ValueError("speculative_config: the harness needs a drafter (token ids -> N draft ids)")
        self.drafter = drafter
        self.recorder = backend if backend is not None else GraphRecorder()
        self.vision_recorder = vision_backend if vision_backend is not None else self.recorder
        self.compile = compile
        self.rank_tensor = torch.tensor(0, dtype=torch.int32)

    # --- load_model ---------------------------------------------------------------------------

    def load_model(self, tp_rank: int = 0) -> None:
        import transformers

        hf_config = transformers.AutoConfig.from_pretrained(self.settings.model)
        if self.settings.architectures is not None:
            hf_config.architectures = list(self.settings.architectures)
        text = getattr(hf_config, "text_config", None) or hf_config
        text.dtype = getattr(torch, self.settings.dtype)
        self.model_dtype = text.dtype
        self.rank_tensor = torch.tensor(tp_rank, dtype=torch.int32)
        model = meta_model(self.model_cls, hf_config, self.neuron_config, self.vision_neuron_config)
        model.load_weights(self.settings.model, torch.device("cpu"), self.settings.download_dir)
        self.model = model.to(torch.device("cpu"))
        torch._dynamo.reset()  # a fresh compile cache, as in a new worker process
        torch._dynamo.config.cache_size_limit = 2**62
        self.forward = (torch.compile(self.model, backend=self.recorder, fullgraph=True, options=COMPILE_OPTIONS)
                        if self.compile else self.model)
        if self.compile and hasattr(self.model, "visual"):  # the vision tower: graphs of its own
            self.model.visual = torch.compile(self.model.visual, backend=self.vision_recorder, fullgraph=True,
                                              options=COMPILE_OPTIONS)
        if self.settings.multimodal:
            self.encoder_cache, self.max_vision_blocks = runner_vision.build_encoder_cache(
                self.vision_neuron_config, hf_config, self.prefill_buckets[-1])

    # --- cache --------------------------------------------------------------------------------

    def get_kv_cache_spec(self) -> dict:
        kv_spec = self.model.get_kv_spec()
        self.block_size, padded = runner_cache.align_hybrid_pages(kv_spec, self.settings.block_size, self.model_dtype)
        self.mamba_block_size = self.settings.max_model_len
        return runner_cache.cache_specs(kv_spec, self.block_size, self.mamba_block_size, padded, self.model_dtype)

    def initialize_kv_cache(self, specs: dict) -> None:
        num_blocks = self.settings.num_gpu_blocks_override + 1  # vLLM adds the null block
        self.groups, self.cache_tensors = runner_cache.plan_groups(specs, num_blocks)
        self.caches = runner_cache.initialize_kv_cache(self.model, self.groups, self.cache_tensors)
        self.free_blocks = list(range(1, num_blocks))
        self.widths = [block_table_width(self.settings.max_model_len, g.spec.block_size) for g in self.groups]
        # The persistent batch: one block-table row per slot, kept across steps (stale rows included).
        self.tables = [np.zeros((self.settings.max_num_seqs, w), dtype=np.int32) for w in self.widths]
        self.batch: list[Request] = []

    def start(self) -> None:
        """``load_model`` -> ``get_kv_cache_spec`` -> ``initialize_kv_cache`` -> warm-up of every bucket."""
        self.load_model()
        self.initialize_kv_cache(self.get_kv_cache_spec())
        self.warm_up()

    # --- warm-up ------------------------------------------------------------------------------

    def _warmup_metadata(self, num_tokens: int, num_reqs: int, max_query_len: int,
                         decode_token_threshold: int = 1) -> dict:
        metadata = {}
        for group, width in zip(self.groups, self.widths):
            full = math.ceil(self.settings.max_model_len / group.spec.block_size)
            entry = dict(
                block_table_tensor=torch.arange(width, dtype=torch.int32)[None].expand(num_reqs, -1).contiguous(),
                slot_mapping=torch.arange(num_tokens, dtype=torch.int64),
                max_query_len=max_query_len, block_size=group.spec.block_size, max_blocks_per_seq=width,
                decode_token_threshold=decode_token_threshold, cached_seq_len=torch.tensor([[0]], dtype=torch.int32),
                kv_segment_size=0,
                full_block_table_tensor=torch.arange(full, dtype=torch.int32)[None].expand(num_reqs, -1).contiguous(),
            )
            for name in group.layer_names:
                metadata[name] = entry
        return metadata

    def warm_up(self) -> None:
        """Every prefill bucket (``prefill_rows`` requests), then every decode bucket, on the runner's
        synthetic inputs; with speculative decoding each decode bucket's verify graph first, then
        its one-token graph (``warmup_decode``: the runner falls back to it where no drafts come)."""
        rows = self.prefill_rows
        for bucket in self.prefill_buckets:
            positions = torch.arange(bucket, dtype=torch.int64)
            vision = (runner_vision.warmup_vision_inputs(self.encoder_cache, self.max_vision_blocks, bucket)
                      if self.settings.multimodal else {})
            self._call(torch.arange(1, bucket + 1, dtype=torch.int32), positions,
                       self._warmup_metadata(bucket, rows, bucket), torch.tensor([bucket - 1] * rows),
                       torch.tensor([[0, 1.0, 1.0]] * rows), **vision)
        for bucket in self.decode_buckets:
            if self.num_speculative_tokens:
                self._warm_up_verify(bucket)
            positions = torch.full((bucket,), WARMUP_CONTEXT_LEN - 1, dtype=torch.int64)
            self._call(torch.ones(bucket, dtype=torch.int32), positions, self._warmup_metadata(bucket, bucket, 1),
                       torch.arange(bucket), torch.tensor([[0, 1.0, 1.0]] * bucket))
        if self.settings.multimodal and hasattr(self.model, "build_vision_synthetic_inputs"):
            runner_vision.warm_up_vision_tower(self.model, self.vision_neuron_config, self.encoder_cache)

    def _warm_up_verify(self, rows: int) -> None:
        """``_build_decode_synthetic_inputs(spec_decode_enabled=True)``: ``rows * (1 + N)`` ones at
        position 255, every token's logits, the dummy sampling row replicated per token, and
        ``_create_warmup_spec_decode_metadata`` (drafts all ones)."""
        width = 1 + self.num_speculative_tokens
        tokens = rows * width
        spec = spec_decode_metadata([[1] * self.num_speculative_tokens] * rows, rows, self.num_speculative_tokens)
        self._call(torch.ones(tokens, dtype=torch.int32),
                   torch.full((tokens,), WARMUP_CONTEXT_LEN - 1, dtype=torch.int64),
                   self._warmup_metadata(tokens, rows, width, decode_token_threshold=width), torch.arange(tokens),
                   torch.tensor([[0, 1.0, 1.0]] * rows).repeat_interleave(width, 0), spec_decode_metadata=spec)

    def _call(self, input_ids, positions, metadata, sampling_positions, sampling_params=None, rotary=None,
              spec_decode_metadata=None, **vision):
        """One forward with the runner's keywords (``rotary``: the step's ``[3, T]`` M-RoPE positions;
        warm-up: ``positions`` on all three axes; ``vision``: the prefill vision keywords)."""
        kwargs = dict(input_ids=input_ids, positions=positions, attn_metadata=metadata,
                      sampling_positions=sampling_positions, sampling_params=sampling_params,
                      spec_decode_metadata=spec_decode_metadata, rank=self.rank_tensor,
                      logit_mask=self._noop_logit_mask(sampling_positions.shape[0]))
        if self.settings.uses_mrope:
            kwargs["rotary_position_ids"] = positions[None].expand(3, -1).contiguous() if rotary is None else rotary
        kwargs.update(vision)
        if self.settings.enable_prompt_embeds and not self.settings.multimodal:
            kwargs["inputs_embeds"] = torch.zeros(input_ids.shape[0], self.model.config.hidden_size,
                                                  dtype=torch.bfloat16)
            kwargs["is_token_ids"] = torch.ones(input_ids.shape[0], dtype=torch.bool)
        return self.forward(**kwargs)

    def _step(self, input_ids, positions, metadata, sampling_positions, requests: list, **call_keywords) -> list[int]:
        """One step through ``_call`` (``call_keywords``: its ``rotary`` / vision keywords): the ids of the
        first ``len(requests)`` rows (``requests`` in row order)."""
        rows = sampling_positions.shape[0]
        params = (sampling_params_tensor([r.sampling for r in requests], rows, self.model.config.vocab_size)
                  if self.on_device_sampling else None)
        output = self._call(input_ids, positions, metadata, sampling_positions, params, **call_keywords)
        self.outputs.append((output, [r.sampling for r in requests]))
        if self.on_device_sampling:
            ids, _ = output
            return ids[: len(requests)].tolist()
        return output[: len(requests)].argmax(dim=-1).tolist()

    def _noop_logit_mask(self, rows: int):
        if not self.neuron_config.enable_structured_outputs:
            return None
        return torch.ones(rows, self.model.config.vocab_size, dtype=torch.bool)

    # --- the persistent batch and block tables --------------------------------------------------

    def _schedule(self, requests: list[Request]) -> None:
        """vLLM's ``_update_states``: unscheduled requests leave, new ones take the lowest free row,
        the batch is condensed (the last rows move into the holes, their written columns copied)."""
        rows: list = [r if r in requests else None for r in self.batch]
        for request in requests:
            if request not in rows:
                slot = rows.index(None) if None in rows else len(rows)
                if slot == len(rows):
                    rows.append(None)
                rows[slot] = request
                self._write_row(slot, request)
        while None in rows:
            hole = rows.index(None)
            last = max(i for i, r in enumerate(rows) if r is not None) if any(rows) else -1
            if last < hole:
                break
            for g, table in enumerate(self.tables):
                n = len(rows[last].blocks.get(g, []))
                table[hole, :n] = table[last, :n]
            rows[hole], rows[last] = rows[last], None
        self.batch = [r for r in rows if r is not None]

    def _write_row(self, row: int, request: Request) -> None:
        for g, table in enumerate(self.tables):
            blocks = request.blocks.get(g, [])
            table[row, : len(blocks)] = blocks

    def _take_block(self) -> int:
        if not self.free_blocks:
            raise RuntimeError("harness: out of KV blocks")
        return self.free_blocks.pop(0)

    def _ensure_blocks(self, request: Request, upto: int) -> None:
        for g, group in enumerate(self.groups):
            blocks = request.blocks.setdefault(g, [])
            need = math.ceil(upto / group.spec.block_size)
            while len(blocks) < need:
                blocks.append(self._take_block())
        if request in self.batch:
            self._write_row(self.batch.index(request), request)

    def release(self, request: Request) -> None:
        """Free the request's blocks (handed out next, to whichever group asks first); its row stays stale."""
        for blocks in request.blocks.values():
            self.free_blocks[:0] = blocks
        request.blocks.clear()

    def _metadata(self, num_reqs_padded: int, tokens: list, max_query_len: int, decode_token_threshold: int = 1) -> dict:
        """Per-group metadata dicts of a step (``tokens``: ``(row, position)`` or None for padding)."""
        metadata = {}
        cached = max((r.computed for r in self.batch), default=0)
        for g, group in enumerate(self.groups):
            bs = group.spec.block_size
            table = self.tables[g]
            slots = torch.tensor([int(table[row, pos // bs]) * bs + pos % bs if entry is not None else NULL_BLOCK_ID
                                  for entry in tokens for row, pos in [entry or (0, 0)]], dtype=torch.int64)
            device_table = torch.from_numpy(table[:num_reqs_padded].copy())
            device_table = torch.where(device_table == NULL_BLOCK_ID, torch.full_like(device_table, PAD_SLOT_ID),
                                       device_table)
            entry = dict(block_table_tensor=device_table, slot_mapping=slots, max_query_len=max_query_len,
                         block_size=bs, max_blocks_per_seq=self.widths[g], decode_token_threshold=decode_token_threshold,
                         cached_seq_len=torch.tensor([[cached]], dtype=torch.int32), kv_segment_size=0,
                         full_block_table_tensor=device_table.clone())
            for name in group.layer_names:
                metadata[name] = entry
        return metadata

    # --- steps --------------------------------------------------------------------------------

    def prefill(self, request: Request, chunk: int) -> int | None:
        """The next ``chunk`` prompt tokens of ``request`` alone, padded to a prefill bucket; its next id
        when the prompt is complete."""
        return self.prefill_packed([(request, chunk)])[0]

    def prefill_packed(self, items: list[tuple[Request, int]]) -> list[int | None]:
        """One prefill step of ``(request, chunk)`` items: each request's next ``chunk`` prompt tokens, end to
        end in batch-row order in the smallest prefill bucket that holds them all; per item its next id
        when its prompt is complete, else None.

        Raises:
            ValueError: before any work, for more items than ``prefill_rows``, a request twice, a chunk
                outside ``1 .. tokens left``, or chunks over the largest bucket.
        """
        requests = [request for request, _ in items]
        if not 1 <= len(items) <= self.prefill_rows:
            raise ValueError(f"prefill step: expected 1 .. prefill_rows = {self.prefill_rows} requests, got {len(items)}")
        if len(set(map(id, requests))) != len(requests):
            raise ValueError("prefill step: expected each request once")
        if len(items) > 1 and (self.settings.multimodal or self.settings.uses_mrope):
            raise ValueError(f"prefill step: the runner's M-RoPE and vision inputs are built for one request per "
                             f"prefill step, got {len(items)}")
        for request, chunk in items:
            left = len(request.tokens) - request.computed
            if not 1 <= chunk <= left:
                raise ValueError(f"prefill step: expected a chunk of 1 .. {left} tokens (left in the prompt), got {chunk}")
        total = sum(chunk for _, chunk in items)
        if total > self.prefill_buckets[-1]:
            raise ValueError(f"prefill step: expected at most {self.prefill_buckets[-1]} tokens (the largest prefill "
                             f"bucket), got {total}")
        bucket = next(b for b in self.prefill_buckets if b >= total)
        for request, chunk in items:
            self._ensure_blocks(request, request.computed + chunk)
        self._schedule(requests)
        chunks = dict((id(request), chunk) for request, chunk in items)
        ordered = [(r, chunks[id(r)]) for r in self.batch]  # the runner's req_ids: batch-row order
        pad = bucket - total
        ids, positions, tokens, sampling = [], [], [], []
        for row, (request, chunk) in enumerate(ordered):
            start = request.computed
            ids += request.tokens[start:start + chunk]
            positions += list(range(start, start + chunk))
            tokens += [(row, p) for p in range(start, start + chunk)]
            sampling.append(len(ids) - 1)
        ids += [0] * pad
        positions += [positions[-1]] * pad
        tokens += [None] * pad
        sampling += [sampling[-1]] * (self.prefill_rows - len(ordered))
        metadata = self._metadata(self.prefill_rows, tokens, bucket)
        positions = torch.tensor(positions, dtype=torch.int64)
        for entry in {id(e): e for e in metadata.values()}.values():
            check_prefill_rows(entry, positions)
        rotary, vision = None, {}
        if self.settings.uses_mrope or self.settings.multimodal:  # one request (checked above)
            request, chunk = ordered[0]
            start = request.computed
            if self.settings.uses_mrope:
                rotary = torch.cat([self._mrope(request)[0][:, start:start + chunk],
                                    torch.zeros(3, pad, dtype=torch.int64)], 1)
            if self.settings.multimodal:
                vision = self._encode_and_gather(request, start, chunk, bucket)
        tokens = self._step(torch.tensor(ids, dtype=torch.int32), positions, metadata, torch.tensor(sampling),
                            [request for request, _ in ordered], rotary=rotary, **vision)
        results = {}
        for (request, chunk), token in zip(ordered, tokens):
            request.computed += chunk
            results[id(request)] = token if request.computed == len(request.tokens) else None
        return [results[id(request)] for request in requests]

    def _mrope(self, request: Request) -> tuple:
        """``_init_mrope_positions``: the model's positions of the prompt, computed once per request."""
        if request.mrope is None:
            request.mrope = self.model.get_mrope_input_positions(request.prompt, request.mm_features)
        return request.mrope

    def _encode_and_gather(self, request: Request, start: int, chunk: int, bucket: int) -> dict:
        """``_execute_mm_encoder`` (the chunk's uncached images encoded into the encoder cache by the
        model's ``embed_multimodal``), then ``_gather_mm_embeddings`` for the chunk."""
        uncached = [f for f in request.mm_features
                    if f.mm_position.offset < start + chunk and f.mm_position.offset + f.mm_position.length > start
                    and not self.encoder_cache.contains(f.identifier)]
        runner_vision.encode_into_cache(self.model, self.encoder_cache, uncached)
        return runner_vision.gather_vision_inputs(self.encoder_cache, self.max_vision_blocks, request.mm_features,
                                                  start, chunk, bucket)

    def decode(self, requests: list[Request]) -> list[int]:
        """One decode step of ``requests`` (one pending token each), padded to a decode bucket."""
        bucket = next(b for b in self.decode_buckets if b >= len(requests))
        for request in requests:
            self._ensure_blocks(request, request.computed + 1)
        self._schedule(requests)
        n, pad = len(requests), bucket - len(requests)
        input_ids = torch.tensor([r.tokens[r.computed] for r in self.batch] + [0] * pad, dtype=torch.int32)
        positions = torch.tensor([r.computed for r in self.batch] + [0] * pad, dtype=torch.int64)
        tokens = [(row, r.computed) for row, r in enumerate(self.batch)] + [None] * pad
        sampling = torch.tensor(list(range(n)) + [n - 1] * pad)
        rotary = None
        if self.settings.uses_mrope:
            rows = [self._mrope(r)[1] + r.computed for r in self.batch] + [0] * pad
            rotary = torch.tensor(rows, dtype=torch.int64)[None].expand(3, -1).contiguous()
        ids = self._step(input_ids, positions, self._metadata(bucket, tokens, 1), sampling, self.batch, rotary=rotary)
        for request in requests:
            request.computed += 1
        return [ids[self.batch.index(r)] for r in requests]


    def verify(self, requests: list[Request], drafts: list[list[int]]) -> list[list[int]]:
        """One speculative decode step: each request's pending token and its N ``drafts``, padded to a
        decode bucket with full fake requests; per request the ids the step emits (accepted drafts,
        then the correction or bonus id).

        As ``_prepare_model_input_impl`` builds it with ``scheduled_spec_decode_tokens``: per row
        1 + N tokens at positions ``computed .. computed + N``, ``max_query_len = 1 + N =
        decode_token_threshold``; ``_pad_to_compiled_shapes`` pads ids and positions with zeros,
        ``_apply_decode_slot_mapping_padding`` the slots with ``NULL_BLOCK_ID``;
        ``sampling_positions`` are ``_build_spec_decode_metadata``'s ``logits_indices`` (every
        token, the fake rows' own); ``sampling_params`` ``build_sampling_params_tensor`` padded to
        the rows and replicated per token (``replicate_per_seq_rows``: row-major repetition, read
        as ``repeat_interleave``: ``spec_decode_utils`` is not in the pin's snapshot). The ids come
        back ``[rows, 1 + N]``, ``-1`` past the accepted ones (``_parse_rejection_sampling_output``
        drops those and ids >= vocab_size); the request's computed tokens advance by as many.

        Raises:
            ValueError: before any work, without speculative decoding or for drafts of another length.
        """
        num_drafts = self.num_speculative_tokens
        if not num_drafts or len(drafts) != len(requests) or any(len(d) != num_drafts for d in drafts):
            raise ValueError(f"verify step: expected {num_drafts} drafts for each of {len(requests)} requests "
                             f"(speculative decoding on), got {[len(d) for d in drafts]}")
        if self.on_device_sampling is False:
            raise ValueError("verify step: the harness judges drafts on the device only (on-device sampling on)")
        width = 1 + num_drafts
        bucket = next(b for b in self.decode_buckets if b >= len(requests))
        for request in requests:
            self._ensure_blocks(request, request.computed + width)
        self._schedule(requests)
        by_request = {id(r): d for r, d in zip(requests, drafts)}
        pad = bucket - len(requests)
        ids, positions, tokens = [], [], []
        for row, request in enumerate(self.batch):
            start = request.computed
            ids += [request.tokens[start]] + by_request[id(request)]
            positions += list(range(start, start + width))
            tokens += [(row, p) for p in range(start, start + width)]
        ids += [0] * (pad * width)
        positions += [0] * (pad * width)
        tokens += [None] * (pad * width)
        spec = spec_decode_metadata([by_request[id(r)] for r in self.batch], bucket, num_drafts)
        vocab = self.model.config.vocab_size
        params = sampling_params_tensor([r.sampling for r in self.batch], bucket, vocab).repeat_interleave(width, 0)
        output = self._call(torch.tensor(ids, dtype=torch.int32), torch.tensor(positions, dtype=torch.int64),
                            self._metadata(bucket, tokens, width, decode_token_threshold=width),
                            spec.logits_indices, params, spec_decode_metadata=spec)
        self.outputs.append((output, [r.sampling for r in self.batch]))
        rows = output[0].tolist()
        emitted = {id(r): [t for t in rows[i] if 0 <= t < vocab] for i, r in enumerate(self.batch)}
        for request in requests:
            request.computed += len(emitted[id(request)])
        return [emitted[id(r)] for r in requests]


def spec_decode_metadata(drafts: list[list[int]], rows: int, num_drafts: int):
    """vLLM's ``SpecDecodeMetadata`` as the runner builds it for ``drafts`` (N per request), padded to
    ``rows`` with fake full-spec requests (``_build_spec_decode_metadata``, synchronous: drafts
    int32, zeros for the fake rows; their target indices repeat the last real one, their bonus and
    logits indices are their own positions). With every request's drafts ones it is also
    ``_create_warmup_spec_decode_metadata``'s (target indices ``r * W + j`` throughout)."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    width, real = 1 + num_drafts, len(drafts)
    target = [r * width + j for r in range(real) for j in range(num_drafts)]
    target += [target[-1]] * ((rows - real) * num_drafts)
    flat = [t for d in drafts for t in d] + [0] * ((rows - real) * num_drafts)
    return SpecDecodeMetadata(
        draft_token_ids=torch.tensor(flat, dtype=torch.int32),
        num_draft_tokens=[num_drafts] * rows,
        cu_num_draft_tokens=torch.arange(1, rows + 1, dtype=torch.int64) * num_drafts,
        cu_num_sampled_tokens=torch.arange(1, rows + 1, dtype=torch.int64) * width,
        target_logits_indices=torch.tensor(target, dtype=torch.int64),
        bonus_logits_indices=torch.arange(1, rows + 1, dtype=torch.int64) * width - 1,
        logits_indices=torch.arange(rows * width, dtype=torch.int64))


def stand_ins_in_use() -> bool:
    """Whether the cache spec classes are the shell's stand-ins (vllm-neuron not importable)."""
    return STAND_INS


def serve(runner: NeuronRunnerStandIn, prompts, max_new_tokens, arrivals,
          samplings=None) -> tuple[list[list[int]], list[tuple]]:
    """Serve requests arriving over time the Neuron scheduler's way: prefill steps while a prompt is
    pending, else decode steps of every running request (batches of the largest decode bucket).
    ``samplings``: one :class:`Sampling` per request (default: greedy).

    A prefill step takes the pending prompts in arrival order (the one with a chunk in progress
    first), each its next chunk up to what is left of the largest prefill bucket, up to
    ``runner.prefill_rows`` of them: with one row, the pinned runner's one prompt (or chunk) per step.

    With speculative decoding (``runner.num_speculative_tokens``) every decode step is a verify
    step (:meth:`NeuronRunnerStandIn.verify`) whose drafts ``runner.drafter`` proposes from each
    request's tokens.

    Returns:
        ``(ids per request, the step compositions)``: ``("prefill", ((chunk, context), ...))``,
        ``("decode", rows)`` or ``("verify", rows)``.
    """
    samplings = samplings or [Sampling() for _ in prompts]
    requests = [Request(list(p), n, s) for p, n, s in zip(prompts, max_new_tokens, samplings)]
    pending = sorted(range(len(requests)), key=lambda i: arrivals[i])
    prefilling, running, steps = [], [], []
    step = 0
    largest_chunk, largest_batch = runner.prefill_buckets[-1], runner.decode_buckets[-1]
    while pending or prefilling or running:
        while pending and arrivals[pending[0]] <= step:
            prefilling.append(requests[pending.pop(0)])
        if prefilling:
            items, budget = [], largest_chunk
            for request in prefilling[:runner.prefill_rows]:
                chunk = min(budget, len(request.prompt) - request.computed)
                if chunk == 0:
                    break
                items.append((request, chunk))
                budget -= chunk
            steps.append(("prefill", tuple((chunk, request.computed) for request, chunk in items)))
            for (request, _), token in zip(items, runner.prefill_packed(items)):
                if token is not None:
                    request.output.append(token)
                    prefilling.remove(request)
                    running.append(request)
        elif running:
            for start in range(0, len(running), largest_batch):
                batch = running[start:start + largest_batch]
                if runner.num_speculative_tokens:
                    steps.append(("verify", len(batch)))
                    emitted = runner.verify(batch, [runner.drafter(r.tokens) for r in batch])
                    for request, tokens in zip(batch, emitted):  # vLLM stops a request at max_tokens
                        request.output += tokens[:request.max_new_tokens - len(request.output)]
                    continue
                steps.append(("decode", len(batch)))
                for request, token in zip(batch, runner.decode(batch)):
                    request.output.append(token)
        for request in [r for r in running if r.done]:
            running.remove(request)
            runner.release(request)
        step += 1
    return [r.output for r in requests], steps
