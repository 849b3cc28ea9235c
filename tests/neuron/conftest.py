"""Fixtures of the Neuron-shell harness: tiny checkpoints, built once per session (see neuron_testing.py)."""

import pytest

from neuron_testing import builder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """``tiny_model(name) -> folder``: a tiny checkpoint of ``scripts/build_tiny_models.py``, built on first use."""
    out = tmp_path_factory.mktemp("neuron-tiny-models")
    built = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = str(builder.build(name, out))
        return built[name]

    return get
