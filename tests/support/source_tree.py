"""The package's modules and their imports, read with ``ast`` (function-level imports included).

Modules are named as installed: ``kernels/`` is ``vllm_gdn_neuron.kernels``. Relative imports
are resolved against the importing module's package.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "vllm_gdn_neuron"
#: Source folder -> the dotted name it installs as.
SOURCES = {ROOT / PACKAGE: (PACKAGE,), ROOT / "kernels": (PACKAGE, "kernels")}


def modules() -> dict[str, pathlib.Path]:
    """Dotted name -> source file, for every module of the package."""
    found = {}
    for folder, prefix in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = prefix + path.relative_to(folder).with_suffix("").parts
            found[".".join(part for part in parts if part != "__init__")] = path
    return found


def _statements(module: str, path: pathlib.Path):
    """``(base, names)`` per import statement: ``import a.b`` is ``("a.b", ())``, ``from a import b, c``
    ``("a", ("b", "c"))``, with a relative base resolved against the module's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            yield base, tuple(alias.name for alias in node.names)


def imported_names(module: str, path: pathlib.Path) -> set[str]:
    """Every dotted name an import statement of the module names (``from a import b``: ``a`` and ``a.b``)."""
    found = set()
    for base, names in _statements(module, path):
        found.add(base)
        found |= {f"{base}.{name}" for name in names}
    return found


def module_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports.

    ``from a import b`` is an edge to ``a.b`` where that is a module, else to ``a``; ``import
    a.b`` to the longest of ``a.b``, ``a`` that is a module; a name outside the package
    (``vllm``, ``torch``) is no edge.
    """
    paths = modules()
    graph = {}
    for module, path in paths.items():
        targets = set()
        for base, names in _statements(module, path):
            for name in [f"{base}.{name}" if f"{base}.{name}" in paths else base for name in names] or [base]:
                while name and name not in paths:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def is_under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")
