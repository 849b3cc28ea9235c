"""The CPU's instruction sets that decide which GDN backend ``auto`` takes, read once per process.

vLLM's C++ GDN and conv kernels are built for x86 with AVX-512, and their speed against this
project's torch math depends on the instructions the CPU has (``vllm_gdn_neuron.ops.auto``
holds the rule per kind; the measurements behind it are in ``benchmarks/README.md``). This module
only says which of those instruction sets are present.
"""

import functools
import pathlib

import torch

#: The instruction sets ``auto`` tells apart, by their /proc/cpuinfo flag names.
AVX2, AVX512, AVX512_BF16, AMX_BF16 = "avx2", "avx512f", "avx512_bf16", "amx_bf16"
#: CPU kinds, most capable first: what ``cpu_kind`` returns.
KINDS = ("amx", "avx512_bf16", "avx512", "avx2", "other")

CPUINFO = pathlib.Path("/proc/cpuinfo")


def cpu_kind(flags) -> str:
    """The kind of a CPU with instruction-set ``flags`` (/proc/cpuinfo names).

    Returns:
        ``"amx"`` (AMX BF16 and AVX-512 BF16, Intel Sapphire Rapids on), ``"avx512_bf16"``
        (AVX-512 BF16 without AMX: AMD Zen 4 on, Intel Cooper Lake), ``"avx512"`` (AVX-512
        without BF16: Intel Skylake-SP to Ice Lake), ``"avx2"`` (no AVX-512), or ``"other"``
        (no AVX2: another architecture, or flags unknown).
    """
    flags = frozenset(flags)
    if AVX512_BF16 in flags:
        return "amx" if AMX_BF16 in flags else "avx512_bf16"
    if AVX512 in flags:
        return "avx512"
    return "avx2" if AVX2 in flags else "other"


def _flags_from_cpuinfo(text):
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return None


def _flags_from_torch():
    """The same instruction sets as torch's CPU capability probes see them."""
    probes = ((AVX2, torch.cpu._is_avx2_supported), (AVX512, torch.cpu._is_avx512_supported),
              (AVX512_BF16, torch.cpu._is_avx512_bf16_supported), (AMX_BF16, torch.cpu._is_amx_tile_supported))
    return frozenset(flag for flag, probe in probes if probe())


@functools.cache
def cpu_flags() -> frozenset:
    """This CPU's instruction-set flags: /proc/cpuinfo's (Linux x86), else torch's probes."""
    try:
        flags = _flags_from_cpuinfo(CPUINFO.read_text())
    except OSError:
        flags = None
    return flags if flags is not None else _flags_from_torch()
