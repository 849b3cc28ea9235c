"""The docs' figures and links: docs/cpu-serving.md's memory table recomputed from the published configs.

The published configs: Qwen3.5-2B and Qwen3.5-35B-A3B as the model builder reads them
(``builder.published_dims``: transformers' config classes plus the published fields),
with their published layer counts; Qwen3-Next-80B-A3B as ``Qwen3NextConfig()``'s defaults
(its documented checkpoint). All with the published 262,144 positions.
"""

import re
import types

import pytest

from scripts import build_tiny_models as builder
from tests.support.serving import REPO
from vllm_gdn_neuron import cli
from vllm_gdn_neuron.preflight import kv_bytes_per_token, parameter_count, state_bytes_per_sequence, weight_bytes
from vllm_gdn_neuron.units import GiB

MEMORY_PAGE = (REPO / "docs" / "cpu-serving.md").read_text()


def _published(name: str) -> types.SimpleNamespace:
    import transformers

    if name == "Qwen/Qwen3-Next-80B-A3B-Instruct":
        fields = transformers.Qwen3NextConfig().to_dict()
    else:
        real = {"Qwen/Qwen3.5-2B": ("qwen3_5-2b-real", 24), "Qwen/Qwen3.5-35B-A3B": ("qwen3_5-35b-a3b-real", 40)}
        model, layers = real[name]
        fields = {**builder.published_dims(model), "num_hidden_layers": layers, "hidden_act": "silu",
                  "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "decoder_sparse_step": 1,
                  "mlp_only_layers": [], "attention_bias": False}
        fields.setdefault("num_experts", 0)
    return types.SimpleNamespace(**fields)


def _row(name: str) -> list[str]:
    for line in MEMORY_PAGE.splitlines():
        if line.startswith(f"| `{name}` |"):
            return [cell.strip() for cell in line.strip("|").split("|")]
    raise AssertionError(f"no row for {name} in docs/cpu-serving.md")


@pytest.mark.parametrize("name", ["Qwen/Qwen3.5-2B", "Qwen/Qwen3.5-35B-A3B", "Qwen/Qwen3-Next-80B-A3B-Instruct"])
def test_memory_table_rows_are_the_computed_figures(name):
    text = _published(name)
    weights = weight_bytes(text, "bfloat16")
    kv = kv_bytes_per_token(text, "bfloat16")
    state = state_bytes_per_sequence(text, "bfloat16")
    start = weights + cli.RUNTIME_BYTES + (state + cli.MIN_CONTEXT_TOKENS * kv) / cli.CACHE_SHARE
    sixteen = weights + cli.RUNTIME_BYTES + 16 * (state + 8192 * kv)
    want = [
        f"{parameter_count(text) / 1e9:.2f} B", f"{weights / GiB:.1f} GiB", f"{kv * 1024 / 2**20:.0f} MiB",
        f"{state / 2**20:.1f} MiB", f"{start / GiB:.1f} GiB", f"{sixteen / GiB:.1f} GiB",
    ]
    assert _row(name)[2:] == want


def test_links_stay_inside_the_repository():
    for doc in [REPO / "README.md", REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", doc.read_text()):
            assert "://" not in target and not target.startswith("/"), (doc.name, target)
            resolved = (doc.parent / target).resolve()
            assert resolved.is_relative_to(REPO) and resolved.exists(), (doc.name, target)
