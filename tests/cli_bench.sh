#!/usr/bin/env bash
# `replay bench decode`, `bench offline`, `bench serve`, `logits` and
# `profile` on the CPU with a tiny model: they run, print their tables and
# progress, and reject bad options before anything loads.
set -u
BIN=$1
SRC=${2:-.}
pass=0
fail=0
check() { if [ "$2" = "$3" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1 (rc $3, expected $2)"; fi; }
contains() { case "$2" in *"$3"*) pass=$((pass + 1)) ;; *) fail=$((fail + 1)); echo "FAIL: $1: lacks '$3'"; echo "$2" | head -5 ;; esac; }
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --batch 1,3 --ctx 40 --steps 4 --warmup 1 --device cpu 2>/dev/null)
check "bench decode" 0 $?
contains "bench decode table" "$out" "tok/s"
[ "$(echo "$out" | grep -cE '^ +[13] +eager')" -eq 2 ]; check "a row per batch size" 0 $?
contains "steps overlap as in the engine" "$out" "steps: overlapped"
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --batch 2 --ctx 40 --steps 4 --warmup 0 --device cpu \
      --no-overlap 2>/dev/null)
check "bench decode --no-overlap" 0 $?
contains "steps one at a time" "$out" "steps: one at a time"
[ "$(echo "$out" | grep -cE '^ +2 +eager')" -eq 1 ]; check "--no-overlap row" 0 $?
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --batch 2 --ctx 40 --steps 4 --warmup 1 --device cpu \
      --temperature 0.8 --top-p 0.9 2>/dev/null)
check "bench decode --temperature" 0 $?
contains "sampled steps" "$out" "sampling: temperature 0.8, top-p 0.9"
[ "$(echo "$out" | grep -cE '^ +2 +eager')" -eq 1 ]; check "sampled row" 0 $?
# speculative rounds with the oracle drafter: every draft kept at rate 1 (k + 1 tokens a round, the
# reference's own tokens: the CPU computes a row alike in a verify step and a decode step), none at 0
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --batch 1,3 --ctx 40 --steps 8 --warmup 1 --device cpu \
      --speculative-tokens 3 --acceptance 1,0 2>/dev/null)
check "bench decode --speculative-tokens" 0 $?
rows=$(echo "$out" | awk '$2 == "1.00" || $2 == "0.00" {print $1, $2, $3, $7, $10}')
[ "$(echo "$rows" | grep -c '1.00 100.0% 4.00 0$')" = 2 ]; check "rate 1: every draft kept, 4 tokens a round" 0 $?
[ "$(echo "$rows" | grep -c '0.00 0.0% 1.00 0$')" = 2 ]; check "rate 0: none kept, 1 token a round" 0 $?
# with a draft model (the target's shape, other random weights): its steps timed into each round
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --batch 2 --ctx 40 --steps 8 --warmup 1 --device cpu \
      --speculative-tokens 3 --acceptance 1 --speculative-dummy-weights tiny-llama3 2>/dev/null)
check "bench decode with a draft model" 0 $?
contains "draft model line" "$out" "draft model: tiny-llama3"
[ "$(echo "$out" | awk '$2 == "1.00" && $5 > 0 {print $3, $7}')" = "100.0% 4.00" ]
check "draft model: its time in the round, every draft kept at rate 1" 0 $?
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --speculative-tokens 2 --speculative-dummy-weights tiny-qwen3 \
      --batch 1 --ctx 8 --steps 2 --warmup 1 --device cpu 2>&1)
check "draft model of another vocabulary" 1 $?
contains "draft model of another vocabulary" "$out" "vocabulary has 1031 tokens, the target's 997"
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --speculative-dummy-weights tiny-llama3 2>&1)
check "draft model without rounds" 2 $?
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --speculative-tokens 9 2>&1); check "9 drafts" 2 $?
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --speculative-tokens 2 --acceptance 0.5,1.5 2>&1)
check "acceptance past 1" 2 $?
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --speculative-tokens 2 --temperature 0.5 2>&1)
check "speculative rounds are greedy" 2 $?
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --temperature -1 2>&1); check "bad temperature" 2 $?
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --top-p 0 2>&1); check "bad top-p" 2 $?
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --top-p 1.5 2>&1); check "top-p above 1" 2 $?
# more warm-up steps than timed ones (the timing arrays hold both)
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --batch 1 --ctx 20 --steps 2 --warmup 9 --device cpu 2>/dev/null)
check "bench decode --warmup above --steps" 0 $?
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --num-prompts 40 --input-len 30 --output-len 12 \
      --random-range-ratio 0.3 --max-running-requests 16 --num-pages 40 --device cpu 2>/dev/null)
