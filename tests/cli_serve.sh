#!/usr/bin/env bash
# `replay serve` as a client sees it, with curl on a free loopback port: the
# endpoints, streaming, every error case with its status and OpenAI-shaped
# body, the API key, a client that disconnects mid-stream (its KV pages come
# back), and a clean exit on SIGTERM.
set -u
BIN=$1
SRC=$2
pass=0
fail=0
check() { if [ "$2" = "$3" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1 (got '$3', expected '$2')"; fi; }
contains() { case "$2" in *"$3"*) pass=$((pass + 1)) ;; *) fail=$((fail + 1)); echo "FAIL: $1: lacks '$3'"; echo "$2" | head -5 ;; esac; }
tok="$SRC/.cache/tokenizers/qwen3"
[ -f "$tok/tokenizer.json" ] || { echo "run scripts/fetch-tokenizers.sh first"; echo "0 passed, 1 failed"; exit 1; }
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
start() { # extra args; sets pid and URL
  for try in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 40000))
    "$BIN" serve --model "$tmp" --load-format dummy --port "$port" --num-pages 64 --device cpu -q "$@" &
    pid=$!
    for _ in $(seq 50); do
      curl -s -o /dev/null "http://127.0.0.1:$port/health" && { URL="http://127.0.0.1:$port"; return 0; }
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=
  done
  echo "server did not start"; return 1
}
code() { curl -s -o "$tmp/body" -w '%{http_code}' "$@"; }
post() { local path=$1; shift; code "$URL$path" -H 'Content-Type: application/json' "$@"; }

start || { echo "0 passed, 1 failed"; exit 1; }
check "health" 200 "$(code "$URL/health")"
check "models" 200 "$(code "$URL/v1/models")"
contains "models lists the served name" "$(cat "$tmp/body")" "\"id\":\"$(basename "$tmp")\""
check "completion" 200 "$(post /v1/completions -d '{"prompt":"Hello","max_tokens":5,"temperature":0}')"
b=$(cat "$tmp/body")
contains "completion object" "$b" '"object":"text_completion"'
contains "completion usage" "$b" '"completion_tokens":5'
contains "completion finish" "$b" '"finish_reason":"length"'
check "completion ids + echo" 200 "$(post /v1/completions -d '{"prompt":[9707,1879],"max_tokens":2,"echo":true,"seed":3}')"
contains "echo has the prompt" "$(cat "$tmp/body")" '"text":"Hello world'
check "chat" 200 "$(post /v1/chat/completions -d '{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_tokens":3}')"
contains "chat message" "$(cat "$tmp/body")" '"role":"assistant"'
check "n=3" 200 "$(post /v1/completions -d '{"prompt":"a","max_tokens":2,"n":3,"seed":1}')"
contains "three choices" "$(cat "$tmp/body")" '"index":2'
check "stream" 200 "$(post /v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}')"
b=$(cat "$tmp/body")
contains "stream chunks" "$b" 'data: {"id":"chatcmpl-'
contains "stream usage" "$b" '"choices":[],"usage"'
check "stream ends with [DONE]" "data: [DONE]" "$(grep -v '^$' "$tmp/body" | tail -1)"
check "tokenize" 200 "$(post /tokenize -d '{"prompt":"Hello world"}')"
contains "tokenize ids" "$(cat "$tmp/body")" '"tokens":[9707,1879]'
check "detokenize" 200 "$(post /detokenize -d '{"tokens":[9707,1879]}')"
contains "detokenize text" "$(cat "$tmp/body")" '"prompt":"Hello world"'
check "health_generate" 200 "$(code "$URL/health_generate")"
# errors: status and OpenAI's shape
check "malformed JSON" 400 "$(post /v1/completions -d '{"prompt": "x",')"
contains "error shape" "$(cat "$tmp/body")" '{"error":{"message":'
check "not an object" 400 "$(post /v1/completions -d '[1,2]')"
check "wrong type" 400 "$(post /v1/completions -d '{"prompt":"x","max_tokens":"5"}')"
contains "param named" "$(cat "$tmp/body")" '"param":"max_tokens"'
check "unknown model" 404 "$(post /v1/completions -d '{"model":"gpt-9","prompt":"x"}')"
contains "model_not_found" "$(cat "$tmp/body")" '"code":"model_not_found"'
check "temperature < 0" 400 "$(post /v1/completions -d '{"prompt":"x","temperature":-1}')"
check "top_p > 1" 400 "$(post /v1/completions -d '{"prompt":"x","top_p":1.5}')"
check "n = 0" 400 "$(post /v1/completions -d '{"prompt":"x","n":0}')"
check "max_tokens over the context" 400 "$(post /v1/completions -d '{"prompt":"x","max_tokens":100000}')"
check "prompt over the context" 400 "$(post /v1/completions -d "{\"prompt\":[$(seq -s, 1 600)0]}")"
check "token id out of range" 400 "$(post /v1/completions -d '{"prompt":[1,999999]}')"
check "bad message role" 400 "$(post /v1/chat/completions -d '{"messages":[{"role":"wizard","content":"x"}]}')"
check "no messages" 400 "$(post /v1/chat/completions -d '{"messages":[]}')"
check "unknown fields are ignored" 200 "$(post /v1/completions -d '{"prompt":"x","max_tokens":1,"foo":{"bar":1}}')"
check "GET on a POST route" 405 "$(code "$URL/v1/chat/completions")"
check "unknown route" 404 "$(code "$URL/v2/nothing")"
check "body too large" 413 "$(head -c 9000000 /dev/zero | tr '\0' ' ' | curl -s -o /dev/null -w '%{http_code}' "$URL/v1/completions" --data-binary @-)"
# a client that goes away mid-stream: its request is aborted and its pages freed
curl -s -N -m 0.5 "$URL/v1/completions" -d '{"prompt":"x","max_tokens":400,"ignore_eos":true,"stream":true}' >/dev/null
for _ in $(seq 50); do
  m=$(curl -s "$URL/metrics")
  case "$m" in *"replay_kv_pages_used 0"*"replay_requests_running 0"* | *"replay_requests_running 0"*"replay_kv_pages_used 0"*) break ;; esac
  sleep 0.1
