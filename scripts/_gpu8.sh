set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=.gpu/bin
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "== test_cuda_backend"; timeout 300 $B/test_cuda_backend > $OUT/tcb.log 2>&1; echo "rc=$?"; grep -E "FAILED|PASSED|ERROR|qwen2|biases" $OUT/tcb.log | head -20
echo "== compare decode"
timeout 150 python3 tools/gpu_compare.py --replay $B/replay --decode --shapes qwen2.5-7b 2>&1 | tail -5
echo "== bench qwen2.5-7b"
timeout 100 $B/replay bench decode --dummy-weights qwen2.5-7b --batch 1,4 --ctx 512 --steps 64 --no-eager 2>/dev/null | grep -E "^ +[0-9]+ +graph"
timeout 100 $B/replay bench decode --dummy-weights qwen2.5-7b --batch 1,4 --ctx 512 --steps 64 --no-eager --disable-decode-step 2>/dev/null | grep -E "^ +[0-9]+ +graph"
