"""The package's floors import downwards only: shells -> model definition -> ops -> kernels.

The two shells never import each other; what they share of vLLM's front end sits in ``shells/`` itself.

Every import statement of every module (function-level imports included) is read with
``ast``; relative imports are resolved against the module's package.
"""

import pytest

from tests.support import source_tree

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


def _floor(path) -> str | None:
    """``kernels``, ``ops``, ``model``, ``shells``, ``shells.vllm``, ``shells.neuron``: the folder a
    source file sits in; None for a top-level module of the package."""
    if source_tree.ROOT / "kernels" in path.parents:
        return "kernels"
    parts = path.relative_to(source_tree.ROOT / source_tree.PACKAGE).parts
    if len(parts) == 1:
        return None
    return f"shells.{parts[1]}" if parts[0] == "shells" and len(parts) > 2 else parts[0]


MODULES = [(_floor(path), module, path) for module, path in source_tree.modules().items()
           if _floor(path) in FORBIDDEN]


def test_every_floor_has_modules():
    assert {floor for floor, _, _ in MODULES} == set(FORBIDDEN)


@pytest.mark.parametrize(("floor", "module", "path"), MODULES, ids=[m[1] for m in MODULES])
def test_no_module_imports_upwards(floor, module, path):
    allowed_vllm = floor == "ops" and module.endswith("backends.vllm_cpu")  # vLLM's own CPU kernels
    bad = sorted(
        name for name in source_tree.imported_names(module, path)
        for prefix in FORBIDDEN[floor]
        if source_tree.is_under(name, prefix) and not (allowed_vllm and prefix == "vllm")
    )
    assert not bad, f"{module} ({floor}) imports {bad}"


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
    cycles = _cycles(source_tree.module_graph())
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
    parents = {module: module for module in graph if any(source_tree.is_under(module, root) for root in roots)}
    queue = list(parents)
    while queue:
        module = queue.pop(0)
        for target in sorted(graph[module]):
            if target not in parents:
                parents[target] = module
                queue.append(target)
    return parents


def test_no_serving_module_imports_the_interpreter_or_gdn2():
    reached = _reached(source_tree.module_graph(), SERVING_ROOTS)
    bad = sorted(f"{reached[module]} -> {module}" for module in reached
                 if any(source_tree.is_under(module, apart) for apart in APART))
    assert not bad, f"serving modules reach code kept apart: {bad}"
