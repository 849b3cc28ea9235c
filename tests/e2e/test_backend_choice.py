"""A served model's GDN layers choose their backends once, at construction, and log the choice once.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, see conftest), so the
layers' construction and every paged-op call are seen here.
"""

import functools
import json
import pathlib

import pytest

from tests.support.engines import engine

from vllm_gdn_neuron.ops import paged, phases

MODEL = "qwen3_5-dense"


@pytest.mark.slow
def test_layers_choose_once_at_construction_and_log_once(tiny_model, monkeypatch):
    from vllm import SamplingParams

    import vllm_gdn_neuron.shells.vllm.gated_deltanet as shell

    monkeypatch.delenv("VLLM_GDN_BACKEND", raising=False)
    from vllm_gdn_neuron.ops.backends import vllm_cpu

    built, logged, ran = [], [], []
    real_choice = shell.resolve_phases
    monkeypatch.setattr(shell, "resolve_phases", lambda *args: built.append(real_choice(*args)) or built[-1])
    monkeypatch.setattr(phases, "_logged", set())
    monkeypatch.setattr(phases.logger, "info", lambda message, *args: logged.append(message % args))

    def counted(backend, real, *args, **kwargs):
        ran.append((real.__name__, backend))
        return real(*args, **kwargs)

    for backend, module in (("torch", paged), ("vllm_cpu", vllm_cpu)):  # before the layers bind them
        for name in phases.PAGED_OPS.values():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, functools.wraps(getattr(module, name))(
                    functools.partial(counted, backend, getattr(module, name))))
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    with engine(tiny_model(MODEL), dtype="bfloat16", enable_prefix_caching=False) as llm:
        monkeypatch.setenv("VLLM_GDN_BACKEND", "vllm_cpu")  # after construction: no layer reads it any more
        llm.generate([{"prompt_token_ids": [5, 17, 99, 3, 250]}], params, use_tqdm=False)
    layer_types = json.loads((pathlib.Path(tiny_model(MODEL)) / "config.json").read_text())["layer_types"]
    assert len(built) == layer_types.count("linear_attention") > 0
    assert len(logged) == 1
    # the tiny model's Dk = 32, Dv = 16 heads are no size vLLM's GDN kernels take: torch, saying why
    assert "Dk/Dv 32/16, bfloat16" in logged[0] and "gdn prefill torch (v: backend 'vllm_cpu' expects" in logged[0]
    # each call ran the op its layer bound at construction (the later override reached none)
    chosen = {phases.PAGED_OPS[phase]: backend for phase, backend in built[0].backends.items()}
    outermost = [call for call in ran if chosen[call[0]] == call[1]]
    assert outermost and {name for name, _ in ran} <= set(chosen)
    assert all(chosen[name] == backend for name, backend in outermost)
    assert {name for name, _ in outermost} >= {"paged_conv1d_prefill", "paged_gdn_prefill", "paged_conv1d_decode",
                                                "paged_gdn_decode"}
