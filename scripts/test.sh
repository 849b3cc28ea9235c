#!/usr/bin/env bash
# Set up the venv if needed, then run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo_root/scripts/setup_env.sh"
cd "$repo_root"
exec python -m pytest -ra "$@" tests
