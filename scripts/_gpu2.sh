set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=.gpu/bin
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p /tmp/held && mv .gpu/bin/test_cuda_kernels .gpu/bin/test_cuda_attn_sm90 .gpu/bin/test_cuda_sample /tmp/held/ 2>/dev/null
OUT=$OUT/check bash scripts/gpu-check.sh tests 2>&1 | tail -6
echo "== llama3-8b oracle, new layout"
timeout 150 $B/replay bench decode --dummy-weights llama3-8b --batch 1,4,32 --ctx 512 --steps 64 --warmup 8 --no-eager \
    --speculative-tokens 4 --acceptance 0,0.5,0.7,0.9,1 2>$OUT/b1.err | grep -v "^$" | tail -17
echo "== llama3-8b oracle, k 3"
timeout 100 $B/replay bench decode --dummy-weights llama3-8b --batch 1 --ctx 512 --steps 64 --warmup 8 --no-eager \
    --speculative-tokens 3 --acceptance 0,0.7 2>>$OUT/b1.err | grep -v "^$" | tail -3
echo "== qwen3-8b with qwen3-0.6b"
timeout 150 $B/replay bench decode --dummy-weights qwen3-8b --batch 1 --ctx 512 --steps 64 --warmup 8 --no-eager \
    --speculative-tokens 4 --acceptance 0,0.7,1 --speculative-dummy-weights qwen3-0.6b 2>$OUT/b2.err | grep -v "^$" | tail -4
echo "== qwen3-0.6b oracle"
timeout 100 $B/replay bench decode --dummy-weights qwen3-0.6b --batch 1,32 --ctx 512 --steps 64 --warmup 8 --no-eager \
    --speculative-tokens 4 --acceptance 0,0.7 2>$OUT/b3.err | grep -v "^$" | tail -5
