set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=.gpu/bin
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
bd() { timeout 200 $B/replay bench decode --ctx 512 --steps 64 --warmup 8 --no-eager "$@" 2>>$OUT/bench.err | grep -v "^$"; }
echo "== llama3-8b, the engine's rule"
bd --dummy-weights llama3-8b --batch 1,4 --speculative-tokens 4 --acceptance 0,0.2,0.3,0.5,0.7,0.9 | tail -14
echo "== llama3-8b, always"
bd --dummy-weights llama3-8b --batch 1 --speculative-tokens 4 --acceptance 0,0.7 --speculative-always | tail -3
echo "== qwen3-8b with qwen3-0.6b, the engine's rule"
bd --dummy-weights qwen3-8b --batch 1 --speculative-tokens 4 --acceptance 0,0.5,0.7,1 --speculative-dummy-weights qwen3-0.6b | tail -5
