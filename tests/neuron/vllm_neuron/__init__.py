"""The tests' stand-in of vllm-neuron: its platform, scheduler and worker at their real module paths.

vllm-neuron (the Neuron SDK's vLLM plugin) cannot be installed here. This package stands in
for the parts of it that sit between vLLM's engine and this project's Neuron shell, each
written from the pinned fork's source (whn09/vllm-neuron @
``7ea992789fa624ea6b0d7ad4cb0789e784863904`` unless a module says otherwise):

- :mod:`vllm_neuron.vllm.platform`: ``NeuronPlatform`` in the fork's CPU mode (device ``cpu``),
  with the configuration hooks that touch this plugin;
- :mod:`vllm_neuron.vllm.core.scheduler`: ``NeuronScheduler`` / ``NeuronAsyncScheduler``;
- :mod:`vllm_neuron.vllm.worker.neuron_worker`: ``NeuronWorker``, hosting the runner stand-in
  (``tests/neuron/runner.py``).

vLLM finds it as a platform plugin (entry point group ``vllm.platform_plugins``, name
``neuron``, declared by the ``vllm_neuron_standin-*.dist-info`` folder beside this package;
pytest's configured ``pythonpath`` puts ``tests/neuron`` on ``sys.path``) and activates it only
when ``VLLM_NEURON_STANDIN=1``; otherwise vLLM's CPU platform is chosen as usual. vLLM picks its
platform once per process, so a test that needs this one runs vLLM in a fresh process with
``tests/neuron`` and the repository root on ``PYTHONPATH`` (the worker imports the runner
harness as ``tests.neuron.runner``): ``tests/neuron/front_end.py``, ``test_engine_serving.py``.

The package keeps vllm-neuron's module names so that everything the real stack does by name
works unchanged: the class paths the platform writes into vLLM's config, and the plugin's
own check that the current platform comes from ``vllm_neuron``.
"""

import os

ACTIVATE_ENV = "VLLM_NEURON_STANDIN"


def register() -> str | None:
    """vLLM's platform-plugin hook: the platform's class path when activated, else None."""
    if os.environ.get(ACTIVATE_ENV) == "1":
        return "vllm_neuron.vllm.platform.NeuronPlatform"
    return None
