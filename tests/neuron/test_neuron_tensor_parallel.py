"""The Neuron shell at TP=2: two processes (gloo), each loading its shards, give transformers' greedy ids.

Eager forward (the compiled path is covered at TP=1 by the harness); the group is a
small adapter over ``torch.distributed`` with the surface of vLLM's ``GroupCoordinator``
that the shell uses (``world_size``, ``rank_in_group``, ``all_reduce``, ``all_gather``).
"""

import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(__file__)


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


def _rank_main(rank, world, init_file, model_dir, workload, out_file):
    sys.path.insert(0, HERE)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    import runner as harness
    from vllm_gdn_neuron.neuron.model import Qwen3_5NeuronForCausalLM

    class ShardedModel(Qwen3_5NeuronForCausalLM):
        @classmethod
        def from_configs(cls, hf_config, neuron_config=None, **kwargs):
            return cls(hf_config, neuron_config, tp_group=GlooGroup())

    runner = harness.HarnessRunner(ShardedModel, model_dir, prefill_buckets=(32,), decode_buckets=(4,),
                                   num_blocks=24, compile=False)
    prompts = [list(p) for p, _, _ in workload]
    ids, _ = harness.serve(runner, prompts, [n for _, n, _ in workload], [a for _, _, a in workload])
    if rank == 0:
        torch.save(ids, out_file)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3_5-dense", "qwen3-next"])
def test_two_ranks_serve_transformers_ids(tiny_model, tmp_path, model):
    from neuron_testing import oracle

    model_dir = tiny_model(model)
    generator = torch.Generator().manual_seed(5)
    workload = [(torch.randint(3, 512, (n,), generator=generator).tolist(), new, arrival)
                for n, new, arrival in [(1, 4, 0), (40, 3, 0), (9, 5, 2)]]
    out_file = tmp_path / "ids.pt"
    mp.start_processes(_rank_main, args=(2, tmp_path / "pg", model_dir, workload, out_file), nprocs=2,
                       start_method="spawn")
    ids = torch.load(out_file)
    for (prompt, new_tokens, _), got in zip(workload, ids):
        want, _ = oracle.hf_greedy(model_dir, torch.float32, prompt, new_tokens)
        assert got == want
