"""The Neuron shell's GDN layers through the NKI kernels (the interpreter behind the adapter
on the CPU): the same greedy ids as the torch core, and every step served by the kernels.

Eager (``compile=False``): the CPU interpreter runs NumPy, which torch.compile cannot trace;
on a device the adapter's ops are registered with torch-neuronx and the shell is compiled.
"""

import pytest
import torch

from vllm_gdn_neuron.shells.neuron.model import Qwen3_5NeuronForCausalLM

from .runner import NeuronRunnerStandIn, serve
from .test_harness import settings_for

# (prompt length, new tokens, arrival step): a one-token prompt, a prompt longer than the
# prefill bucket (two chunks, the second from the first's state), decode batches of 1 to 3.
WORKLOAD = [(1, 3, 0), (40, 3, 0), (7, 4, 2)]


def _serve(model_dir, monkeypatch, backend, prefill_rows=1):
    monkeypatch.setenv("VLLM_GDN_BACKEND", backend)
    runner = NeuronRunnerStandIn(Qwen3_5NeuronForCausalLM, settings_for(model_dir, "float32", (32,), (4,),
                                                                        num_gpu_blocks_override=24), compile=False,
                                 prefill_rows=prefill_rows)
    runner.start()
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (n,), generator=generator).tolist() for n, _, _ in WORKLOAD]
    return serve(runner, prompts, [n for _, n, _ in WORKLOAD], [a for _, _, a in WORKLOAD])


# (prefill rows, prefill steps at least): one prompt per step as the pinned runner sends them,
# or the one-token prompt packed with the first chunk of the long one.
ROWS = {"one-prompt-per-step": (1, 4), "packed": (3, 3)}


@pytest.mark.parametrize("rows, min_prefills", ROWS.values(), ids=ROWS.keys())
@pytest.mark.parametrize("model", ["qwen3_5-dense", pytest.param("qwen3_5-moe", marks=pytest.mark.slow)])
def test_shell_on_the_nki_kernels_gives_the_torch_core_ids(tiny_model, monkeypatch, nki_launches, model, rows,
                                                           min_prefills):
    model_dir = tiny_model(model)
    torch_ids, torch_steps = _serve(model_dir, monkeypatch, "torch", rows)

    nki_ids, nki_steps = _serve(model_dir, monkeypatch, "nki", rows)

    assert nki_steps == torch_steps
    assert nki_ids == torch_ids
    gdn_layers = 3  # the tiny models: 3 GatedDeltaNet layers + 1 attention layer
    prefills = sum(step[0] == "prefill" for step in nki_steps)
    decodes = sum(step[0] == "decode" for step in nki_steps)
    assert prefills >= min_prefills and decodes >= 3
    prefills, decodes = prefills + 1, decodes + 1  # the warm-up of the one prefill and one decode bucket
    assert nki_launches == {
        "conv1d_prefill": prefills * gdn_layers,
        "gdn_cte": prefills * gdn_layers,
        "conv1d_decode": decodes * gdn_layers,
        "gdn_recurrent_step": decodes * gdn_layers,
    }
