#!/usr/bin/env bash
# `replay serve` as a client sees it, with curl on a free loopback port: the
# endpoints, streaming, every error case with its status and OpenAI-shaped
# body, the API key (flag and REPLAY_API_KEY), a client that disconnects
# mid-stream (its KV pages come back), a clean exit on SIGTERM; the logs (the
# access line, the engine line, JSON lines, REPLAY_LOG), listening before
# loading (a port in use, SIGTERM while loading), host names and IPv6, and
# usage errors.
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
# start [ARGS]: a server on a free port; sets pid, port and URL. With LOG set, it
# logs at info into that file (else -q); URLHOST is the host in URL; MODEL_ARGS
# how the model is given.
URLHOST=127.0.0.1
MODEL_ARGS=(--model "$tmp")
LOG=
start() {
  for try in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 40000))
    if [ -n "$LOG" ]; then
      "$BIN" serve "${MODEL_ARGS[@]}" --load-format dummy --port "$port" --num-pages 64 --device cpu "$@" 2>"$LOG" &
    else
      "$BIN" serve "${MODEL_ARGS[@]}" --load-format dummy --port "$port" --num-pages 64 --device cpu -q "$@" &
    fi
    pid=$!
    for _ in $(seq 50); do
      curl -s -o /dev/null "http://$URLHOST:$port/health" && { URL="http://$URLHOST:$port"; return 0; }
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
check "an unknown field is a 400" 400 "$(post /v1/completions -d '{"prompt":"x","max_tokens":1,"foo":{"bar":1}}')"
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
case "$out" in *"Speculative acceptance"*) fail=$((fail + 1)); echo "FAIL: acceptance shown without speculation" ;; *) pass=$((pass + 1)) ;; esac
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
# tool calls and reasoning (docs/tools.md): vLLM's flags
out=$("$BIN" serve --dummy-weights tiny-qwen3 --tool-call-parser yaml 2>&1); check "bad --tool-call-parser" 2 $?
contains "--tool-call-parser names the choices" "$out" "--tool-call-parser must be hermes, llama3_json or mistral, got 'yaml'"
out=$("$BIN" serve --dummy-weights tiny-qwen3 --enable-auto-tool-choice 2>&1); check "auto tool choice alone" 2 $?
contains "--enable-auto-tool-choice needs the parser" "$out" "--enable-auto-tool-choice needs --tool-call-parser"
out=$("$BIN" serve --dummy-weights tiny-qwen3 --reasoning-parser r2 2>&1); check "bad --reasoning-parser" 2 $?
contains "--reasoning-parser names the choices" "$out" "qwen3 or deepseek_r1"
TOOLS='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]'
start --enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3 || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
check "tools, parsers on" 200 "$(post /v1/chat/completions -d '{"messages":[{"role":"user","content":"Weather?"}],'"$TOOLS"',"max_tokens":4}')"
contains "reasoning_content in the message" "$(cat "$tmp/body")" '"reasoning_content":'
check "tools, parsers on, streamed" 200 "$(post /v1/chat/completions -d '{"messages":[{"role":"user","content":"Weather?"}],'"$TOOLS"',"max_tokens":4,"ignore_eos":true,"stream":true}')"
contains "streamed finish" "$(cat "$tmp/body")" '"delta":{},"logprobs":null,"finish_reason":"length"'
kill -TERM "$pid"; wait "$pid"; pid=
start || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
check "tools without the flags: 400" 400 "$(post /v1/chat/completions -d '{"messages":[{"role":"user","content":"Weather?"}],'"$TOOLS"',"max_tokens":4}')"
contains "the 400 names the flags" "$(cat "$tmp/body")" "--enable-auto-tool-choice and --tool-call-parser"
check "tool_choice none without the flags" 200 "$(post /v1/chat/completions -d '{"messages":[{"role":"user","content":"Weather?"}],'"$TOOLS"',"tool_choice":"none","max_tokens":4}')"
kill -TERM "$pid"; wait "$pid"; pid=