done
contains "pages back after a disconnect" "$m" "replay_kv_pages_used 0"
contains "nothing running after a disconnect" "$m" "replay_requests_running 0"
# the load generator against this server: every request streams to the end
out=$("$BIN" bench serve --base-url "$URL" --model "$(basename "$tmp")" --num-prompts 12 --request-rate 30 \
      --input-len 20 --output-len 6 --vocab 1000)
check "bench serve" 0 $?
contains "bench serve: all succeed" "$out" "Successful requests:                     12"
contains "bench serve: tokens counted" "$out" "Total generated tokens:                  72"
contains "bench serve: TTFT table" "$out" "Median TTFT (ms):"
contains "bench serve: ITL table" "$out" "P99 ITL (ms):"
# the model and vocabulary from /v1/models; a concurrency cap
out=$("$BIN" bench serve --base-url "$URL" --num-prompts 4 --input-len 8 --output-len 3 --max-concurrency 2)
check "bench serve (model from /v1/models)" 0 $?
contains "bench serve: model found" "$out" "Total generated tokens:                  12"
out=$("$BIN" bench serve --base-url "$URL" --model nope --num-prompts 1 --input-len 4 --output-len 2 2>&1)
check "bench serve: failures exit 1" 1 $?
contains "bench serve: the error is shown" "$out" "HTTP 404"
# clients that hang up mid-stream on purpose are counted apart, not as failures, and their pages come back
out=$("$BIN" bench serve --base-url "$URL" --num-prompts 6 --input-len 8 --output-len 200 --abort-fraction 1)
check "bench serve --abort-fraction: exit 0" 0 $?
contains "bench serve: hang-ups counted" "$out" "Hung up by the client (on purpose):      6"
contains "bench serve: none failed" "$out" "Failed:                                  0"
used=
for _ in $(seq 100); do
  used=$(curl -s "$URL/metrics" | awk '$1 == "replay_kv_pages_used" {print $2}')
  [ "$used" = 0 ] && break
  sleep 0.1
done
check "hung-up streams give their KV pages back" 0 "$used"
out=$("$BIN" bench serve --base-url "$URL" --num-prompts 1 --abort-fraction 2 2>&1)
check "bench serve: bad --abort-fraction" 2 $?
kill -TERM "$pid"; wait "$pid"; rc=$?; pid=
check "SIGTERM exits 0" 0 "$rc"

# an API key, and every limit given as an option
start --api-key sekrit --max-body-bytes 4096 --max-connections 100 --max-connections-per-address 50 \
  --header-timeout 5 --body-timeout 5 --send-timeout 30 --max-queued-requests 8 --http-threads 2 || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
check "no key" 401 "$(post /v1/completions -d '{"prompt":"x","max_tokens":1}')"
check "wrong key" 401 "$(post /v1/completions -H 'Authorization: Bearer nope' -d '{"prompt":"x","max_tokens":1}')"
check "right key" 200 "$(post /v1/completions -H 'Authorization: Bearer sekrit' -d '{"prompt":"x","max_tokens":1}')"
check "health needs no key" 200 "$(code "$URL/health")"
check "HEAD health" 200 "$(code -I "$URL/health")"
check "--max-body-bytes" 413 "$(head -c 5000 /dev/zero | tr '\0' ' ' | curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer sekrit' "$URL/v1/completions" --data-binary @-)"
kill -INT "$pid"; wait "$pid"; rc=$?; pid=
check "SIGINT exits 0" 0 "$rc"
# vLLM's names for the engine options: bad values are usage errors naming the flag
out=$("$BIN" serve --dummy-weights tiny-qwen3 --gpu-memory-utilization 1.5 2>&1); check "bad --gpu-memory-utilization" 2 $?
contains "--gpu-memory-utilization named" "$out" "--gpu-memory-utilization must be in (0, 1]"
out=$("$BIN" serve --dummy-weights tiny-qwen3 --max-num-seqs 0 2>&1); check "bad --max-num-seqs" 2 $?
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --device cpu --num-prompts 3 --input-len 4 --output-len 2 \
      --max-num-seqs 2 --gpu-memory-utilization 0.5 --max-num-batched-tokens 64 2>&1)
check "bench offline takes vLLM's names" 0 $?
contains "bench offline: every request" "$out" "output tokens/s"
out=$("$BIN" serve --dummy-weights tiny-qwen3 --port 0 2>&1); check "bad port" 2 $?
out=$("$BIN" serve 2>&1); check "no model" 2 $?
out=$("$BIN" serve --dummy-weights tiny-qwen3 --max-queued-requests 0 2>&1); check "--max-queued-requests 0" 2 $?
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
