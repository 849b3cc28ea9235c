"""Session-wide test settings shared by every test package."""

import collections
import os
import tempfile

import pytest

# vLLM writes model-inspection caches and compile artefacts under VLLM_CACHE_ROOT; keep
# them out of the user's home and away from other runs.
os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="vllm-gdn-cache-"))


@pytest.fixture
def nki_launches(monkeypatch):
    """A Counter of NKI kernel launches by kernel name, counting from the test's start."""
    from vllm_gdn_neuron.kernels import nki_call

    counts = collections.Counter()
    launch = nki_call.NkiOp.__call__

    def counting(self, *args, **kwargs):
        counts[self.name] += 1
        return launch(self, *args, **kwargs)

    monkeypatch.setattr(nki_call.NkiOp, "__call__", counting)
    return counts
