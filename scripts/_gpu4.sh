set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=.gpu/bin
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p /tmp/held && mv .gpu/bin/test_cuda_kernels .gpu/bin/test_cuda_attn_sm90 .gpu/bin/test_cuda_sample /tmp/held/ 2>/dev/null
OUT=$OUT/check bash scripts/gpu-check.sh tests 2>&1 | tail -5
bd() { timeout 200 $B/replay bench decode --ctx 512 --steps 64 --warmup 8 --no-eager "$@" 2>>$OUT/bench.err | grep -v "^$"; }
echo "== llama3-8b, the engine's rule"
bd --dummy-weights llama3-8b --batch 1,4 --speculative-tokens 4 --acceptance 0,0.2,0.3,0.5,0.7,0.9 | tail -14
echo "== qwen3-8b with qwen3-0.6b, the engine's rule"
bd --dummy-weights qwen3-8b --batch 1 --speculative-tokens 4 --acceptance 0,0.5,0.7,1 --speculative-dummy-weights qwen3-0.6b | tail -5
echo "== qwen3-8b with qwen3-0.6b k 3"
bd --dummy-weights qwen3-8b --batch 1 --speculative-tokens 3 --acceptance 0.7 --speculative-dummy-weights qwen3-0.6b | tail -2
