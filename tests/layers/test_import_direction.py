"""The package's floors import downwards only: shells -> model definition -> ops -> kernels.

The two shells never import each other; what they share of vLLM's front end sits in ``shells/`` itself.

Every import statement of every module (function-level imports included) is read with
``ast``; relative imports are resolved against the module's package.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "vllm_gdn_neuron"

# floor -> modules it must never import (prefix match on the dotted name)
FORBIDDEN = {
    "kernels": ("vllm_gdn_neuron.ops", "vllm_gdn_neuron.model", "vllm_gdn_neuron.shells",
                "vllm_gdn_neuron.plugin", "vllm", "vllm_neuron"),
    "ops": ("vllm_gdn_neuron.model", "vllm_gdn_neuron.shells", "vllm_gdn_neuron.plugin", "vllm", "vllm_neuron"),
    "model": ("vllm_gdn_neuron.shells", "vllm_gdn_neuron.plugin", "vllm", "vllm_neuron"),
    "shells": ("vllm_gdn_neuron.shells.vllm", "vllm_gdn_neuron.shells.neuron", "vllm_gdn_neuron.plugin"),
    "shells.vllm": ("vllm_gdn_neuron.shells.neuron", "vllm_gdn_neuron.plugin", "vllm_neuron"),
    "shells.neuron": ("vllm_gdn_neuron.shells.vllm", "vllm_gdn_neuron.plugin"),
}


def _modules():
    """``(floor, dotted module name, path)`` of every source file of the package."""
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        floor = parts[1] if len(parts) > 2 else None
        if floor == "shells" and len(parts) > 3:
            floor = f"shells.{parts[2]}"
        yield floor, ".".join(p for p in parts if p != "__init__"), path
    for path in sorted((ROOT / "kernels").rglob("*.py")):
        parts = ("vllm_gdn_neuron",) + path.relative_to(ROOT).with_suffix("").parts
        yield "kernels", ".".join(p for p in parts if p != "__init__"), path


def _imports(module: str, path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def _is_under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


MODULES = [m for m in _modules() if m[0] in FORBIDDEN]


def test_every_floor_has_modules():
    assert {floor for floor, _, _ in MODULES} == set(FORBIDDEN)


@pytest.mark.parametrize(("floor", "module", "path"), MODULES, ids=[m[1] for m in MODULES])
def test_no_module_imports_upwards(floor, module, path):
    allowed_vllm = floor == "ops" and module.endswith("backends.vllm_cpu")  # vLLM's own CPU kernels
    bad = sorted(
        name for name in _imports(module, path)
        for prefix in FORBIDDEN[floor]
        if _is_under(name, prefix) and not (allowed_vllm and prefix == "vllm")
    )
    assert not bad, f"{module} ({floor}) imports {bad}"
