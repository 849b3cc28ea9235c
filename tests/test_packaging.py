"""The package installs as declared: every source package is listed, kernels stay a subpackage."""

import pathlib
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _source_packages():
    """Dotted names of every folder with an __init__.py, as installed."""
    roots = {"vllm_gdn_neuron": REPO / "vllm_gdn_neuron", "vllm_gdn_neuron.kernels": REPO / "kernels"}
    found = set()
    for prefix, root in roots.items():
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root).parts
            found.add(".".join((prefix, *rel)))
    return found


def test_every_source_package_is_listed_in_pyproject():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert _source_packages() == listed


def test_kernels_map_to_a_subpackage_not_a_top_level_module():
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert mapping["vllm_gdn_neuron.kernels"] == "kernels"
    assert "kernels" not in mapping


def test_core_dependencies_never_pull_vllm_or_an_unpinned_torch():
    for requirement in PYPROJECT["project"]["dependencies"]:
        name = requirement.split("=")[0].split(">")[0].split("<")[0].strip().lower()
        assert name not in {"vllm", "torch"}, requirement
    for extra, requirements in PYPROJECT["project"]["optional-dependencies"].items():
        for requirement in requirements:
            assert not requirement.lower().startswith("vllm=") and requirement.lower() != "vllm", extra
            if requirement.lower().startswith("torch") and not requirement.lower().startswith("torch-"):
                assert "==" in requirement, (extra, requirement)


def test_the_plugin_entry_point_is_declared():
    plugins = PYPROJECT["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins == {"vllm_gdn_neuron": "vllm_gdn_neuron:register"}
