"""Shared pieces of the Neuron-shell tests: tests/e2e's tiny-model builder, engine and oracle.

Loaded under module names of their own (never ``conftest``), so the two test packages
cannot shadow each other whatever order pytest loads them in.
"""

import importlib.util
import pathlib
import sys

E2E = pathlib.Path(__file__).resolve().parents[1] / "e2e"
if str(E2E) not in sys.path:
    sys.path.append(str(E2E))  # oracle.py


def _load(name: str, path: pathlib.Path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


e2e = _load("e2e_conftest", E2E / "conftest.py")
oracle = _load("e2e_oracle", E2E / "oracle.py")
builder = e2e.builder
