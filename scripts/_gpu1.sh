set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=.gpu/bin
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p /tmp/held && mv .gpu/bin/test_cuda_* /tmp/held/ 2>/dev/null
OUT=$OUT/check bash scripts/gpu-check.sh tests 2>&1 | tail -8
for pair in "qwen3-8b qwen3-0.6b" "llama3-8b llama3.2-1b"; do
  set -- $pair
  echo "== $1 with draft $2"
  timeout 200 $B/replay bench decode --dummy-weights $1 --batch 1,4 --ctx 512 --steps 64 --warmup 8 --no-eager \
    --speculative-tokens 4 --acceptance 0,0.5,0.7,0.9,1 --speculative-dummy-weights $2 2>$OUT/bench-$1.err | grep -v "^$"
  tail -3 $OUT/bench-$1.err
done
