#!/usr/bin/env bash
# `replay bench decode` and `replay bench offline` on the CPU with a tiny
# model: they run, print their tables, and reject bad options.
set -u
BIN=$1
pass=0
fail=0
check() { if [ "$2" = "$3" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1 (rc $3, expected $2)"; fi; }
contains() { case "$2" in *"$3"*) pass=$((pass + 1)) ;; *) fail=$((fail + 1)); echo "FAIL: $1: lacks '$3'"; echo "$2" | head -5 ;; esac; }
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --batch 1,3 --ctx 40 --steps 4 --warmup 1 --device cpu 2>/dev/null)
check "bench decode" 0 $?
contains "bench decode table" "$out" "tok/s"
[ "$(echo "$out" | grep -cE '^ +[13] +eager')" -eq 2 ]; check "a row per batch size" 0 $?
contains "steps overlap as in the engine" "$out" "steps: overlapped"
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --batch 2 --ctx 40 --steps 4 --warmup 0 --device cpu \
      --no-overlap 2>/dev/null)
check "bench decode --no-overlap" 0 $?
contains "steps one at a time" "$out" "steps: one at a time"
[ "$(echo "$out" | grep -cE '^ +2 +eager')" -eq 1 ]; check "--no-overlap row" 0 $?
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --batch 2 --ctx 40 --steps 4 --warmup 1 --device cpu \
      --temperature 0.8 --top-p 0.9 2>/dev/null)
check "bench decode --temperature" 0 $?
contains "sampled steps" "$out" "sampling: temperature 0.8, top-p 0.9"
[ "$(echo "$out" | grep -cE '^ +2 +eager')" -eq 1 ]; check "sampled row" 0 $?
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --temperature -1 2>&1); check "bad temperature" 2 $?
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --top-p 0 2>&1); check "bad top-p" 2 $?
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --top-p 1.5 2>&1); check "top-p above 1" 2 $?
# more warm-up steps than timed ones (the timing arrays hold both)
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --batch 1 --ctx 20 --steps 2 --warmup 9 --device cpu 2>/dev/null)
check "bench decode --warmup above --steps" 0 $?
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --num-prompts 40 --input-len 30 --output-len 12 \
      --random-range 0.3 --max-running-requests 16 --num-pages 40 --device cpu 2>/dev/null)
check "bench offline" 0 $?
contains "offline throughput" "$out" "output tokens/s"
contains "offline peak running" "$out" "peak running requests"
peak=$(echo "$out" | awk '/peak running requests/ {print $4}')
[ "${peak:-0}" -gt 1 ] && [ "${peak:-0}" -le 16 ]; check "continuous batching ran several at once, within the limit" 0 $?
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --random-range 2 2>&1); check "bad range" 2 $?
out=$("$BIN" bench decode --dummy-weights tiny-qwen3 --batch 0 2>&1); check "bad batch" 2 $?
out=$("$BIN" bench nope 2>&1); check "unknown bench" 2 $?
out=$("$BIN" profile --dummy-weights tiny-qwen3 --device cpu 2>&1); check "profile needs CUDA" 1 $?
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
