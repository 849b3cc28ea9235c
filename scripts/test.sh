#!/usr/bin/env bash
# Set up the venvs if needed, then run the whole test suite on vLLM 0.32 (the main venv), then
# the vLLM 0.24 lane: the tests marked vllm024 again in the vLLM 0.24 venv (the vLLM that
# vllm-neuron pins on trn2; scripts/setup_env.sh). Extra arguments go to pytest.
#
#   bash scripts/test.sh                   # everything but the soak (pyproject: -m 'not soak'), then the lane
#   bash scripts/test.sh -m "not slow"     # the fast subset: no engine or server starts; the lane: -m "vllm024 and (not slow)"
#   bash scripts/test.sh -m soak           # the soak alone (1,000 requests through one server); the lane selects none
#   bash scripts/test.sh -n 0              # in this process, one test at a time (no workers), the lane too
#   bash scripts/test.sh tests/test_x.py   # a named test path runs alone, in the main venv only
#   VLLM024_LANE=0 bash scripts/test.sh    # no lane (and no lane venv set up)
#
# The lane gets the same arguments, its marker joined to a -m expression (-m EXPR ->
# -m "vllm024 and (EXPR)"); where that selects no test it passes. It runs only where no test path
# is named. Either run failing fails the script.
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
lane="${VLLM024_LANE:-1}"
lane_marker=vllm024
lane_args=()
next_is_marker=0
for arg in "$@"; do
    case "$arg" in tests/*|*.py|*.py::*) targets=(); lane=0 ;; esac
    if [ "$next_is_marker" = 1 ]; then
        lane_marker="vllm024 and ($arg)"
        next_is_marker=0
    elif [ "$arg" = -m ]; then
        next_is_marker=1
    else
        lane_args+=("$arg")
    fi
done

status=0
python -m pytest -ra -n 2 "$@" "${targets[@]}" || status=$?
[ "$lane" = 0 ] && exit "$status"
main_s=$SECONDS

echo "[test] the vLLM 0.24 lane ($VENV_VLLM024): -m \"$lane_marker\"" >&2
lane_status=0
"$VENV_VLLM024/bin/python" -m pytest -ra -n 2 "${lane_args[@]}" -m "$lane_marker" tests || lane_status=$?
[ "$lane_status" = 5 ] && [ "$lane_marker" != vllm024 ] && lane_status=0  # the -m given selects none of the lane
echo "[test] vLLM 0.32 (main venv): exit $status, ${main_s} s with set-up; vLLM 0.24 lane: exit $lane_status," \
     "$((SECONDS - main_s)) s" >&2
[ "$status" != 0 ] && exit "$status"
exit "$lane_status"
