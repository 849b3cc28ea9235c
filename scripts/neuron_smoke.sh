#!/usr/bin/env bash
# The first thing to run on a trn2 machine: is the device there, does the Neuron SDK import,
# is the plugin registered under its Neuron names, do the GDN ops match the float64
# references on the device, does a tiny model serve through the OpenAI API?
#
#   bash scripts/neuron_smoke.sh                       # with the environment's python3
#   PYTHON=/opt/venv/bin/python bash scripts/neuron_smoke.sh
#
# One line per check: [PASS] / [FAIL] / [SKIP], its name and what it saw; then a summary.
# Exit status: 0 every check passed; 1 a check failed; 3 no Neuron device (/dev/neuron0
# absent: host checks ran, device checks were skipped). The serve check compiles the tiny
# model first (a few minutes on a cold cache).
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
echo "neuron_smoke: $(uname -nm), $("$python" --version 2>&1) ($(command -v "$python"))"
exec "$python" "$repo_root/tests/integration/trn2/trn2_checks.py" "$@"
