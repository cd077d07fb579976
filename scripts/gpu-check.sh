#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after scripts/gpu-bundle.sh
# packed .gpu/ here and the device tool carried it there:
#   bash scripts/gpu-check.sh [tests] [sanitize] [compare] [bench] [bench-quick]
# (no argument: tests compare bench). Prints one table per stage; logs go to $OUT.
set -uo pipefail
G=${GPU_DIR:-.gpu}
export LD_LIBRARY_PATH="$PWD/$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export REPLAY_SOURCE_DIR="$PWD" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
stages=${*:-tests compare bench}
B=$G/bin
status=0
summary=()

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader

run_test() { # name
  local t0=$SECONDS
  if "$B/$1" >"$OUT/$1.log" 2>&1; then summary+=("$1: ok ($((SECONDS - t0))s)")
  else summary+=("$1: FAILED (see $1.log)"); status=1; tail -30 "$OUT/$1.log"; fi
}

for stage in $stages; do
  case $stage in
    tests)
      for t in "$B"/test_cuda_*; do run_test "$(basename "$t")"; done
      ;;
    sanitize)
      for tool in memcheck racecheck; do
        if compute-sanitizer --tool $tool --error-exitcode 9 "$B/test_cuda_kernels" >"$OUT/sanitize-$tool.log" 2>&1
        then summary+=("compute-sanitizer $tool: clean")
        else summary+=("compute-sanitizer $tool: ERRORS (see sanitize-$tool.log)"); status=1
             tail -20 "$OUT/sanitize-$tool.log"; fi
      done
      ;;
    compare)
      python3 tools/gpu_compare.py --replay "$B/replay" 2>&1 | tee "$OUT/compare.log" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      # the batch-1 decode path (one persistent kernel) against transformers
      python3 tools/gpu_compare.py --replay "$B/replay" --decode --shapes qwen3-0.6b,llama3.2-1b,qwen3-4b,llama3-8b \
        2>&1 | tee "$OUT/compare-decode.log" | tail -30
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    bench|bench-quick)
      shapes="qwen3-0.6b llama3.2-1b qwen3-4b qwen3-8b llama3-8b"
      batches=1,8,32,128
      [ "$stage" = bench-quick ] && shapes="qwen3-0.6b llama3-8b" && batches=1,32
      for s in $shapes; do
        "$B/replay" bench decode --dummy-weights "$s" --batch $batches --ctx 512 --steps 64 2>"$OUT/bench-$s.err" \
          | tee "$OUT/bench-$s.txt"
      done
      ;;
  esac
done
echo
printf '%s\n' "${summary[@]}"
exit $status
