set -u
export LD_LIBRARY_PATH=$PWD/.gpu/lib
B=.gpu/bin
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
bd() { timeout 250 $B/replay bench decode --ctx 512 --warmup 8 --no-eager "$@" 2>>$OUT/bench.err | grep -v "^$"; }
echo "== llama3-8b, the engine's rule, 256 tokens"
bd --dummy-weights llama3-8b --batch 1,4 --steps 256 --speculative-tokens 4 --acceptance 0,0.2,0.3,0.5,0.7 | tail -12
echo "== llama3-8b, always, 256 tokens"
bd --dummy-weights llama3-8b --batch 1 --steps 256 --speculative-tokens 4 --acceptance 0.3,0.5,0.7 --speculative-always | tail -4
