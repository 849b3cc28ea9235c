"""The Neuron shell at TP=2 under the runner's process layout: one worker process per rank (gloo, CPU).

Each rank runs the whole runner stand-in (``runner.py``): its start-up, every bucket
compiled with the runner's own ``torch.compile`` call (aot_eager) and warmed up, then the
same schedule of steps under ``fail_on_recompile``; the collectives are traced into each
bucket's graph. Both ranks' greedy ids must equal TP=1's (the same runner, one process)
and transformers'. The group is a small adapter over ``torch.distributed`` with the surface
of vLLM's ``GroupCoordinator`` that the shell uses (``world_size``, ``rank_in_group``,
``all_reduce``, ``all_gather``).
"""

import pathlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class GlooGroup:
    def __init__(self) -> None:
        self.world_size, self.rank_in_group = dist.get_world_size(), dist.get_rank()

    @staticmethod
    def all_reduce(tensor):
        out = tensor.clone()
        dist.all_reduce(out)
        return out

    def all_gather(self, tensor, dim=-1):
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim=dim)


def _rank_main(rank, world, init_file, model_dir, workload, out_file, quantization=None):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM

    class ShardedModel(Qwen3_5NeuronForCausalLM):
        @classmethod
        def from_configs(cls, hf_config, neuron_config=None, **kwargs):
            return cls(hf_config, neuron_config, tp_group=GlooGroup())

    ids, graphs = _serve(ShardedModel, model_dir, workload, tp_rank=rank, quantization=quantization)
    torch.save((ids, graphs), f"{out_file}.{rank}")
    dist.destroy_process_group()


def _serve(model_cls, model_dir, workload, tp_rank=0, quantization=None):
    from . import runner as harness

    neuron_config = dict(num_batched_tokens_buckets=[8, 32], num_seqs_buckets=[4])
    if quantization is not None:
        neuron_config["quantization"] = quantization
    settings = harness.EngineSettings(model=model_dir, max_num_seqs=4, num_gpu_blocks_override=24,
                                      additional_config={"neuron_config": neuron_config})
    runner = harness.NeuronRunnerStandIn(model_cls, settings)
    runner.load_model(tp_rank=tp_rank)
    runner.initialize_kv_cache(runner.get_kv_cache_spec())
    runner.warm_up()
    prompts = [list(p) for p, _, _ in workload]
    with torch.compiler.set_stance("fail_on_recompile"):
        ids, _ = harness.serve(runner, prompts, [n for _, n, _ in workload], [a for _, _, a in workload])
    return ids, len(runner.recorder.dynamo_graphs)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3_5-dense", "qwen3-next"])
def test_two_ranks_serve_transformers_ids(tiny_model, tmp_path, model):
    from tests.support import oracle

    model_dir = tiny_model(model)
    generator = torch.Generator().manual_seed(5)
    workload = [(torch.randint(3, 512, (n,), generator=generator).tolist(), new, arrival)
                for n, new, arrival in [(1, 4, 0), (40, 3, 0), (9, 5, 2)]]
    out_file = tmp_path / "ids.pt"
    mp.start_processes(_rank_main, args=(2, tmp_path / "pg", model_dir, workload, out_file), nprocs=2,
                       start_method="spawn")
    from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM

    tp1_ids, tp1_graphs = _serve(Qwen3_5NeuronForCausalLM, model_dir, workload)
    assert tp1_graphs == 3  # two prefill buckets, one decode bucket
    for rank in range(2):
        ids, graphs = torch.load(f"{out_file}.{rank}")
        assert graphs == tp1_graphs, f"rank {rank}: {graphs} graphs"
        assert ids == tp1_ids, f"rank {rank}"
    for (prompt, new_tokens, _), got in zip(workload, tp1_ids):
        want, _ = oracle.hf_greedy(model_dir, torch.float32, prompt, new_tokens)
        assert got == want


@pytest.mark.slow
@pytest.mark.parametrize(("model", "quantization"), [("qwen3_5-moe-fp8", None), ("qwen3-next-fp8", None),
                                                     ("qwen3_5-moe-fp8", "fp8")])
