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


def _module_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (function-level imports included).

    ``from a import b`` is an edge to ``a.b`` where that is a module, else to ``a``; a name
    outside the package (``vllm``, ``torch``) is no edge.
    """
    paths = {module: path for _, module, path in _modules()}
    graph = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                            for alias in node.names}
        graph[module] = {target for target in targets if target in paths and target != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``a -> b -> ... -> a``) per strongly connected group of modules (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for group in groups:  # a shortest way back to the group's first module, through the group
        start = min(group)
        paths, seen = [[start]], {start}
        while paths:
            path = paths.pop(0)
            following = sorted(graph[path[-1]] & group)
            if start in following:
                cycles.append(path + [start])
                break
            for nxt in following:
                if nxt not in seen:
                    seen.add(nxt)
                    paths.append(path + [nxt])
    return cycles


def test_no_import_cycle_among_the_packages_modules():
    cycles = _cycles(_module_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_the_cycle_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _cycles(graph) == [["a", "b", "c", "a"]]


#: What serves: the plugin, the CLI and both shells, and every module they reach.
SERVING_ROOTS = ("vllm_gdn_neuron.plugin", "vllm_gdn_neuron.cli", "vllm_gdn_neuron.shells")
#: Apart from what serves: the NKI interpreter (the tests and benchmarks opt in) and GDN-2.
APART = ("vllm_gdn_neuron.kernels.interp", "vllm_gdn_neuron.kernels.gdn2", "vllm_gdn_neuron.ops.gdn2")


def _reached(graph: dict[str, set[str]], roots) -> dict[str, str]:
    """Every module the roots reach -> the module that first imported it (a root: itself)."""
    parents = {module: module for module in graph if any(_is_under(module, root) for root in roots)}
    queue = list(parents)
    while queue:
        module = queue.pop(0)
        for target in sorted(graph[module]):
            if target not in parents:
                parents[target] = module
                queue.append(target)
    return parents


def test_no_serving_module_imports_the_interpreter_or_gdn2():
    reached = _reached(_module_graph(), SERVING_ROOTS)
    bad = sorted(f"{reached[module]} -> {module}" for module in reached
                 if any(_is_under(module, apart) for apart in APART))
    assert not bad, f"serving modules reach code kept apart: {bad}"
