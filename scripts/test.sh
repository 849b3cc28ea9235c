#!/usr/bin/env bash
# Set up the venv if needed, then run the whole test suite. Extra arguments go to pytest.
#
#   bash scripts/test.sh                   # everything but the soak (pyproject: -m 'not soak')
#   bash scripts/test.sh -m "not slow"     # the fast subset: no engine or server starts
#   bash scripts/test.sh -m soak           # the soak alone (1,000 requests through one server)
#   bash scripts/test.sh -n 0              # in this process, one test at a time (no workers)
#
# Two pytest-xdist workers: most tests outside the engine group trace, lower and compare graphs
# on one thread, so a second worker uses the second core; the tests that start vLLM engines or
# servers stay on one worker, one at a time (tests/conftest.py).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo_root/scripts/setup_env.sh"
cd "$repo_root"
# The whole tests/ folder unless the arguments name a test path themselves.
targets=(tests)
for arg in "$@"; do
    case "$arg" in tests/*|*.py|*.py::*) targets=() ;; esac
done
exec python -m pytest -ra -n 2 "$@" "${targets[@]}"