def test_two_ranks_serve_fp8_checkpoints(tiny_model, tmp_path, model, quantization):
    """Block-FP8 checkpoints at TP=2, every rank's shard smaller than one 128-block: dequantized on the
    host (transformers' fp32 ids on the dequantized weights), or kept in FP8 (each rank requantizes its
    own shard: transformers' fp32 ids on the weights the two ranks compute with)."""
    from tests.support import oracle

    from .fp8_oracle import dequantized_copy, device_weights_copy

    model_dir = tiny_model(model)
    generator = torch.Generator().manual_seed(5)
    workload = [(torch.randint(3, 512, (n,), generator=generator).tolist(), new, arrival)
                for n, new, arrival in [(1, 4, 0), (40, 3, 0), (9, 5, 2)]]
    out_file = tmp_path / "ids.pt"
    mp.start_processes(_rank_main, args=(2, tmp_path / "pg", model_dir, workload, out_file, quantization), nprocs=2,
                       start_method="spawn")
    oracle_dir = (dequantized_copy(model_dir, tmp_path / "oracle") if quantization is None
                  else device_weights_copy(model_dir, tmp_path / "oracle", tp=2))
    ranks = [torch.load(f"{out_file}.{rank}")[0] for rank in range(2)]
    assert ranks[0] == ranks[1]
    for (prompt, new_tokens, _), got in zip(workload, ranks[0]):
        want, _ = oracle.hf_greedy(oracle_dir, torch.float32, prompt, new_tokens)
        assert got == want


def _with_fused_experts(source, folder):
    """A copy of the checkpoint ``source`` with its per-expert tensors stacked into the fused 3-D
    layout (``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj [E, H, I]``)."""
    import re
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    tensors = {}
    for path in sorted(pathlib.Path(source).glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    experts = {}
    for name in [n for n in tensors if re.search(r"\.experts\.\d+\.", n)]:
        prefix, expert, proj = re.match(r"(.*\.experts)\.(\d+)\.(\w+)_proj\.weight", name).groups()
        experts.setdefault(prefix, {})[(int(expert), proj)] = tensors.pop(name)
    for prefix, weights in experts.items():
        count = max(expert for expert, _ in weights) + 1
        tensors[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([weights[(e, "gate")], weights[(e, "up")]]) for e in range(count)])
        tensors[f"{prefix}.down_proj"] = torch.stack([weights[(e, "down")] for e in range(count)])
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return str(folder)


@pytest.mark.parametrize("model", ["qwen3_5-dense", "qwen3_5-moe", "qwen3-next", "qwen3_5-moe-vl", "fused-experts",
                                   "qwen3_5-moe-vl-fp8"])
def test_each_rank_loads_the_share_the_parameter_layout_describes(tiny_model, tmp_path, model):
    """Every parameter a rank of TP=2 loads is :func:`~vllm_gdn_neuron.model.parameters.rank_share` of
    the TP=1 model's (merged projections, conv channels, head vectors, row-parallel weights, both
    routed-expert layouts, the vocabulary-split LM head, the replicated vision tower)."""
    import types

    import transformers

    from vllm_gdn_neuron.model.parameters import rank_share
    from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM

    if model == "fused-experts":
        folder = _with_fused_experts(tiny_model("qwen3_5-moe"), tmp_path / "fused")
    else:
        folder = tiny_model(model)
    config = transformers.AutoConfig.from_pretrained(folder)
    text_config = getattr(config, "text_config", config)

    def loaded(tp, rank, checkpoint=folder):
        group = types.SimpleNamespace(world_size=tp, rank_in_group=rank, all_reduce=None, all_gather=None)
        with torch.device("meta"):
            shell = Qwen3_5NeuronForCausalLM(config, None, tp_group=group)
        shell.load_weights(checkpoint, "cpu", None)
        return shell

    whole = dict(loaded(1, 0).named_parameters())
    if model == "fused-experts":  # the same model as the per-expert checkpoint it was stacked from
        for name, param in loaded(1, 0, tiny_model("qwen3_5-moe")).named_parameters():
            torch.testing.assert_close(whole[name].data, param.data, rtol=0, atol=0, msg=name)
    for rank in range(2):
        shell = loaded(2, rank)
        assert shell.vocab_shards == 2
        for name, param in shell.named_parameters():
            want = rank_share(name, whole[name].data, text_config, 2, rank, vocab_split=True)
            torch.testing.assert_close(param.data, want, rtol=0, atol=0, msg=f"rank {rank}: {name}")