check "bench offline" 0 $?
contains "offline throughput" "$out" "output tokens/s"
contains "offline peak running" "$out" "peak running requests"
peak=$(echo "$out" | awk '/peak running requests/ {print $4}')
[ "${peak:-0}" -gt 1 ] && [ "${peak:-0}" -le 16 ]; check "continuous batching ran several at once, within the limit" 0 $?
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --random-range-ratio 2 2>&1); check "bad range" 2 $?
out=$("$BIN" bench decode --dummy-weights tiny-qwen3 --batch 0 2>&1); check "bad batch" 2 $?
out=$("$BIN" bench nope 2>&1); check "unknown bench" 2 $?

# the prefix cache's workloads: groups sharing a prefix, then the same with --disable-prefix-caching
hit() { echo "$1" | awk '/prefix cache hit rate/ {sub("%", "", $5); print $5}'; }
SP="--dummy-weights tiny-qwen3 --num-prompts 16 --input-len 8 --output-len 4 --shared-prefix-len 48 --num-groups 4 --device cpu"
# shellcheck disable=SC2086
out=$("$BIN" bench offline $SP 2>/dev/null)
check "bench offline --shared-prefix-len" 0 $?
contains "shared-prefix workload named" "$out" "shared prefix 48 x 4 groups, prefix caching on"
awk -v h="$(hit "$out")" 'BEGIN {exit !(h > 0)}'; check "shared prefix: a hit rate above 0 ($(hit "$out")%)" 0 $?
# shellcheck disable=SC2086
out=$("$BIN" bench offline $SP --disable-prefix-caching 2>/dev/null)
check "bench offline --disable-prefix-caching" 0 $?
contains "cache off named" "$out" "prefix caching off"
check "cache off: hit rate 0" "0.0" "$(hit "$out")"
# multi-turn: 3 conversations of 3 turns; turn k+1 resends turn k's prompt and answer, found cached
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --num-prompts 3 --input-len 20 --output-len 10 --multi-turn 3 \
      --device cpu 2>/dev/null)
check "bench offline --multi-turn" 0 $?
contains "multi-turn named" "$out" "3 conversations, input 20, output 10, range ratio 0.00, 3-turn chat"
contains "later turns' TTFT" "$out" "mean TTFT, turns after the first"
read -r lo mean hi <<<"$(echo "$out" | awk '/input length min/ {print $8, $10, $12}')"
check "turn prompts grow: 20, 50, 80 tokens" "20 50.0 80" "$lo $mean $hi"
awk -v h="$(hit "$out")" 'BEGIN {exit !(h > 0)}'; check "multi-turn: a hit rate above 0 ($(hit "$out")%)" 0 $?
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --num-groups 2 2>&1); check "--num-groups without a prefix" 2 $?
contains "--num-groups needs --shared-prefix-len" "$out" "--shared-prefix-len"
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --multi-turn 0 2>&1); check "bad --multi-turn" 2 $?

# --random-range-ratio as vLLM's bench means it: lengths in [len x (1-R), len x (1+R)], so some above len
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --num-prompts 40 --input-len 20 --output-len 12 \
      --random-range-ratio 0.5 --num-pages 40 --device cpu 2>/dev/null)
check "bench offline --random-range-ratio" 0 $?
read -r lo mean hi <<<"$(echo "$out" | awk '/input length min/ {print $8, $10, $12}')"
[ "${lo:-0}" -ge 10 ] && [ "${lo:-0}" -lt 20 ] && [ "${hi:-0}" -gt 20 ] && [ "${hi:-0}" -le 30 ]
check "input lengths within [10, 30], on both sides of 20 ($lo / $mean / $hi)" 0 $?

# --length-distribution lognormal: long-tailed lengths with means --input-len and --output-len, each at
# most 8x its mean, named on the first line
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --num-prompts 40 --input-len 20 --output-len 12 \
      --length-distribution lognormal --num-pages 40 --device cpu 2>/dev/null)
check "bench offline --length-distribution lognormal" 0 $?
contains "lognormal on the first line" "$(echo "$out" | head -1)" \
  "input 20, output 12, random, lognormal lengths (sigma 1.00, at most 8x the mean), prefix"
