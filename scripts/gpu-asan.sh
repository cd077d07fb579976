#!/usr/bin/env bash
# On the GPU machine: the host code of the CUDA paths under AddressSanitizer
# + UndefinedBehaviorSanitizer (`make test` sanitizes only the CPU build).
# Pack it here with `ASAN=1 bash scripts/gpu-bundle.sh`; carry .gpu; run
#   bash scripts/gpu-asan.sh
# Prints one line per check and the first sanitizer report of a failing one.
set -uo pipefail
G=${GPU_DIR:-.gpu}
A=/tmp/replay-asan
rm -rf "$A" && mkdir -p "$A"
tar xzf "$G/asan.tgz" -C "$A" || { echo "no $G/asan.tgz (ASAN=1 gpu-bundle.sh)"; exit 2; }
export LD_LIBRARY_PATH="$A:$PWD/$G/lib" REPLAY_SOURCE_DIR="$PWD"
# CUDA maps memory where ASan's shadow gap would be protected
export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
fail=0
report="runtime error\|ERROR: AddressSanitizer\|ERROR: LeakSanitizer"
check() {
  local name=$1; shift
  timeout 300 "$@" >/tmp/asan_out.txt 2>&1
  local rc=$?
  if [ $rc = 0 ] && ! grep -q "$report" /tmp/asan_out.txt; then
    echo "ok    $name"
  else
    fail=$((fail + 1)); echo "FAIL  $name (rc $rc)"
    grep -m1 -A14 "$report" /tmp/asan_out.txt || tail -5 /tmp/asan_out.txt
  fi
}
check "bench decode" "$A/replay" bench decode --dummy-weights qwen3-0.6b --batch 1,3,8 --ctx 64 --steps 4 --warmup 6
check "bench decode --no-overlap" "$A/replay" bench decode --dummy-weights llama3.2-1b --batch 2 --ctx 40 --steps 3 \
  --no-overlap
check "profile" "$A/replay" profile --dummy-weights qwen3-0.6b --batch 2 --steps 3
check "generate" "$A/replay" generate --dummy-weights qwen3-0.6b --device cuda --prompt-ids 1,2,3,4,5 --print-ids \
  --max-tokens 8
check "bench offline" "$A/replay" bench offline --dummy-weights qwen3-0.6b --device cuda --num-prompts 24 \
  --input-len 40 --output-len 16 --random-range-ratio 0.5 --max-running-requests 8
check "test_cuda_backend" "$A/test_cuda_backend"
check "test_cuda_sample" "$A/test_cuda_sample"
echo "$fail failed"
[ $fail = 0 ]
