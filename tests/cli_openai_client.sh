#!/usr/bin/env bash
# The official `openai` npm client (pinned, installed into .cache/npm-openai
# on first use) against `replay serve` on a free loopback port.
set -u
BIN=$1
SRC=$2
OPENAI_VERSION=4.104.0
deps="$SRC/.cache/npm-openai"
tok="$SRC/.cache/tokenizers/qwen3"
if [ ! -f "$deps/node_modules/openai/package.json" ] ||
   ! grep -q "\"version\": \"$OPENAI_VERSION\"" "$deps/node_modules/openai/package.json"; then
  mkdir -p "$deps"
  # the same lock as tests/cli_server_openai.sh: ctest runs both at once on a fresh cache
  (flock 9; grep -qs "\"version\": \"$OPENAI_VERSION\"" "$deps/node_modules/openai/package.json" ||
    (cd "$deps" && npm install --silent --no-audit --no-fund --no-save "openai@$OPENAI_VERSION" >/dev/null 2>&1)) \
    9>"$deps.lock" || { echo "cannot install openai@$OPENAI_VERSION from npm"; echo "0 passed, 1 failed"; exit 1; }
fi
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$tmp/"
cat > "$tmp/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
 "tie_word_embeddings": false, "eos_token_id": 151645, "max_position_embeddings": 512}
JSON
for try in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 40000))
  "$BIN" serve --model "$tmp" --load-format dummy --served-model-name tiny --api-key sekrit --port "$port" \
    --num-pages 64 --device cpu -q &
  pid=$!
  up=0
  for _ in $(seq 50); do
    curl -s -o /dev/null "http://127.0.0.1:$port/health" && { up=1; break; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [ $up = 1 ] && break
  kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=
done
[ -n "$pid" ] || { echo "server did not start"; echo "0 passed, 1 failed"; exit 1; }
cp "$SRC/tests/openai_client.mjs" "$deps/"
node "$deps/openai_client.mjs" "http://127.0.0.1:$port/v1" tiny
rc=$?
kill -TERM "$pid"; wait "$pid"; pid=
exit $rc
