"""A CPU stand-in for vllm-neuron's model runner, driving the Neuron shell the way the pinned runner does.

What it does, in the runner's order (see ``vllm_gdn_neuron.neuron.contract``):

1. ``cls.from_configs(hf_config, neuron_config)`` under ``torch.device("meta")``, then
   ``model.to_empty(device="cpu")`` and ``model.load_weights(model_dir, "cpu", None)``;
2. ``torch.compile(model, fullgraph=True, dynamic=False, backend=<aot_eager, recording graphs>)``;
3. ``model.get_kv_spec()`` -> pages -> ``model.bind_kv_cache({name: [pages]})``;
4. each engine step: inputs padded to a bucket (padding tokens ``slot_mapping`` = the pad
   sentinel, padded prefill positions repeat the last one), per-layer metadata dicts, the
   forward returns the logits of ``sampling_positions``; greedy ids are taken on the host.

The cache follows vLLM's hybrid planner: layers in cache groups of ``group_size`` layers
of one kind, each group its own block table, block ids for all groups from one pool
(block 0 is vLLM's null block), one page size for every layer (the hybrid alignment of
``vllm_gdn_neuron.neuron.cache``), plus the runner's two reserved pages. Each layer gets
its own page-major tensor (aot_autograd refuses in-place writes into two views of one
input); to stand in for the bytes another group leaves in a shared page, every page a
request frees is filled with NaNs before it is handed out again.
"""

import dataclasses
import math

import torch
from torch._dynamo.backends.common import aot_autograd

from vllm_gdn_neuron.neuron.cache import attention_bytes_per_token, hybrid_block_size, padded_state_page_elems
from vllm_gdn_neuron.neuron.contract import NUM_RESERVED_PAGES
from vllm_gdn_neuron.neuron.kv_spec import STAND_INS


@dataclasses.dataclass
class NeuronConfigStandIn:
    """The pinned ``NeuronConfig`` fields the shell reads (``vllm_neuron/model/neuron_config.py``)."""

    on_device_sampling_config: object | None = None
    quantization: str | None = None
    num_batched_tokens_buckets: list[int] | None = None
    num_seqs_buckets: list[int] | None = None


class GraphRecorder:
    """A ``torch.compile`` backend: ``aot_eager`` that keeps every Dynamo and ATen graph it compiles."""

    def __init__(self) -> None:
        self.dynamo_graphs = []
        self.aten_graphs = []
        self._aot = aot_autograd(fw_compiler=self._keep)

    def _keep(self, gm, example_inputs):
        self.aten_graphs.append(gm)
        return gm

    def __call__(self, gm, example_inputs):
        self.dynamo_graphs.append(gm)
        return self._aot(gm, example_inputs)


# ATen ops that read device values back to the host, or whose output shape depends on them.
HOST_READ_OPS = frozenset({"_local_scalar_dense", "item", "nonzero", "nonzero_static", "unique", "_unique",
                           "_unique2", "unique_consecutive", "unique_dim", "masked_select", "argwhere"})


# Tensor methods of a Dynamo graph that leave the device.
HOST_READ_METHODS = frozenset({"item", "tolist", "cpu", "numpy", "nonzero", "unique"})


def host_reads(graph_module) -> list[str]:
    """Nodes of a Dynamo or ATen graph that read device data on the host, or copy a tensor to another device."""
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
        if op in ("_to_copy", "copy", "to") and "device" in node.kwargs:
            found.append(f"{op}(device={node.kwargs['device']})")
    return found


@dataclasses.dataclass
class Request:
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = dataclasses.field(default_factory=list)
    computed: int = 0  # tokens whose K/V and state are in the cache
    blocks: dict = dataclasses.field(default_factory=dict)  # group -> list of block ids

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens


