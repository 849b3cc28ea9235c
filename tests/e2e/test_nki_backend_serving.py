"""The tiny Qwen3.5 model served through the ``nki`` backend (its kernels run in the NKI interpreter)
gives the same greedy ids as through the ``torch`` backend.

``VLLM_GDN_BACKEND`` is read when each GDN layer is built (``ops.phases``: the NKI kernels'
paged ops, as in the Neuron shell) and the engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, see conftest), so the variable set here reaches the
GDN layers. Prompts are short and few (the interpreter runs every kernel instruction in
NumPy): one prefill shorter than a chunk (padded to 128 inside the backend), one longer
than a chunk and split by ``max_num_batched_tokens`` (chunked prefill continues from the
cached conv and recurrent states), then decode steps.
"""

import collections
import functools

import pytest
import torch

from tests.support.engines import engine
from tests.support.oracle import assert_greedy_matches, hf_greedy

from vllm_gdn_neuron.ops.backends import nki as nki_backend

MODEL = "qwen3_5-dense"
NEW_TOKENS = 4
PROMPTS = ([5, 17, 99, 3, 250, 41, 7], [(7 * i + 11) % 500 + 3 for i in range(150)])


LAYER_OPS = ("paged_conv1d_prefill", "paged_conv1d_decode", "paged_gdn_prefill", "paged_gdn_decode")


def _count_nki_calls(monkeypatch):
    """Count the nki backend's op calls (so the test knows the kernels really served the model)."""
    calls = collections.Counter()
    for name in LAYER_OPS:
        original = getattr(nki_backend, name)

        @functools.wraps(original)
        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(nki_backend, name, counted)
    return calls


def _greedy(model_dir, dtype, backend, monkeypatch):
    from vllm import SamplingParams

    monkeypatch.setenv("VLLM_GDN_BACKEND", backend)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    with engine(model_dir, dtype=dtype, enable_prefix_caching=False) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.slow
def test_nki_backend_serves_the_same_greedy_ids_as_torch_fp32(tiny_model, monkeypatch):
    calls = _count_nki_calls(monkeypatch)
    nki_ids = _greedy(tiny_model(MODEL), "float32", "nki", monkeypatch)
    assert all(calls[name] > 0 for name in LAYER_OPS), calls
    served = sum(calls.values())
    torch_ids = _greedy(tiny_model(MODEL), "float32", "torch", monkeypatch)
    assert sum(calls.values()) == served  # the torch run never touched the nki backend
    assert nki_ids == torch_ids
    assert all(len(ids) == NEW_TOKENS for ids in nki_ids)


@pytest.mark.slow
def test_nki_backend_bf16_matches_transformers_up_to_rounding_ties(tiny_model, monkeypatch):
    calls = _count_nki_calls(monkeypatch)
    nki_ids = _greedy(tiny_model(MODEL), "bfloat16", "nki", monkeypatch)
    assert all(calls[name] > 0 for name in LAYER_OPS), calls
    for prompt, got in zip(PROMPTS, nki_ids):
        want, want_logits = hf_greedy(tiny_model(MODEL), torch.bfloat16, prompt, NEW_TOKENS)
        assert_greedy_matches(got, want, want_logits, torch.bfloat16)
