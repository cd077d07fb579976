#!/usr/bin/env bash
# A/B of decode variants on the GPU machine, one line per (model, variant, round):
#   bash bench/decode_ab.sh "MODELS" "VARIANT1;VARIANT2;..." [BATCHES]
# A variant is a build and the extra `bench decode` options it runs with
# (e.g. "--disable-decode-step"); "-" = none. A variant that starts with
# "old:" runs $G/old/replay, the build of another revision that
# `AB_BASE=REV bash scripts/gpu-bundle.sh` packed ("old:-" = that build with
# no extra options), so a change and its base are compared in one call
# (H100s differ by a few per cent on one binary); likewise "NAME:" runs
# $G/NAME/replay (AB_BASE="NAME=REV ..."; TRACE=1 packs the trace build as
# "trace:"). Tuning values that are not options are compared as builds of
# revisions that set them. ROUNDS=N (default 1) runs
# the whole list N times, interleaved. Prints the graph ms/step of
# `replay bench decode ... --no-eager --steps 32`; a run that takes over
# RUN_TIMEOUT seconds (default 60: a hung variant) is stopped and says so.
set -uo pipefail
G=${GPU_DIR:-.gpu}
export LD_LIBRARY_PATH="$PWD/$G/lib" REPLAY_SOURCE_DIR="$PWD"
models=$1 variants=$2 batches=${3:-1} rounds=${ROUNDS:-1}
IFS=';' read -ra vs <<<"$variants"
for m in $models; do
  for ((r = 1; r <= rounds; r++)); do
    for v in "${vs[@]}"; do
      bin="$G/bin/replay" sw=$v
      if [[ $sw =~ ^([A-Za-z0-9_.-]+):(.*)$ && -x $G/${BASH_REMATCH[1]}/replay ]]; then
        bin="$G/${BASH_REMATCH[1]}/replay" sw=${BASH_REMATCH[2]}
      fi
      e=(); [ "$sw" != "-" ] && read -ra e <<<"$sw"
      t0=$SECONDS
      timeout "${RUN_TIMEOUT:-60}" "$bin" bench decode --dummy-weights "$m" --batch "$batches" \
        --ctx 512 --no-eager --steps 32 "${e[@]}" \
        2>&1 | awk -v m="$m" -v v="$v" '$2 == "graph" {printf "%-11s %-44s b=%-3s %s ms %s\n", m, v, $1, $3, $7}
                                         /rror/ {print m, v, $0}'
      rc=${PIPESTATUS[0]}
      [ "$rc" = 124 ] && echo "$m $v: stopped after ${RUN_TIMEOUT:-60} s"
      echo "  ($((SECONDS - t0)) s)" >&2
    done
  done
done
