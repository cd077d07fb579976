#!/usr/bin/env bash
# A/B of decode variants on the GPU machine, one line per (model, switches):
#   bash bench/decode_ab.sh "MODELS" "ENV1;ENV2;..." [BATCHES]
# Each ENV is a space-separated list of VAR=value switches read at backend
# start (e.g. "REPLAY_GEMV_MAX_KS=1 REPLAY_GEMV_PF_KB=0"); "-" = defaults.
# Prints the graph ms/step of `replay bench decode ... --no-eager --steps 32`.
set -uo pipefail
G=${GPU_DIR:-.gpu}
export LD_LIBRARY_PATH="$PWD/$G/lib" REPLAY_SOURCE_DIR="$PWD"
models=$1 variants=$2 batches=${3:-1}
IFS=';' read -ra vs <<<"$variants"
for m in $models; do
  for v in "${vs[@]}"; do
    e=(); [ "$v" != "-" ] && read -ra e <<<"$v"
    t0=$SECONDS
    env "${e[@]}" "$G/bin/replay" bench decode --dummy-weights "$m" --batch "$batches" --ctx 512 --no-eager --steps 32 \
      2>&1 | awk -v m="$m" -v v="$v" -v s=$SECONDS '$2 == "graph" {printf "%-11s %-44s b=%-3s %s ms %s%%\n", m, v, $1, $3, $7}
                                                   /rror/ {print m, v, $0}'
    echo "  ($((SECONDS - t0)) s)" >&2
  done
done
