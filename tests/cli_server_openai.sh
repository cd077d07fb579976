#!/usr/bin/env bash
# The official `openai` npm client (pinned) against `replay serve` on a free
# loopback port: tests/server_openai.mjs. The package is installed once into
# .cache/npm-openai/ (ignored by git); the server is a one-layer Qwen3 shape
# with random weights and the real Qwen3 tokenizer, on the CPU, with an API
# key. The test stops the server with SIGTERM and expects exit status 0.
# Then the prefix cache's side: its /metrics counters and bench serve's hit
# rate, and a second server with --disable-prefix-caching where
# cached_tokens and the counters stay 0; a third with the tool-call and
# reasoning parsers (TOOLS=on).
set -u
BIN=$1
SRC=$2
OPENAI_VERSION=4.104.0
cache="$SRC/.cache/npm-openai"
tok="$SRC/.cache/tokenizers/qwen3"
[ -f "$tok/tokenizer.json" ] || { echo "FAIL: run scripts/fetch-tokenizers.sh first"; exit 1; }
command -v node >/dev/null || { echo "FAIL: node is needed (scripts/deps.sh installs nodejs and npm)"; exit 1; }
if [ "$(node -p "require('$cache/node_modules/openai/package.json').version" 2>/dev/null)" != "$OPENAI_VERSION" ]; then
  mkdir -p "$cache"
  # a lock so parallel ctest runs (normal and ASan builds) do not install over each other
  ( flock 9
    [ -f "$cache/node_modules/openai/package.json" ] && \
      [ "$(node -p "require('$cache/node_modules/openai/package.json').version")" = "$OPENAI_VERSION" ] && exit 0
    [ -f "$cache/package.json" ] || echo '{"private": true}' > "$cache/package.json"
    npm install --prefix "$cache" --no-audit --no-fund --silent "openai@$OPENAI_VERSION" >"$cache/install.log" 2>&1 \
      || { cat "$cache/install.log"; exit 1; }
  ) 9>"$cache.lock" || { echo "FAIL: npm install openai@$OPENAI_VERSION failed"; exit 1; }
fi
tmp=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$tmp/"
cat > "$tmp/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
 "tie_word_embeddings": false, "eos_token_id": 151645, "max_position_embeddings": 1024}
JSON
# start [ARGS]: the server on a free port, with ARGS; sets pid and URL
start() {
  URL=
  for try in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 40000))
    "$BIN" serve --model "$tmp" --load-format dummy --port "$port" --num-pages 128 --device cpu --threads 2 \
      --served-model-name tiny-qwen3 --api-key test-key -q "$@" 2>"$tmp/server.log" &
    pid=$!
    for _ in $(seq 100); do
      curl -s -o /dev/null "http://127.0.0.1:$port/health" && { URL="http://127.0.0.1:$port"; return 0; }
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=
  done
  echo "FAIL: the server did not start"; cat "$tmp/server.log"; exit 1
}
metric() { curl -s "$URL/metrics" | sed -n "s/^$1 //p"; }
# bench serve's hit rate on groups of prompts sharing a prefix
bench_hit() {
  "$BIN" bench serve --base-url "$URL" --api-key test-key --num-prompts 8 --input-len 8 --output-len 2 \
    --shared-prefix-len 40 --num-groups 2 --progress-interval 0 -q 2>&1 | sed -n 's/^Prefix cache hit rate (%): *//p'
}
stop() {
  kill -TERM "$pid"; wait "$pid"; local src=$?; pid=
  [ "$src" = 0 ] || { echo "FAIL: SIGTERM exit status $src"; cat "$tmp/server.log"; rc=1; }
}
start
# node resolves 'openai' from the script's directory upwards: run a copy next to node_modules
cp "$SRC/tests/server_openai.mjs" "$cache/server_openai.mjs"
node "$cache/server_openai.mjs" "$URL" tiny-qwen3 test-key
rc=$?
# the abandoned stream's pages are back
used=
for _ in $(seq 100); do
  used=$(metric replay_kv_pages_used)
  [ "$used" = 0 ] && break
  sleep 0.05
done
[ "$used" = 0 ] || { echo "FAIL: $used KV pages still used after the client left"; rc=1; }
# the prefix cache's counters (tokens) and cached pages
[ "$(metric replay_prefix_cache_hits_total)" -gt 0 ] && \
  [ "$(metric replay_prefix_cache_queries_total)" -gt "$(metric replay_prefix_cache_hits_total)" ] && \
  [ "$(metric replay_kv_pages_cached)" -gt 0 ] || { echo "FAIL: prefix cache metrics"; curl -s "$URL/metrics"; rc=1; }
# the structured outputs' masks went to the backend (docs/structured.md, "Sampling")
[ "$(metric 'replay_structured_masked_rows_total{path="device"}')" -gt 0 ] && \
  [ "$(metric 'replay_structured_masked_rows_total{path="host"}')" = 0 ] || \
  { echo "FAIL: masked rows metrics"; curl -s "$URL/metrics" | grep masked; rc=1; }
hit=$(bench_hit)
awk -v h="$hit" 'BEGIN {exit !(h > 0)}' || { echo "FAIL: bench serve --shared-prefix-len: hit rate '$hit'"; rc=1; }
stop
# --disable-prefix-caching: nothing cached, nothing counted
start --disable-prefix-caching
CACHE=off node "$cache/server_openai.mjs" "$URL" tiny-qwen3 test-key || rc=1
[ "$(metric replay_prefix_cache_hits_total)" = 0 ] && [ "$(metric replay_kv_pages_cached)" = 0 ] || \
  { echo "FAIL: metrics with --disable-prefix-caching"; curl -s "$URL/metrics" | grep prefix; rc=1; }
hit=$(bench_hit)
[ "$hit" = "0.00" ] || { echo "FAIL: bench serve without the cache: hit rate '$hit'"; rc=1; }
stop
# tool calls and reasoning (docs/tools.md): vLLM's flags
start --enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3
TOOLS=on node "$cache/server_openai.mjs" "$URL" tiny-qwen3 test-key || rc=1
stop
exit $rc