# ---- logs, listening, signals (docs/server.md#logs) ----
stop() { kill -TERM "$pid"; wait "$pid"; rc=$?; pid=; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# the model as an argument (vllm serve MODEL); the access line; the periodic line
MODEL_ARGS=("$tmp")
LOG="$tmp/serve.log" start --log-stats-interval 0.3 || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
check "serve MODEL: /version" 200 "$(code "$URL/version")"
check "/version body" '{"version":"0.1.0"}' "$(cat "$tmp/body")"
check "completion (logged)" 200 "$(post /v1/completions -d '{"prompt":[9707,1879,0],"max_tokens":5,"ignore_eos":true}')"
id=$(sed -n 's/.*"id":"\(cmpl-[0-9a-f]*\)".*/\1/p' "$tmp/body")
check "stream (logged)" 200 "$(post /v1/completions -d '{"prompt":[9707],"max_tokens":3,"ignore_eos":true,"stream":true}')"
check "404 (logged)" 404 "$(code "$URL/nothing")"
hdrs=$(curl -s -D - -o "$tmp/body" "$URL/v1/completions" -H 'Content-Type: application/json' -H 'X-Request-Id: my-req-1' \
  -d '{"prompt":[9707],"max_tokens":1}')
contains "X-Request-Id sent back" "$hdrs" "X-Request-Id: my-req-1"
contains "X-Request-Id names the completion" "$(cat "$tmp/body")" '"id":"cmpl-my-req-1"'
sleep 0.8
log=$(cat "$tmp/serve.log")
contains "startup line has the URL" "$log" "INFO  serving '$(basename "$tmp")' on http://127.0.0.1:$port"
contains "listening before loading" "$log" "INFO  listening on http://127.0.0.1:$port; loading the model"
line=$(grep " id=$id " "$tmp/serve.log")
contains "access line: fields" "$line" "INFO  request id=$id client=127.0.0.1:"
contains "access line: route and status" "$line" " method=POST route=/v1/completions status=200 prompt_tokens=3 output_tokens=5 ttft_ms="
contains "access line: total" "$line" " total_ms="
check "access line: timestamp" 1 "$(echo "$line" | grep -cE '^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} INFO  ')"
contains "access line: a stream" "$log" "route=/v1/completions status=200 prompt_tokens=1 output_tokens=3 ttft_ms="
contains "access line: a 404" "$log" "id=- client=127.0.0.1:"
contains "access line: the 404's route" "$log" "method=GET route=/nothing status=404"
contains "access line: the client's request id" "$log" "id=cmpl-my-req-1 client=127.0.0.1:"
contains "access line: request_id" "$log" " cached_tokens=0 request_id=my-req-1"
case "$log" in *"route=/health "*) fail=$((fail + 1)); echo "FAIL: /health logged at info" ;; *) pass=$((pass + 1)) ;; esac
contains "engine line" "$log" "INFO  engine prompt_tokens_per_s="
contains "engine line: fields" "$log" " running=0 waiting=0 kv_cache_used_pct="
n1=$(grep -c " engine " "$tmp/serve.log"); sleep 1; n2=$(grep -c " engine " "$tmp/serve.log")
check "no engine line while idle" "$n1" "$n2"
stop; check "SIGTERM after serving exits 0" 0 "$rc"
contains "shutdown logged" "$(cat "$tmp/serve.log")" "INFO  stopped"
contains "chat template logged" "$(cat "$tmp/serve.log")" "chat template: $tmp/tokenizer_config.json; a turn ends at token ids 151645"
contains "no generation_config logged" "$(cat "$tmp/serve.log")" "sampling defaults: replay's (the model has no generation_config.json)"
MODEL_ARGS=(--model "$tmp")
# generation_config.json's sampling, logged; --chat-template FILE, whose raise_exception is a 400
printf '{"temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [151645, 151643]}' >"$tmp/generation_config.json"
printf '{%% if messages | length > 1 %%}{{ raise_exception("one message only") }}{%% endif %%}<|im_start|>{{ messages[0].content }}' >"$tmp/one.jinja"
LOG="$tmp/serve.log" start --chat-template "$tmp/one.jinja" || exit 1
log=$(cat "$tmp/serve.log")
contains "generation_config logged" "$log" "sampling defaults from $tmp/generation_config.json: temperature=0.6 top_k=20 top_p=0.95"
contains "template file logged" "$log" "chat template: $tmp/one.jinja; a turn ends at token ids 151645, 151643"
check "template file: chat" 200 "$(post /v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2}')"
check "template file: prompt" 200 "$(post /tokenize -d '{"messages":[{"role":"user","content":"Hi"}]}')"
contains "template file: prompt" "$(cat "$tmp/body")" '"tokens":[151644,13048]'
check "raise_exception" 400 "$(post /v1/chat/completions -d '{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}')"
contains "raise_exception message" "$(cat "$tmp/body")" '"message":"one message only"'
check "after raise_exception" 200 "$(post /v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2}')"
stop
rm "$tmp/generation_config.json" "$tmp/one.jinja"
# JSON lines: every line parses, with typed fields
LOG="$tmp/serve.log" start --log-format json --log-stats-interval 0.2 || exit 1
post /v1/completions -d '{"prompt":[1,2],"max_tokens":2,"ignore_eos":true}' >/dev/null
code "$URL/v1/models?x=%22%0a" >/dev/null
sleep 0.5; stop
out=$(node -e '
  const lines = require("fs").readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean);
  let req = 0, eng = 0;
  for (const l of lines) {
    const j = JSON.parse(l);
    if (!/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/.test(j.ts) || !j.level || typeof j.msg !== "string") throw l;
    if (j.msg === "request" && j.route === "/v1/completions") {
      if (j.status !== 200 || j.prompt_tokens !== 2 || j.output_tokens !== 2 || typeof j.ttft_ms !== "number" ||
          !/^cmpl-/.test(j.id) || !/^127\.0\.0\.1:\d+$/.test(j.client)) throw l;
      req++;
    }
    if (j.msg === "engine" && typeof j.generation_tokens_per_s === "number" && j.running === 0) eng++;
  }
  console.log(lines.length > 3 && req === 1 && eng >= 1 ? "ok" : "missing: " + lines.join("\n"));