read -r lo mean hi <<<"$(echo "$out" | awk '/input length min/ {print $8, $10, $12}')"
[ "${lo:-0}" -ge 1 ] && [ "${lo:-0}" -lt 10 ] && [ "${hi:-0}" -gt 40 ] && [ "${hi:-0}" -le 160 ]
check "lognormal input lengths: some under half of 20, a tail past twice it, none past 160 ($lo / $mean / $hi)" 0 $?
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --length-distribution lognormal --random-range-ratio 0.3 2>&1)
check "lognormal with --random-range-ratio" 2 $?
contains "lognormal with --random-range-ratio: why" "$out" "--random-range-ratio 0.3 spreads lengths uniformly"
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --length-sigma 0.8 2>&1); check "--length-sigma with uniform" 2 $?
contains "--length-sigma with uniform: why" "$out" "give --length-distribution lognormal"
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --length-distribution lognormal --length-sigma 0 2>&1)
check "--length-sigma 0" 2 $?
contains "--length-sigma 0: the range" "$out" "--length-sigma must be a number in (0, 2]"
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --length-distribution zipf 2>&1); check "unknown distribution" 2 $?
contains "unknown distribution: the choices" "$out" "uniform or lognormal"

# progress: when stderr is not a terminal, a plain line every --progress-interval seconds
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --num-prompts 40 --input-len 20 --output-len 12 \
      --num-pages 40 --device cpu --progress-interval 0.01 2>&1 >/dev/null)
echo "$out" | grep -qE 'INFO +bench offline: [0-9]+/40 requests, [0-9.]+ tok/s, [0-9]+s elapsed'
check "bench offline: progress lines" 0 $?
# (enough steps to outlast an interval: 30 of them took under 10 ms on an idle machine)
out=$("$BIN" bench decode --dummy-weights tiny-llama3 --batch 4 --ctx 40 --steps 400 --warmup 1 --device cpu \
      --progress-interval 0.01 2>&1 >/dev/null)
echo "$out" | grep -qE 'INFO +bench decode: [0-9]+/401 steps, [0-9.]+ tok/s, .*\(batch 4'
check "bench decode: progress lines" 0 $?
# nothing listens on port 1: every request fails at once, and the line still counts them
out=$("$BIN" bench serve --base-url http://127.0.0.1:1 --model m --vocab 100 --num-prompts 3 --request-rate 20 \
      --input-len 4 --output-len 2 --progress-interval 0.01 2>&1 >/dev/null)
check "bench serve: refused connections fail" 1 $?
echo "$out" | grep -qE 'INFO +bench serve: [0-9]/3 requests'
check "bench serve: progress lines" 0 $?
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --num-prompts 8 --input-len 8 --output-len 4 --device cpu \
      --progress-interval 0.01 -q 2>&1 >/dev/null)
check "--quiet: no progress" "" "$out"
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --progress-interval -1 2>&1); check "bad --progress-interval" 2 $?

# Every value is checked before anything loads. qwen3-8b's random weights take minutes to make on
# the CPU: an answer within seconds, exit 2, naming the flag, shows nothing loaded first.
early() { # name, flag expected in the message, command...
  local name=$1 flag=$2; shift 2
  out=$(timeout 10 "$BIN" "$@" 2>&1)
  local rc=$?
  check "$name: exit 2 before loading" 2 "$rc"
  contains "$name: names $flag" "$out" "$flag"
}
Q8="--dummy-weights qwen3-8b"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086
{
early "bench decode context" --ctx bench decode $Q8 --ctx 40900 --steps 64
early "bench offline context" --input-len bench offline $Q8 --input-len 30000 --output-len 20000
early "bench offline stretched" --random-range-ratio bench offline $Q8 --input-len 20000 --output-len 4000 \
      --random-range-ratio 0.9
early "bench offline --max-model-len" --max-model-len bench offline $Q8 --max-model-len 50000
early "bench offline --max-model-len fits" --max-model-len bench offline $Q8 --max-model-len 1000
early "bench offline --num-pages" --num-pages bench offline $Q8 --num-pages 10 --input-len 100 --output-len 100
early "bench offline multi-turn context" --multi-turn bench offline $Q8 --input-len 10000 --output-len 1000 \
      --multi-turn 4
early "bench offline lognormal context" --length-distribution bench offline $Q8 --input-len 4000 --output-len 2000 \
      --length-distribution lognormal
early "logits 1,,2" --prompt-ids logits $Q8 --prompt-ids 1,,2 --out "$tmp/l.bin"
early "logits trailing comma" --prompt-ids logits $Q8 --prompt-ids 1,2, --out "$tmp/l.bin"
early "logits id past the vocabulary" 151935 logits $Q8 --prompt-ids 1,151936 --out "$tmp/l.bin"
early "logits missing @FILE" "No such file" logits $Q8 --prompt-ids "@$tmp/none" --out "$tmp/l.bin"
early "logits --out in a missing directory" --out logits $Q8 --prompt-ids 1,2 --out "$tmp/no/l.bin"
early "logits --chunk's new name" --max-num-batched-tokens logits $Q8 --prompt-ids 1 --chunk 4 --out "$tmp/l.bin"
}
early "bench serve https" https bench serve --base-url https://127.0.0.1:8000
early "bench serve port" port bench serve --base-url http://127.0.0.1:99999
early "bench serve path" /v1 bench serve --base-url http://127.0.0.1:8000/v1
early "bench serve no host" host bench serve --base-url http://:8000
early "bench serve ratio" --random-range-ratio bench serve --random-range-ratio 1
early "bench serve lognormal with a range" --random-range-ratio bench serve --length-distribution lognormal \
      --random-range-ratio 0.5
