"""docker/ and the trn2 scripts lint clean (hadolint, shellcheck from the test extra)."""

import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
DOCKERFILES = sorted(p for p in (REPO / "docker").glob("Dockerfile.*") if p.suffix != ".dockerignore")
SCRIPTS = [REPO / "scripts" / "neuron_smoke.sh", REPO / "docker" / "trn2-entrypoint.sh"]


def _tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install '.[test]' provides it)")
    return path


def test_both_images_are_there():
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.trn2"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_lints_clean(dockerfile):
    run = subprocess.run([_tool("hadolint"), "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_lints_clean(script):
    run = subprocess.run([_tool("shellcheck"), str(script)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_trn2_image_base_is_a_build_argument_on_the_pinned_container():
    text = (REPO / "docker" / "Dockerfile.trn2").read_text()
    assert ("ARG VLLM_NEURON_IMAGE=public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:"
            "0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04") in text
    assert "FROM ${VLLM_NEURON_IMAGE}" in text
    # Every file the image copies exists.
    for line in text.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), source