' "$tmp/serve.log" 2>&1)
check "--log-format json: every line parses" ok "$out"
# the API key from the environment (--api-key wins, below); --disable-access-log, --disable-log-stats
REPLAY_API_KEY=envkey LOG="$tmp/serve.log" start --disable-access-log --disable-log-stats || exit 1
check "REPLAY_API_KEY: none" 401 "$(post /v1/completions -d '{"prompt":"x","max_tokens":1}')"
check "REPLAY_API_KEY: right" 200 "$(post /v1/completions -H 'Authorization: Bearer envkey' -d '{"prompt":"x","max_tokens":1}')"
sleep 0.3
stop
check "--disable-access-log" 0 "$(grep -c ' request ' "$tmp/serve.log")"
check "--disable-log-stats" 0 "$(grep -c ' engine ' "$tmp/serve.log")"
REPLAY_API_KEY=envkey start --api-key flagkey || exit 1
check "--api-key wins: env key" 401 "$(post /v1/completions -H 'Authorization: Bearer envkey' -d '{"prompt":"x","max_tokens":1}')"
check "--api-key wins: flag key" 200 "$(post /v1/completions -H 'Authorization: Bearer flagkey' -d '{"prompt":"x","max_tokens":1}')"
stop
# a draft model (the model itself, random weights of the same seed): greedy keeps every draft, the
# text is plain decoding's, and /metrics counts the rounds
start || exit 1
check "plain completion" 200 "$(post /v1/completions -d '{"prompt":"Hello","max_tokens":24,"temperature":0,"ignore_eos":true}')"
plain=$(grep -o '"text":"[^"]*"' "$tmp/body")
stop
start --speculative-model "$tmp" --num-speculative-tokens 3 || exit 1
check "completion with a draft model" 200 "$(post /v1/completions -d '{"prompt":"Hello","max_tokens":24,"temperature":0,"ignore_eos":true}')"
check "draft model: plain decoding's text" "$plain" "$(grep -o '"text":"[^"]*"' "$tmp/body")"
m=$(curl -s "$URL/metrics")
drafts=$(echo "$m" | awk '$1 == "replay_spec_decode_num_draft_tokens_total" {print $2}')
accepted=$(echo "$m" | awk '$1 == "replay_spec_decode_num_accepted_tokens_total" {print $2}')
[ -n "$drafts" ] && [ "$drafts" -gt 0 ] && [ "$drafts" = "$accepted" ]
check "draft model: every greedy draft kept ($accepted of $drafts)" 0 $?
out=$("$BIN" bench serve --base-url "$URL" --model "$(basename "$tmp")" --num-prompts 4 --input-len 16 \
      --output-len 16 2>&1)
check "bench serve against a draft model" 0 $?
contains "bench serve: acceptance from /metrics" "$out" "Speculative acceptance (%):"
stop
# a port in use is reported before the model loads: qwen3-8b's random weights take minutes on the CPU
start || exit 1
t0=$(date +%s%N)
out=$(timeout 20 "$BIN" serve --dummy-weights qwen3-8b --device cpu --port "$port" 2>&1); rc=$?
el=$(ms_since "$t0")
check "port in use: exit 1" 1 "$rc"
check "port in use: the system's reason" "replay serve: cannot listen on 127.0.0.1:$port: Address already in use" "$out"
[ "$el" -lt 3000 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: port in use reported after ${el} ms"; }
stop
out=$(timeout 20 "$BIN" serve --dummy-weights qwen3-8b --device cpu --host nosuch.invalid 2>&1); rc=$?
check "unresolvable host: exit 1" 1 "$rc"
contains "unresolvable host: said so" "$out" "replay serve: cannot listen on nosuch.invalid:8000: "
# SIGTERM while loading: out at once (128 + 15), with a line saying so; and an
# unknown REPLAY_LOG is one warning
port=$((20000 + RANDOM % 40000))
REPLAY_LOG=xyz "$BIN" serve --dummy-weights qwen3-8b --device cpu --threads 1 --port "$port" 2>"$tmp/load.log" &
pid=$!
for _ in $(seq 50); do grep -q "loading the model" "$tmp/load.log" && break; sleep 0.1; done
sleep 0.3
t0=$(date +%s%N); stop; el=$(ms_since "$t0")
check "SIGTERM while loading: exit 143" 143 "$rc"
[ "$el" -lt 3000 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: SIGTERM while loading took ${el} ms"; }
contains "SIGTERM while loading: logged" "$(cat "$tmp/load.log")" "WARN  SIGTERM: interrupted while loading; exiting"
contains "REPLAY_LOG=xyz warned" "$(cat "$tmp/load.log")" "WARN  REPLAY_LOG=xyz is not a level (error, warn, info, debug); using info"
# host names and IPv6
URLHOST=localhost LOG="$tmp/serve.log" start --host localhost || exit 1
check "--host localhost" 200 "$(code "$URL/version")"
stop
if python3 -c 'import socket; s = socket.socket(socket.AF_INET6); s.bind(("::1", 0))' 2>/dev/null; then
  URLHOST="[::1]" LOG="$tmp/serve.log" start --host ::1 || exit 1
  check "--host ::1" 200 "$(code "$URL/version")"
  stop
  contains "--host ::1: the URL" "$(cat "$tmp/serve.log")" "serving '$(basename "$tmp")' on http://[::1]:$port"
  contains "--host ::1: the client in brackets" "$(cat "$tmp/serve.log")" "client=[::1]:"
  URLHOST="[::1]" LOG="$tmp/serve.log" start --host :: || exit 1
  check "--host :: takes IPv6" 200 "$(code "$URL/version")"
  check "--host :: takes IPv4" 200 "$(code "http://127.0.0.1:$port/version")"
  stop
  contains "--host ::: an IPv4 client as IPv4" "$(cat "$tmp/serve.log")" "client=127.0.0.1:"
else
  echo "SKIP: --host ::1 and --host :: (this machine has no IPv6 loopback address)"
fi
URLHOST=127.0.0.1
# CORS: --allowed-origins; preflights answered, the header on allowed origins' answers only
MODEL_ARGS=(--model "$tmp")
start --allowed-origins 'http://app.example' || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
pre=$(curl -s -D - -o /dev/null -X OPTIONS "$URL/v1/chat/completions" -H 'Origin: http://app.example' \
  -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: content-type')
contains "CORS preflight: 204" "$pre" "HTTP/1.1 204"
contains "CORS preflight: origin" "$pre" "Access-Control-Allow-Origin: http://app.example"
contains "CORS preflight: headers" "$pre" "Access-Control-Allow-Headers: content-type"
contains "CORS: answer has the origin" "$(curl -s -D - -o /dev/null "$URL/v1/models" -H 'Origin: http://app.example')" \
  "Access-Control-Allow-Origin: http://app.example"
case "$(curl -s -D - -o /dev/null "$URL/v1/models" -H 'Origin: http://other.example')" in
  *Access-Control-Allow-Origin*) fail=$((fail + 1)); echo "FAIL: CORS header for an origin not allowed" ;;
  *) pass=$((pass + 1)) ;;
esac
check "models.retrieve" 200 "$(code "$URL/v1/models/$(basename "$tmp")")"
check "models.retrieve: another model" 404 "$(code "$URL/v1/models/gpt-4")"
contains "models.retrieve: OpenAI's error" "$(cat "$tmp/body")" '"code":"model_not_found"'
stop
# a SentencePiece-style tokenizer (the tiny Mistral-v0.3-style fixture, its [INST] template) on
# dummy Mistral weights: completions, chat, streaming, logprobs' token bytes
sp="$tmp/mistral"
mkdir -p "$sp"
cp "$SRC"/tests/fixtures/tokenizer/mistral_tiny/tokenizer*.json "$sp/"
cat > "$sp/config.json" <<'JSON'
{"architectures": ["MistralForCausalLM"], "vocab_size": 700, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
 "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2, "max_position_embeddings": 512}
JSON
MODEL_ARGS=(--model "$sp")
start || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
check "sentencepiece completion" 200 "$(post /v1/completions -d '{"prompt":"Hello world","max_tokens":6,"temperature":0,"logprobs":1}')"
contains "sentencepiece completion: prompt tokens" "$(cat "$tmp/body")" '"prompt_tokens":7'
check "sentencepiece chat" 200 "$(post /v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":6}')"
contains "sentencepiece chat: [INST] prompt" "$(cat "$tmp/body")" '"prompt_tokens":5'
check "sentencepiece stream" 200 "$(post /v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":6,"stream":true}')"
contains "sentencepiece stream: done" "$(cat "$tmp/body")" "data: [DONE]"
stop
# usage errors name the flag and exit 2, before anything loads
usage() { local want=$1; shift; out=$("$BIN" serve "$@" 2>&1); check "usage: $*" 2 $?; contains "usage: $* (message)" "$out" "$want"; }
usage "--port must be an integer from 1 to 65535, got '70000'" --dummy-weights tiny-qwen3 --port 70000
usage "--log-level must be error, warn, info or debug, got 'loud'" --dummy-weights tiny-qwen3 --log-level loud
usage "--log-format must be text or json, got 'xml'" --dummy-weights tiny-qwen3 --log-format xml
usage "--log-stats-interval must be" --dummy-weights tiny-qwen3 --log-stats-interval -1
usage "--tokenizer must be a directory with tokenizer.json, got '/nonexistent'" --dummy-weights tiny-qwen3 --tokenizer /nonexistent
usage "--chat-template takes a Jinja template file, and there is no file 'chatml'" --dummy-weights tiny-qwen3 --chat-template chatml
usage "--chat-template takes a Jinja template file, and '/tmp' is not a file" --dummy-weights tiny-qwen3 --chat-template /tmp
usage "--generation-config must be auto, vllm or a directory with generation_config.json, got 'x'" --dummy-weights tiny-qwen3 --generation-config x
usage "--served-model-name must not be empty" --dummy-weights tiny-qwen3 --served-model-name ""
usage "--api-key must not be empty" --dummy-weights tiny-qwen3 --api-key ""
usage "--allowed-origins must not be empty" --dummy-weights tiny-qwen3 --allowed-origins ""
usage "--allowed-methods needs --allowed-origins" --dummy-weights tiny-qwen3 --allowed-methods GET
usage "the model is given twice" "$tmp" --model "$tmp"
usage "unexpected argument 'b'" a b
usage "give either --model or --dummy-weights" "$tmp" --dummy-weights tiny-qwen3
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
