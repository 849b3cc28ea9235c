"""The backend registry: each GatedDeltaNet phase of a layer resolved to a callable once, when the
layer is built, and logged once.

A layer's step has six phases: the short conv and the recurrence, each for prefill tokens,
decode rows and verify rows (``PHASES``). Each backend provides the paged ops of
``vllm_gdn_neuron.ops.paged``'s signatures for the phases it implements (``PAGED_OPS``);
``resolve_phases`` picks one backend per phase and returns the bound functions
(:class:`GDNPhases`), which the layer hands to ``gdn_mix`` at every call: no call reads the
environment or chooses again.

The recurrence phases take the layer's raw gating ``(a, b, A_log, dt_bias)`` in place of the
paged ops' g and beta (``vllm_gdn_neuron.ops.gating``): a backend with a raw-gating op for the
phase (``gating.RAW_GATING_OPS``: vLLM's fused decode and speculative-verify kernels, which
compute the gating themselves) is bound to it; any other backend's paged op is bound behind
``gating.GatesFirst``, which computes g and beta first (``gdn_gates``).

The choice, by ``VLLM_GDN_BACKEND`` (read once per layer, ``vllm_gdn_neuron.envs``):

- ``torch``: the trace-safe torch math (``ops.paged``) for every phase.
- ``nki``: the NKI kernels (``ops.backends.nki``, through ``kernels.adapter``) for the
  prefill and decode phases in either shell; verify rows on torch (no NKI verify kernels).
- ``vllm_cpu``: vLLM's C++ CPU kernels (``ops.backends.vllm_cpu``) for every phase they can
  run on the layer's shapes (``auto.refusal``), torch for the rest; verify rows' recurrence
  on the decode kernel's speculative variant.
- unset or ``auto``: on a Neuron device the NKI kernels where the real Neuron SDK runs them,
  else torch; on the CPU each phase on ``auto.choose``'s backend (verify rows' recurrence on
  the decode phase's, their conv on torch); elsewhere torch.
"""

import logging
from dataclasses import dataclass
from typing import Callable

from vllm_gdn_neuron import envs

from . import auto, paged
from .auto import ConvShape, GdnShape
from .gating import recurrence_op

logger = logging.getLogger(f"vllm.plugins.{__name__}")

BACKENDS = ("torch", "nki", "vllm_cpu")
NEURON_DEVICE_TYPES = ("xla", "neuron")
PHASES = ("conv_prefill", "conv_decode", "conv_verify", "gdn_prefill", "gdn_decode", "gdn_verify")
#: phase -> the name of its paged op in a backend module.
PAGED_OPS = {
    "conv_prefill": "paged_conv1d_prefill", "conv_decode": "paged_conv1d_decode",
    "conv_verify": "paged_conv1d_verify", "gdn_prefill": "paged_gdn_prefill",
    "gdn_decode": "paged_gdn_decode", "gdn_verify": "paged_gdn_verify",
}
#: The recurrence phases: a layer calls them with the raw gating (``vllm_gdn_neuron.ops.gating``).
RECURRENCE_PHASES = ("gdn_prefill", "gdn_decode", "gdn_verify")
#: The phase of ``auto``'s rules (``auto.PHASES``) whose choice a verify phase takes: the decode
#: phase's for the recurrence (its kernel has a speculative variant with the same per-token
#: update); verify rows' conv has the torch math only.
VERIFY_RULE = {"gdn_verify": "gdn_decode"}


def backend_module(name: str):
    """The module whose ``paged_*`` functions run backend ``name``."""
    if name == "torch":
        return paged
    if name == "nki":
        from .backends import nki

        return nki
    if name == "vllm_cpu":
        from .backends import vllm_cpu

        return vllm_cpu
    raise ValueError(f"backend: expected one of {BACKENDS}, got {name!r}")


def phase_op(module, phase: str) -> Callable:
    """What a layer calls for ``phase`` on backend ``module``: its paged op for a conv phase; for
    a recurrence phase ``gating.recurrence_op`` (its raw-gating op, else its paged op behind
    ``GatesFirst``)."""
    if phase in RECURRENCE_PHASES:
        return recurrence_op(module, PAGED_OPS[phase])
    return getattr(module, PAGED_OPS[phase])


