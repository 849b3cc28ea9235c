"""Session-wide test settings shared by every test package."""

import collections
import os
import tempfile

import pytest

# The NKI kernels run in the project's CPU interpreter where the Neuron SDK is absent (an explicit
# opt-in: no serving module imports it).
import vllm_gdn_neuron.kernels.interp  # noqa: F401

# vLLM writes model-inspection caches and compile artefacts under VLLM_CACHE_ROOT; keep
# them out of the user's home and away from other runs, and, under pytest-xdist, each
# worker's away from the other's.
_cache_root = os.environ.get("VLLM_CACHE_ROOT") or tempfile.mkdtemp(prefix="vllm-gdn-cache-")
os.environ["VLLM_CACHE_ROOT"] = os.path.join(_cache_root, os.environ.get("PYTEST_XDIST_WORKER", ""))

#: Folders (and files) whose tests start vLLM engines, servers or transformers' real-dims
#: oracles. Under pytest-xdist (scripts/test.sh runs two workers) they are one unit of work: one
#: worker runs them one after another, so that two never share the two cores and the memory (a
#: real-dims engine or oracle holds 3-8 GiB; a server derives its cache from the memory free at
#: its start), while the other worker runs the rest test by test.
ENGINE_FOLDERS = ("tests/e2e/", "tests/integration/", "tests/neuron/test_engine_serving.py")


@pytest.fixture(autouse=True)
def gdn_backend_read_afresh():
    """The public GDN ops read ``VLLM_GDN_BACKEND`` once per process: each test starts as a fresh
    process would, reading what it set."""
    from vllm_gdn_neuron.ops import dispatch

    dispatch.env_override.cache_clear()
    yield


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's default (``--dist load``) with ``ENGINE_FOLDERS`` as one unit; another ``--dist``
    mode given on the command line is left to xdist."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class EngineTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return "engines" if nodeid.startswith(ENGINE_FOLDERS) else nodeid

    return EngineTestsTogether(config, log)


@pytest.fixture(autouse=True)
def one_thread_beside_another_worker(request):
    """Outside ``ENGINE_FOLDERS``, torch runs each test on one thread when pytest-xdist runs
    more than one worker.

    Two workers on this project's 2-core machines would otherwise run two threads each: every
    parallel torch op then waits at its barrier for a thread that the other worker's threads
    keep off a core (the fast subset took 127-139 s so, 38-40 s with one thread a worker, on a
    2-vCPU Intel Xeon). The engine tests keep the threads vLLM's CPU worker binds for them.
    ``one_torch_thread`` works after an in-process vLLM engine has made
    ``torch.set_num_threads`` a no-op, and a worker may run such an engine first.
    """
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2 or request.node.nodeid.startswith(ENGINE_FOLDERS):
        yield
        return
    from vllm_gdn_neuron.ops.auto import one_torch_thread

    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """``tiny_model(name) -> folder``: a checkpoint of ``scripts/build_tiny_models.py`` (a tiny one,
    or a real-dims one of ``builder.REAL_MODELS``), built on first use and kept for the session."""
    from scripts import build_tiny_models as builder

    out = tmp_path_factory.mktemp("tiny-models")
    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = str(builder.build(name, out))
        return built[name]

    return get


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
