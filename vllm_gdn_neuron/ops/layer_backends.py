"""The backends one GDN layer runs on, chosen once when the layer is built and logged once.

A layer's eager step has four phases (``auto.PHASES``). ``layer_backends`` names the backend of
each from ``$VLLM_GDN_BACKEND`` when set, else from ``auto.choose`` on the layer's own shapes
(the CPU's instruction sets, or one short measurement per process), so no call of the layer
reads the environment or chooses again.
"""

import functools
import logging
import os
import types
from dataclasses import dataclass

from . import paged
from .auto import PHASES, ConvShape, GdnShape, choose
from .dispatch import BACKENDS, ENV_VAR, IN_PLACE_RULES

logger = logging.getLogger(f"vllm.plugins.{__name__}")

#: phase -> the paged op that runs it.
PAGED_OPS = {"conv_prefill": "paged_conv1d_prefill", "conv_decode": "paged_conv1d_decode",
             "gdn_prefill": "paged_gdn_prefill", "gdn_decode": "paged_gdn_decode"}
#: The phase whose backend verify rows' recurrence takes (``dispatch.IN_PLACE_RULES`` states the
#: rule: the decode phase's); the conv of verify rows has the torch math only.
VERIFY_PHASE = IN_PLACE_RULES["paged_gdn_verify"][0]


@dataclass(frozen=True)
class LayerBackends:
    """The backend of each phase of one GDN layer.

    Attributes:
        backends: phase -> ``"torch"`` or ``"vllm_cpu"``, the paged ops' ``backend=``.
        reasons: phase -> why that backend.
        dispatched: None, or the backend ``$VLLM_GDN_BACKEND`` names (``nki``, ``vllm_cpu``):
            the layer then runs the public ops on it (``gdn_mix(..., paged=False)``).
    """

    backends: dict
    reasons: dict
    dispatched: "str | None" = None

    @functools.cached_property
    def paged_ops(self):
        """The paged ops with their phase's backend bound (``gdn_mix``'s ``paged_ops``)."""
        ops = {name: functools.partial(getattr(paged, name), backend=self.backends[phase])
               for phase, name in PAGED_OPS.items()}
        return types.SimpleNamespace(
            **ops, paged_conv1d_verify=paged.paged_conv1d_verify,
            paged_gdn_verify=functools.partial(paged.paged_gdn_verify, backend=self.verify_backend))

    @property
    def verify_backend(self) -> str:
        """The backend of verify rows' recurrence: the decode phase's, or ``vllm_cpu`` where
        ``$VLLM_GDN_BACKEND`` dispatches to it (the NKI kernels have no verify op: torch)."""
        return "vllm_cpu" if self.dispatched == "vllm_cpu" else self.backends[VERIFY_PHASE]

    def describe(self) -> str:
        """One line: each phase's backend and why."""
        if self.dispatched:
            return f"every phase through the public ops on {self.dispatched!r} ({self.reasons['gdn_prefill']})"
        return "; ".join(f"{phase.replace('_', ' ')} {self.backends[phase]} ({self.reasons[phase]})"
                         for phase in PHASES)


_logged: set = set()


def layer_backends(gdn: GdnShape, conv: ConvShape, device_type: str) -> LayerBackends:
    """The backends of a GDN layer of shapes ``gdn`` / ``conv`` on a ``device_type`` device.

    ``$VLLM_GDN_BACKEND`` (read here, once per layer) overrides: ``torch`` pins the torch math
    everywhere; ``nki`` / ``vllm_cpu`` run the public ops on that backend. Without it, on the
    CPU each phase takes ``auto.choose``'s backend; elsewhere ``torch``. The first layer of each
    choice logs it (one INFO line per process, not one per layer).

    Raises:
        ValueError: ``$VLLM_GDN_BACKEND`` names no backend.
    """
    override = os.environ.get(ENV_VAR, "").strip()
    if override not in ("", "auto") and override not in BACKENDS:
        raise ValueError(f"{ENV_VAR}: expected one of {('auto',) + BACKENDS}, got {override!r}")
    if override in ("nki", "vllm_cpu"):
        chosen = LayerBackends(dict.fromkeys(PHASES, "torch"), dict.fromkeys(PHASES, f"{ENV_VAR}={override}"),
                               dispatched=override)
    elif override == "torch":
        chosen = LayerBackends(dict.fromkeys(PHASES, "torch"), dict.fromkeys(PHASES, f"{ENV_VAR}=torch"))
    elif device_type != "cpu":
        chosen = LayerBackends(dict.fromkeys(PHASES, "torch"), dict.fromkeys(PHASES, f"on {device_type}, not a CPU"))
    else:
        choices = {phase: choose(phase, conv if phase.startswith("conv") else gdn) for phase in PHASES}
        chosen = LayerBackends({phase: c.backend for phase, c in choices.items()},
                               {phase: c.reason for phase, c in choices.items()})
    line = chosen.describe()
    if line not in _logged:
        _logged.add(line)
        logger.info("vllm-gdn-neuron GDN layers (Hk/Hv %d/%d, Dk/Dv %d/%d, %s): %s", gdn.num_k_heads,
                    gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim, str(gdn.dtype).replace("torch.", ""), line)
    return chosen
