"""A served model's GDN layers choose their backends once, at construction, and log the choice once.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, see conftest), so the
layers' construction and every paged-op call are seen here.
"""

import json
import pathlib

import pytest

from tests.support.engines import engine

from vllm_gdn_neuron.ops import layer_backends as layer_backends_module
from vllm_gdn_neuron.ops import paged

MODEL = "qwen3_5-dense"


@pytest.mark.slow
def test_layers_choose_once_at_construction_and_log_once(tiny_model, monkeypatch):
    from vllm import SamplingParams

    import vllm_gdn_neuron.shells.vllm.gated_deltanet as shell

    monkeypatch.delenv("VLLM_GDN_BACKEND", raising=False)
    built, logged, in_place = [], [], []
    real_choice, real_select = shell.layer_backends, paged.select_in_place
    monkeypatch.setattr(shell, "layer_backends", lambda *args: built.append(args) or real_choice(*args))
    monkeypatch.setattr(layer_backends_module, "_logged", set())
    monkeypatch.setattr(layer_backends_module.logger, "info", lambda message, *args: logged.append(message % args))
    monkeypatch.setattr(paged, "select_in_place",
                        lambda op_name, backend, *args: in_place.append(backend) or real_select(op_name, backend, *args))
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    with engine(tiny_model(MODEL), dtype="bfloat16", enable_prefix_caching=False) as llm:
        monkeypatch.setenv("VLLM_GDN_BACKEND", "vllm_cpu")  # after construction: no layer reads it any more
        llm.generate([{"prompt_token_ids": [5, 17, 99, 3, 250]}], params, use_tqdm=False)
    layer_types = json.loads((pathlib.Path(tiny_model(MODEL)) / "config.json").read_text())["layer_types"]
    assert len(built) == layer_types.count("linear_attention") > 0
    assert len(logged) == 1
    # the tiny model's Dk = 32, Dv = 16 heads are no size vLLM's GDN kernels take: torch, saying why
    assert "Dk/Dv 32/16, bfloat16" in logged[0] and "gdn prefill torch (v: backend 'vllm_cpu' expects" in logged[0]
    assert in_place and set(in_place) <= {"torch", "vllm_cpu"}  # each call names the layer's choice
