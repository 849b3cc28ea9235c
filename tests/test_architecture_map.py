"""``docs/architecture.md`` names every module of the tree, each under its own package, and states
which part imports which.

The map is the fenced block at the top of that page: one header line per package
(``shells/vllm/``, ``shells/neuron/``, ``model/``, ``ops/``, ``kernels/``) and, below it, the modules of
that package by file name. A module counts as named when its file name (or its stem, as in
``*.py  NKI kernels (conv1d, gdn_cte, ...)``) appears in its package's lines; a kernel's
``*_torch.py`` mirror counts with its kernel; the files of a subfolder count when the folder
is named (``backends/torch/``, ``reference/``, ``interp/``). The package's top-level modules
(and those of ``shells/`` itself) may be named anywhere on the page.

The arrows are the fenced block under "Which part imports which": ``part -> part, part`` per
line, a part being a folder (``ops/``, ``kernels/interp/``) or a top-level module (``plugin.py``);
a module belongs to the longest part holding it. They must equal the imports between parts,
read from the source (:mod:`tests.support.source_tree`), both ways.
"""

import pathlib
import re

from tests.support import source_tree

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGES = ("shells/vllm", "shells/neuron", "model", "ops", "kernels")
HEADER = re.compile(rf"^[\s|+-]*({'|'.join(PACKAGES)})/\s")


def _map_sections() -> dict[str, str]:
    """package -> the map's lines from its header to the next header."""
    block = PAGE.read_text().split("```", 2)[1]
    sections, current = {}, None
    for line in block.splitlines():
        header = HEADER.match(line)
        if header:
            current = header.group(1)
            sections[current] = ""
        if current is not None:
            sections[current] += line + "\n"
    return sections


def _source_files():
    """``(package or None, path relative to the package folder)`` of every module file."""
    for path in sorted((ROOT / "vllm_gdn_neuron").rglob("*.py")):
        relative = path.relative_to(ROOT / "vllm_gdn_neuron")
        depth = 2 if relative.parts[0] == "shells" else 1
        if len(relative.parts) == depth:
            yield None, relative
        else:
            yield "/".join(relative.parts[:depth]), pathlib.Path(*relative.parts[depth:])
    for path in sorted((ROOT / "kernels").rglob("*.py")):
        yield "kernels", path.relative_to(ROOT / "kernels")


def _named(text: str, relative: pathlib.Path) -> bool:
    """A folder entry (``backends/torch/  ...``) for a file in a subfolder, else its name on a
    line that names its folder (``backends/nki.py``)."""
    stem = relative.stem.removesuffix("_torch")
    folder = "/".join(relative.parts[:-1])
    if folder and re.search(rf"(?<![\w/]){re.escape(folder)}/(\s|$)", text, re.MULTILINE):
        return True
    name = re.compile(rf"(?<![\w]){re.escape(stem)}(\.py)?\b")
    lines = text.splitlines() if not folder else [line for line in text.splitlines() if f"{folder}/" in line]
    return any(name.search(line) for line in lines)


def test_the_map_has_a_section_per_package():
    assert sorted(_map_sections()) == sorted(PACKAGES)


def test_every_module_is_on_the_map():
    sections = _map_sections()
    page = PAGE.read_text()
    missing = [f"{package or '.'}/{relative}" for package, relative in _source_files()
               if relative.name != "__init__.py" and not _named(page if package is None else sections[package], relative)]
    assert not missing, f"not named in their package's lines of {PAGE.relative_to(ROOT)}'s map: {missing}"


# --- the arrows ----------------------------------------------------------------------------

ARROWS_HEADING = "## Which part imports which"
ARROW = re.compile(r"^(\S+)\s+->\s+(.+?)\s*$")


def _stated_arrows() -> dict[str, set[str]]:
    """part -> the parts it imports, from the fenced block under :data:`ARROWS_HEADING`."""
    text = PAGE.read_text()
    assert ARROWS_HEADING in text, f"{PAGE.name} has no {ARROWS_HEADING!r} section"
    block = text.split(ARROWS_HEADING, 1)[1].split("```", 2)[1]
    arrows = {}
    for line in block.splitlines():
        match = ARROW.match(line)
        if match:
            source, targets = match.groups()
            arrows[source] = set() if targets == "nothing" else {t.strip() for t in targets.split(",")}
    return arrows


def _part_of(path: pathlib.Path, parts) -> str | None:
    """The longest part (a folder ``ops/``, ``kernels/interp/``, or a file ``plugin.py``) holding the file."""
    relative = (path.relative_to(ROOT) if path.is_relative_to(ROOT / "kernels")
                else path.relative_to(ROOT / "vllm_gdn_neuron")).as_posix()
    holding = [part for part in parts if relative == part or (part.endswith("/") and relative.startswith(part))]
    return max(holding, key=len, default=None)


def _actual_arrows(parts) -> tuple[dict[str, set[str]], list[str]]:
    """part -> the other parts its modules import, and the modules no part holds."""
    paths = source_tree.modules()
    owner = {module: _part_of(path, parts) for module, path in paths.items()}
    arrows = {part: set() for part in parts}
    for module, targets in source_tree.module_graph().items():
        for target in targets:
            if owner[module] and owner[target] and owner[module] != owner[target]:
                arrows[owner[module]].add(owner[target])
    return arrows, sorted(module for module, part in owner.items() if part is None)


def test_every_module_belongs_to_a_part_with_an_arrow():
    _, homeless = _actual_arrows(_stated_arrows())
    assert not homeless, f"modules in no part of {PAGE.name}'s {ARROWS_HEADING!r}: {homeless}"


def test_the_arrows_on_the_page_are_the_imports():
    """Both ways: every stated arrow is an import of the tree, every import between parts is stated."""
    stated = _stated_arrows()
    actual, _ = _actual_arrows(stated)
    missing = sorted(f"{a} -> {b}" for a in actual for b in actual[a] - stated[a])
    stale = sorted(f"{a} -> {b}" for a in stated for b in stated[a] - actual[a])
    assert not missing and not stale, f"imports not on the page: {missing}; arrows no import makes: {stale}"
