set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=.gpu/bin
mkdir -p /tmp/held && mv .gpu/bin/test_cuda_* /tmp/held/ 2>/dev/null
OUT=$OUT/check bash scripts/gpu-check.sh tests 2>&1 | grep -E "speculative|draft model"
for v in old new; do
  bin=$B/replay; [ $v = old ] && bin=.gpu/old/replay
  echo "== $v: bench offline, qwen3-8b with qwen3-0.6b draft (random: few kept) and self-draft qwen3-0.6b"
  timeout 100 $bin bench offline --dummy-weights qwen3-0.6b --speculative-dummy-weights qwen3-0.6b --num-prompts 1 --input-len 32 --output-len 256 2>/dev/null | grep -E "output tok|speculative|draft model"
done