@dataclass(frozen=True)
class GDNPhases:
    """The op of each phase of one GDN layer (``phase_op``), and the backend behind it.

    Attributes:
        conv_prefill, conv_decode, conv_verify: ``(x, weight, conv_cache, step, *, activation)``.
        gdn_prefill, gdn_decode, gdn_verify:
            ``(q, k, v, a, b, A_log, dt_bias, ssm_cache, step, *, scale, use_qk_l2norm)``: the
            raw gating (``vllm_gdn_neuron.ops.gating``).
        backends: phase -> backend name; reasons: phase -> why that backend.
    """

    conv_prefill: Callable
    conv_decode: Callable
    conv_verify: Callable
    gdn_prefill: Callable
    gdn_decode: Callable
    gdn_verify: Callable
    backends: dict
    reasons: dict

    @classmethod
    def bind(cls, backends: dict, reasons: dict) -> "GDNPhases":
        """The phases with the ops of ``backends`` (phase -> name); a backend module without a
        phase's op leaves that phase on torch."""
        backends = {phase: name if hasattr(backend_module(name), PAGED_OPS[phase]) else "torch"
                    for phase, name in backends.items()}
        ops = {phase: phase_op(backend_module(name), phase) for phase, name in backends.items()}
        return cls(**ops, backends=backends, reasons=reasons)

    def describe(self) -> str:
        """One line: each phase's backend and why."""
        return "; ".join(f"{phase.replace('_', ' ')} {self.backends[phase]} ({self.reasons[phase]})"
                         for phase in PHASES)


#: The torch math for every phase: traced graphs, and the model's own tests.
TORCH_PHASES = GDNPhases.bind(dict.fromkeys(PHASES, "torch"), dict.fromkeys(PHASES, "the torch math"))

_logged: set = set()


def nki_runs_here() -> bool:
    """The NKI kernels run on the real Neuron SDK here (not the CPU interpreter)."""
    try:
        from .backends import nki
    except ImportError:
        return False
    return nki.is_available()


def _vllm_cpu_choices(gdn: GdnShape, conv: ConvShape, choose) -> dict:
    """phase -> ``auto.Choice`` from ``choose(rule phase, shape)``, verify phases included."""
    rules = {phase: phase for phase in auto.PHASES}
    rules.update(VERIFY_RULE)
    choices = {phase: choose(rule, conv if rule.startswith("conv") else gdn) for phase, rule in rules.items()}
    choices["conv_verify"] = auto.Choice("torch", "verify rows' conv has the torch math only")
    return choices


def _refusal_choice(phase: str, shape) -> auto.Choice:
    why_not = auto.refusal(phase, shape)
    return auto.Choice("torch", why_not) if why_not else auto.Choice("vllm_cpu", "VLLM_GDN_BACKEND=vllm_cpu")


def resolve_phases(gdn: GdnShape, conv: ConvShape, device_type: str) -> GDNPhases:
    """The phases of a GDN layer of shapes ``gdn`` / ``conv`` on a ``device_type`` device.

    Reads ``VLLM_GDN_BACKEND`` (once per layer; the module docstring states the rules). The
    first layer of each choice logs it (one INFO line per choice and process, not per layer).

    Raises:
        ValueError: ``VLLM_GDN_BACKEND`` names no backend.
    """
    override = envs.gdn_backend()
    if override not in ("auto",) + BACKENDS:
        raise ValueError(f"{envs.GDN_BACKEND}: expected one of {('auto',) + BACKENDS}, got {override!r}")
    if override in ("torch", "nki"):
        reason = f"{envs.GDN_BACKEND}={override}"
        chosen = GDNPhases.bind(dict.fromkeys(PHASES, override), dict.fromkeys(PHASES, reason))
    elif override == "vllm_cpu":
        chosen = _from_choices(_vllm_cpu_choices(gdn, conv, _refusal_choice))
    elif device_type in NEURON_DEVICE_TYPES:
        name, reason = ("nki", f"on {device_type}") if nki_runs_here() else (
            "torch", f"on {device_type} without the Neuron SDK's nki")
        chosen = GDNPhases.bind(dict.fromkeys(PHASES, name), dict.fromkeys(PHASES, reason))
    elif device_type == "cpu":
        chosen = _from_choices(_vllm_cpu_choices(gdn, conv, auto.choose))
    else:
        reason = f"on {device_type}, not a CPU"
        chosen = GDNPhases.bind(dict.fromkeys(PHASES, "torch"), dict.fromkeys(PHASES, reason))
    line = chosen.describe()
    if line not in _logged:
        _logged.add(line)
        logger.info("vllm-gdn-neuron GDN layers (Hk/Hv %d/%d, Dk/Dv %d/%d, %s): %s", gdn.num_k_heads,
                    gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim, str(gdn.dtype).replace("torch.", ""), line)
    return chosen


def _from_choices(choices: dict) -> GDNPhases:
    return GDNPhases.bind({phase: c.backend for phase, c in choices.items()},
                          {phase: c.reason for phase, c in choices.items()})
