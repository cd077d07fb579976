set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=.gpu/bin
echo "== test_cuda_backend"; timeout 300 $B/test_cuda_backend > $OUT/tcb.log 2>&1; echo "rc=$?"; grep -E "FAILED|PASSED" $OUT/tcb.log | head -5
echo "== a draft model that does not fit"
timeout 120 $B/replay generate --dummy-weights llama3-8b --speculative-dummy-weights llama3-8b --gpu-memory-utilization 0.25 \
  --prompt-ids 1,2,3 --max-tokens 4 2>&1 | tail -2; echo "rc=${PIPESTATUS[0]}"
echo "== a draft model beside: serve-like run with qwen3-8b + qwen3-0.6b draft, n-gram-free prompt"
timeout 120 $B/replay generate --dummy-weights qwen3-8b --speculative-dummy-weights qwen3-0.6b --prompt-ids 1,2,3 \
  --max-tokens 64 --temperature 0 --ignore-eos 2>&1 | grep -E "draft model|KV|stats" | tail -4