class HarnessRunner:
    """Loads, compiles and serves one tiny checkpoint through the Neuron shell's contract.

    Args:
        model_cls: the registered Neuron class (``from_configs`` factory).
        model_dir: a Hugging Face checkpoint folder.
        prefill_buckets: token counts of the compiled prefill graphs (one sequence each).
        decode_buckets: row counts of the compiled decode graphs.
        num_blocks: blocks in the shared pool (block 0 is the null block).
        block_size: attention tokens per block before hybrid alignment (the planner may raise it).
        max_model_len: the recurrent group's block size (one state block per sequence).
        pad_slot: the padding sentinel of ``slot_mapping`` (0 = NULL_BLOCK_ID on the pinned
            runner, -1 = PAD_SLOT_ID on older ones).
        compile: compile each bucket (else eager, for debugging).
        backend: the ``torch.compile`` backend (default: a :class:`GraphRecorder`); it must
            keep ``dynamo_graphs`` and ``aten_graphs`` like the recorder.
    """

    def __init__(self, model_cls, model_dir, *, dtype="float32", prefill_buckets=(16, 64), decode_buckets=(4,),
                 num_blocks=64, block_size=16, max_model_len=512, pad_slot=0, compile=True,
                 backend=None) -> None:
        import transformers

        hf_config = transformers.AutoConfig.from_pretrained(model_dir)
        text = getattr(hf_config, "text_config", None) or hf_config
        text.dtype = getattr(torch, dtype)
        self.neuron_config = NeuronConfigStandIn(num_batched_tokens_buckets=list(prefill_buckets),
                                                 num_seqs_buckets=list(decode_buckets))
        with torch.device("meta"):
            model = model_cls.from_configs(hf_config, self.neuron_config)
        model.to_empty(device="cpu")
        model.load_weights(model_dir, torch.device("cpu"), None)
        self.model = model.eval()
        self.prefill_buckets, self.decode_buckets = sorted(prefill_buckets), sorted(decode_buckets)
        self.max_model_len, self.pad_slot = max_model_len, pad_slot
        self.recorder = backend if backend is not None else GraphRecorder()
        torch._dynamo.reset()  # a fresh compile cache, as in a new runner process
        self.forward = (torch.compile(self.model, fullgraph=True, dynamic=False, backend=self.recorder)
                        if compile else self.model)
        self._allocate(num_blocks, block_size)

    # --- cache ------------------------------------------------------------------------------

    def _allocate(self, num_blocks: int, block_size: int) -> None:
        spec = self.model.get_kv_spec()
        attention, recurrent = spec.layers, spec.recurrent_layers
        token_bytes = attention_bytes_per_token(attention[0].num_kv_heads, attention[0].head_size, attention[0].dtype)
        state_bytes = sum(math.prod(s) * d.itemsize for s, d in zip(recurrent[0].shapes, recurrent[0].dtypes))
        self.block_size = max(block_size, hybrid_block_size(token_bytes, state_bytes, block_size))
        page_bytes = self.block_size * token_bytes
        state_elems = padded_state_page_elems(self.block_size, token_bytes)
        self.num_pages = num_blocks + NUM_RESERVED_PAGES
        # vLLM's grouping: groups of group_size layers of one kind.
        group_size = min(len(attention), len(recurrent))
        self.groups = {}
        for kind, layers in (("attention", attention), ("recurrent", recurrent)):
            for start in range(0, len(layers), group_size):
                self.groups[f"{kind}{start // group_size}"] = [layer.name for layer in layers[start:start + group_size]]
        caches = {}
        for group, names in self.groups.items():
            for name in names:
                if group.startswith("attention"):
                    a = attention[0]
                    view = torch.zeros(self.num_pages, 2, a.num_kv_heads, self.block_size, a.head_size, dtype=a.dtype)
                else:
                    view = torch.zeros(self.num_pages, state_elems, dtype=torch.float32)
                if view.numel() * view.element_size() != self.num_pages * page_bytes:
                    raise AssertionError(f"{name}: page of {view[0].numel() * view.element_size()} bytes, not {page_bytes}")
                caches[name] = [view]
        self.caches = caches
        self.model.bind_kv_cache(caches)
        self.free_blocks = list(range(1, num_blocks))  # block 0: vLLM's null block

    def _take_block(self) -> int:
        if not self.free_blocks:
            raise RuntimeError("harness: out of KV blocks")
        return self.free_blocks.pop(0)

    def _ensure_blocks(self, request: Request, upto: int) -> None:
        for group in self.groups:
            blocks = request.blocks.setdefault(group, [])
            need = math.ceil(upto / self.block_size) if group.startswith("attention") else 1
            while len(blocks) < need:
                blocks.append(self._take_block())

    def release(self, request: Request) -> None:
        """Free the request's blocks; their pages are poisoned (NaN) in every layer's cache."""
        for blocks in request.blocks.values():
            pages = torch.tensor(blocks)
            for (view,) in self.caches.values():
                view.index_fill_(0, pages, float("nan"))
            self.free_blocks[:0] = blocks  # handed out next, to whichever group asks first
        request.blocks.clear()

    def warm_up(self) -> None:
        """Run every bucket once on padding only (what the runner does before it refuses recompiles)."""
        for bucket in self.prefill_buckets:
            self._step(torch.zeros(bucket, dtype=torch.int64), torch.zeros(bucket, dtype=torch.int64),
                       self._metadata([None], [None] * bucket, bucket, self._max_blocks), torch.tensor([0]))
        for bucket in self.decode_buckets:
            self._step(torch.zeros(bucket, dtype=torch.int64), torch.zeros(bucket, dtype=torch.int64),
                       self._metadata([None] * bucket, [None] * bucket, 1, self._max_blocks), torch.arange(bucket))

    @property
    def _max_blocks(self) -> int:
        return math.ceil(self.max_model_len / self.block_size)

    def _step(self, input_ids, positions, metadata, sampling_positions):
        return self.forward(input_ids=input_ids, positions=positions, attn_metadata=metadata,
                            sampling_positions=sampling_positions, sampling_params=None, spec_decode_metadata=None,
                            logit_mask=None, rank=torch.tensor(0), inputs_embeds=None, is_token_ids=None)

    # --- steps ------------------------------------------------------------------------------

    def _slot(self, group: str, request: Request, position: int) -> int:
        if group.startswith("attention"):
            block = request.blocks[group][position // self.block_size]
            return block * self.block_size + position % self.block_size
        return request.blocks[group][0] * self.max_model_len + position % self.max_model_len

    def _metadata(self, rows, tokens, max_query_len, max_blocks):
        """Per-layer dicts; layers of one group share one dict (as the runner shares one builder)."""
        metadata = {}
        for group, names in self.groups.items():
            width = max_blocks if group.startswith("attention") else 1
            table = torch.zeros(len(rows), width, dtype=torch.int32)
            for r, request in enumerate(rows):
                if request is not None:
                    blocks = request.blocks[group][:width]
                    table[r, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            slots = torch.full((len(tokens),), self.pad_slot, dtype=torch.int64)
            for t, entry in enumerate(tokens):
                if entry is not None:
                    slots[t] = self._slot(group, *entry)
            entry = dict(block_table_tensor=table, slot_mapping=slots, max_query_len=max_query_len,
                         decode_token_threshold=1, block_size=self.block_size if group.startswith("attention")
                         else self.max_model_len)
            for name in names:
                metadata[name] = entry
        return metadata

    def prefill(self, request: Request, chunk: int) -> int | None:
        """Prefill the next ``chunk`` tokens of ``request`` (one sequence, bucket-padded); its next id
        when the prompt is complete."""
        start, stop = request.computed, request.computed + chunk
        bucket = next(b for b in self.prefill_buckets if b >= chunk)
        self._ensure_blocks(request, stop)
        ids = request.tokens[start:stop]
        positions = list(range(start, stop))
        pad = bucket - chunk
        input_ids = torch.tensor(ids + [0] * pad, dtype=torch.int64)
        positions = torch.tensor(positions + [positions[-1]] * pad, dtype=torch.int64)
        tokens = [(request, p) for p in range(start, stop)] + [None] * pad
        metadata = self._metadata([request], tokens, bucket, self._max_blocks)
        logits = self._step(input_ids, positions, metadata, torch.tensor([chunk - 1]))
        request.computed = stop
        if stop == len(request.tokens):
            return int(logits[0].argmax())
        return None

    def decode(self, requests: list[Request]) -> list[int]:
        """One decode step of ``requests`` (each with one pending token), padded to a bucket; their next ids."""
        bucket = next(b for b in self.decode_buckets if b >= len(requests))
        rows = list(requests) + [None] * (bucket - len(requests))
        for request in requests:
            self._ensure_blocks(request, request.computed + 1)
        input_ids = torch.tensor([r.tokens[r.computed] for r in requests] + [0] * (bucket - len(requests)))
        positions = torch.tensor([r.computed for r in requests] + [0] * (bucket - len(requests)))
        tokens = [(r, r.computed) for r in requests] + [None] * (bucket - len(requests))
        metadata = self._metadata(rows, tokens, 1, self._max_blocks)
        logits = self._step(input_ids, positions, metadata, torch.arange(bucket))
        for request in requests:
            request.computed += 1
        return [int(i) for i in logits[: len(requests)].argmax(-1)]


def stand_ins_in_use() -> bool:
    """Whether the cache spec classes are the shell's stand-ins (vllm-neuron not importable)."""
    return STAND_INS


def serve(runner: HarnessRunner, prompts, max_new_tokens, arrivals) -> tuple[list[list[int]], list[tuple]]:
    """Serve requests arriving over time: one prefill chunk per step while one is pending, else a decode
    step of every running request (batches of the largest decode bucket).

    Args:
        prompts: token ids per request.
        max_new_tokens: greedy tokens per request (requests finish at different steps).
        arrivals: the step at which each request arrives (new requests join running ones).

    Returns:
        ``(ids per request, the step compositions)``: each composition is ``("prefill", chunk,
        context)`` or ``("decode", rows)``.
    """
    requests = [Request(list(p), n) for p, n in zip(prompts, max_new_tokens)]
    pending = sorted(range(len(requests)), key=lambda i: arrivals[i])
    prefilling, running, steps = [], [], []
    step = 0
    largest_chunk, largest_batch = runner.prefill_buckets[-1], runner.decode_buckets[-1]
    while pending or prefilling or running:
        while pending and arrivals[pending[0]] <= step:
            prefilling.append(requests[pending.pop(0)])
        if prefilling:
            request = prefilling[0]
            chunk = min(largest_chunk, len(request.prompt) - request.computed)
            steps.append(("prefill", chunk, request.computed))
            token = runner.prefill(request, chunk)
            if token is not None:
                request.output.append(token)
                prefilling.pop(0)
                running.append(request)
        elif running:
            for start in range(0, len(running), largest_batch):
                batch = running[start:start + largest_batch]
                steps.append(("decode", len(batch)))
                for request, token in zip(batch, runner.decode(batch)):
                    request.output.append(token)
        for request in [r for r in running if r.done]:
            running.remove(request)
            runner.release(request)
        step += 1
    return [r.output for r in requests], steps
