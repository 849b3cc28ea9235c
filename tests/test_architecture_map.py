"""``docs/architecture.md`` names every module of the tree, each under its own package.

The map is the fenced block at the top of that page: one header line per package
(``shells/vllm/``, ``shells/neuron/``, ``model/``, ``ops/``, ``kernels/``) and, below it, the modules of
that package by file name. A module counts as named when its file name (or its stem, as in
``*.py  NKI kernels (conv1d, gdn_cte, ...)``) appears in its package's lines; a kernel's
``*_torch.py`` mirror counts with its kernel; the files of a subfolder count when the folder
is named (``backends/torch/``, ``reference/``, ``interp/``). The package's top-level modules
(and those of ``shells/`` itself) may be named anywhere on the page.
"""

import pathlib
import re

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
