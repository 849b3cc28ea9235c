#!/usr/bin/env bash
# Entry point of the trn2 image: `vllm serve [MODEL] --config $CONFIG --host 0.0.0.0 [flags]`.
set -euo pipefail
cd /opt/vllm-gdn-neuron
# vllm-neuron 0.24 looks up the instance's EFA interface at engine start and stops when
# there is none (trn2.3xlarge has none); EFA affinity only places CPU threads.
if [ -z "${NEURON_SKIP_EFA_AFFINITY:-}" ] && [ -z "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
    export NEURON_SKIP_EFA_AFFINITY=1
fi
model=()
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    model=("$1")
    shift
fi
exec vllm serve "${model[@]}" --config "$CONFIG" --host 0.0.0.0 --port 8000 "$@"