early "bench serve sigma with uniform" --length-sigma bench serve --length-sigma 0.5

# logits: ids from a file, separated by commas and whitespace; --last rows of the vocabulary
printf '1 2\n3,4\n' >"$tmp/ids"
"$BIN" logits --dummy-weights tiny-qwen3 --device cpu --prompt-ids "@$tmp/ids" --last 3 --out "$tmp/l.bin" -q
check "logits @FILE" 0 $?
check "logits: 3 rows of 1031 floats" $((3 * 1031 * 4)) "$(stat -c %s "$tmp/l.bin" 2>/dev/null)"
"$BIN" logits --dummy-weights tiny-qwen3 --device cpu --prompt-ids 1,2,3,4 --last 3 --max-num-batched-tokens 1 \
  --out "$tmp/l1.bin" -q
cmp -s "$tmp/l.bin" "$tmp/l1.bin"; check "logits: a token a step, the same logits" 0 $?
# a write that fails (past the file size limit: EFBIG, the signal ignored) says why and leaves no partial file
out=$(trap '' XFSZ; ulimit -f 4; "$BIN" logits --dummy-weights tiny-qwen3 --device cpu --prompt-ids 1,2 \
      --out "$tmp/big.bin" -q 2>&1)
check "logits: a failed write" 1 $?
contains "logits: the write error" "$out" "File too large"
[ ! -e "$tmp/big.bin" ]; check "logits: no partial file" 0 $?

# profile and bench kernels need a GPU: said at once, before the model loads
for c in "profile" "bench kernels"; do
  # shellcheck disable=SC2086
  out=$(timeout 10 "$BIN" $c $Q8 2>&1); rc=$?
  case "$out" in
  *"built without CUDA"* | *"finds none"*)
    check "$c without a GPU: exit 1 at once" 1 "$rc"
    contains "$c says it needs a GPU" "$out" "needs a GPU" ;;
  *) echo "SKIP: $c: a GPU is present" ;;
  esac
  # shellcheck disable=SC2086
  out=$(timeout 10 "$BIN" $c $Q8 --device cpu 2>&1); rc=$?
  [ "$rc" = 1 ] || [ "$rc" = 2 ]; check "$c --device cpu refused at once ($rc)" 0 $?
  contains "$c --device cpu: why" "$out" "GPU"
  # shellcheck disable=SC2086
  out=$("$BIN" $c $Q8 --threads 2 2>&1); check "$c takes no --threads" 2 $?
done
# structured output in bench offline: every request constrained; what needs a tokenizer says so
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --json-object 2>&1); check "offline constraint, no tokenizer" 2 $?
contains "offline constraint, no tokenizer" "$out" "--json-object needs a tokenizer"
out=$("$BIN" bench offline --dummy-weights tiny-qwen3 --json-object --regex a 2>&1); check "offline two constraints" 2 $?
tok="$SRC/.cache/tokenizers/qwen3"
if [ -f "$tok/tokenizer.json" ]; then
  sm=$(mktemp -d)
  cat > "$sm/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
 "tie_word_embeddings": false, "eos_token_id": 151645}
JSON
  printf '{"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}}' >"$sm/arr.json"
  out=$("$BIN" bench offline --model "$sm" --load-format dummy --tokenizer "$tok" --num-prompts 8 --input-len 6 \
        --output-len 24 --json-schema "$sm/arr.json" --structured-whitespace compact --device cpu 2>/dev/null)
  check "bench offline --json-schema" 0 $?
  contains "bench offline names the constraint" "$out" "--json-schema (every request)"
  contains "bench offline: every output token counted" "$out" "output tokens/s"
  rm -rf "$sm"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
