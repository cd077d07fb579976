set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=.gpu/bin
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "== fixtures"
mkdir -p $OUT/fixtures
timeout 200 python3 tools/make_fixtures.py $OUT/fixtures qwen2-bias qwen2-hd128 mistral-hd24 qwen3-yarn llama3-linear > $OUT/fixtures.log 2>&1; echo "rc=$?"; tail -5 $OUT/fixtures.log
for t in test_cuda_kernels test_cuda_backend; do
  echo "== $t"; timeout 240 $B/$t > $OUT/$t.log 2>&1; echo "rc=$?"; grep -E "FAILED|PASSED|ERROR" $OUT/$t.log | head -10
done
echo "== compare"
timeout 200 python3 tools/gpu_compare.py --replay $B/replay --shapes tiny-qwen2,qwen2.5-7b,mistral-7b 2>&1 | tail -12
timeout 200 python3 tools/gpu_compare.py --replay $B/replay --decode --shapes qwen2.5-7b,mistral-7b 2>&1 | tail -8
