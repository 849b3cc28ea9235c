"""Fixtures of the Neuron-shell harness: tiny checkpoints (built once per session) and the oracle.

The tiny-model builder, the transformers oracle and the in-process vLLM engine come from
``tests/e2e`` (loaded here under other module names, so the two test packages never mix).
"""

import importlib.util
import pathlib
import sys

import pytest

E2E = pathlib.Path(__file__).resolve().parents[1] / "e2e"
sys.path.insert(0, str(E2E))  # the transformers oracle (oracle.py)


def _load_e2e_conftest():
    spec = importlib.util.spec_from_file_location("e2e_conftest", E2E / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


e2e = _load_e2e_conftest()
builder = e2e.builder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """``tiny_model(name) -> folder``: a tiny checkpoint of ``configs/build_tiny_models.py``, built on first use."""
    out = tmp_path_factory.mktemp("neuron-tiny-models")
    built = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = str(builder.build(name, out))
        return built[name]

    return get
