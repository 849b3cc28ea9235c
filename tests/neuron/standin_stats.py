"""What the vllm-neuron stand-ins (``vllm_neuron/``) report to the tests: one JSON file per process.

With ``VLLM_NEURON_STANDIN_STATS`` naming a folder, the stand-in scheduler and worker each
rewrite ``<kind>-<pid>.json`` there with their counts (graphs traced, steps by kind, ...);
unset, nothing is written. Each write replaces the file whole, so a reader never sees half of one.
"""

import json
import os

STATS_ENV = "VLLM_NEURON_STANDIN_STATS"


def report(kind: str, stats: dict) -> None:
    """Rewrite ``<folder>/<kind>-<pid>.json`` with ``stats`` (nothing without ``STATS_ENV``)."""
    folder = os.environ.get(STATS_ENV)
    if not folder:
        return
    path = os.path.join(folder, f"{kind}-{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(stats, f)
    os.replace(path + ".tmp", path)
