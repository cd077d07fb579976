#!/usr/bin/env bash
# Branch tpstep's open question, on a two-GPU machine (nvidia-h200-x2), from the repository root
# after scripts/gpu-bundle.sh built the branch (or main with tpstep.patch applied) into .gpu/:
#   bash bench/experiments/tpstep-check.sh [runs]
# Runs test_cuda_tp's test_step_small (N = 2, the one-kernel step of a shard, forced steps read
# one by one) several times; a run still going after 60 s counts as hung, and then cuda-gdb (where
# present) prints every host thread's stack and the device's current kernel. Then bench decode
# llama3-8b at batch 1 on one GPU and two. bench/RESULTS.md, "Issue 42: two GPUs at last", says
# what it looks for.
set -u
G=${GPU_DIR:-.gpu}
export LD_LIBRARY_PATH="$PWD/$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 REPLAY_SOURCE_DIR="$PWD"
OUT=${OUT:-/tmp/tpstep-check}
mkdir -p "$OUT"
runs=${1:-6}
for r in $(seq "$runs"); do
  REPLAY_TP_SIZES=2 REPLAY_TEST_ONLY=test_step_small stdbuf -oL "$G/bin/test_cuda_tp" >"$OUT/run$r.log" 2>&1 &
  pid=$!
  for s in $(seq 60); do kill -0 $pid 2>/dev/null || break; sleep 1; done
  if kill -0 $pid 2>/dev/null; then
    echo "run $r: hung after 60 s"
    gdb=$(command -v cuda-gdb || command -v gdb)
    [ -n "$gdb" ] && timeout 90 "$gdb" -p $pid -batch -ex "thread apply all bt 30" >"$OUT/bt$r.txt" 2>&1
    kill -9 $pid
    wait $pid 2>/dev/null
  else
    wait $pid
    echo "run $r: exit $? after ${s} s: $(grep 'N=2' "$OUT/run$r.log")"
  fi
done
for n in 1 2; do
  echo "llama3-8b --tp $n:"
  timeout 120 "$G/bin/replay" bench decode --dummy-weights llama3-8b --batch 1 --ctx 512 --no-eager --steps 32 --tp $n 2>&1 |
    awk '$2 == "graph"'
done
