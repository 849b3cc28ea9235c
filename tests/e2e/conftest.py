"""Fixtures of the end-to-end tests: the tiny and real-dims checkpoints; the engines are in ``engines.py``."""

import pathlib

from scripts import build_tiny_models as builder
import pytest

from engines import ENGINE_DEFAULTS, engine, greedy_in_subprocess, greedy_logprobs_in_subprocess  # noqa: F401 (the tests import them from here)

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """All tiny checkpoints, built once per test session: name -> folder."""
    out = tmp_path_factory.mktemp("tiny-models")
    return {name: str(builder.build(name, out)) for name in builder.MODELS}


@pytest.fixture(scope="session")
def real_dims_checkpoint(tmp_path_factory):
    """``name -> folder`` of a random checkpoint with published per-layer dims
    (``builder.REAL_MODELS``), each built on first use (1.5-2.6 GB, ~25 s) and kept for
    the session."""
    out = tmp_path_factory.mktemp("real-dims")
    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = str(builder.build(name, out))
        return built[name]

    return get
