#!/usr/bin/env bash
# Set up the venv if needed, then run the whole test suite. Extra arguments go to pytest.
#
#   bash scripts/test.sh                   # everything but the soak (pyproject: -m 'not soak')
#   bash scripts/test.sh -m "not slow"     # the fast subset: no engine or server starts
#   bash scripts/test.sh -m soak           # the soak alone (1,000 requests through one server)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo_root/scripts/setup_env.sh"
cd "$repo_root"
# The whole tests/ folder unless the arguments name a test path themselves.
targets=(tests)
for arg in "$@"; do
    case "$arg" in tests/*|*.py|*.py::*) targets=() ;; esac
done
exec python -m pytest -ra "$@" "${targets[@]}"
