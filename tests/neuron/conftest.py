"""Fixtures of the Neuron-shell harness: tiny checkpoints (built once per session) and the oracle."""

import importlib.util
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "e2e"))  # the transformers oracle (oracle.py)


def _load_builder():
    spec = importlib.util.spec_from_file_location("build_tiny_models", REPO / "configs" / "build_tiny_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


builder = _load_builder()


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
