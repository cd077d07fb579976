#!/usr/bin/env bash
# `replay generate` and `replay --help` as a user runs them: exit codes (0 ok,
# 2 usage error, 1 runtime error), one-line errors, streaming output, the
# stats line, seeded reproducibility, greedy output equal to transformers' on
# a fixture model; every check that needs no weights made before loading
# them; prompts from a file or stdin, stop strings, the seed in the stats
# line; SIGINT / SIGTERM while generating and while loading.
set -u
BIN=$1
SRC=$2
pass=0
fail=0
check() { # name, expected rc, actual rc
  if [ "$2" = "$3" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1 (rc $3, expected $2)"; fi
}
# The exit status of background process $1, killed (137) if it is still
# running after 60 s: a test that fails must not hang.
reap() {
  for _ in $(seq 600); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null
  wait "$1"
}
contains() { # name, haystack, needle
  case "$2" in *"$3"*) pass=$((pass + 1)) ;; *) fail=$((fail + 1)); echo "FAIL: $1: output lacks '$3'"; echo "$2" | head -5 ;; esac
}
out=$("$BIN" --help); check "--help" 0 $?; contains "--help lists generate" "$out" "generate"
out=$("$BIN" generate --help); check "generate --help" 0 $?; contains "generate --help" "$out" "--temperature"
out=$("$BIN" --version); check "--version" 0 $?
out=$("$BIN" 2>&1); check "no command" 2 $?
out=$("$BIN" frobnicate 2>&1); check "unknown command" 2 $?; contains "unknown command" "$out" "unknown command"
out=$("$BIN" generate --prompt-ids 1 2>&1); check "no model" 2 $?; contains "no model" "$out" "--dummy-weights"
out=$("$BIN" generate --dummy-weights tiny-qwen3 --model x --prompt-ids 1 2>&1); check "two models" 2 $?
out=$("$BIN" generate --dummy-weights tiny-qwen3 2>&1); check "no prompt" 2 $?
out=$("$BIN" generate --dummy-weights tiny-qwen3 --prompt-ids 1 --bogus 2>&1); check "unknown option" 2 $?
contains "unknown option" "$out" "--bogus"
out=$("$BIN" generate --dummy-weights tiny-qwen3 --prompt-ids 1 --temperature -1 2>&1); check "temperature<0" 2 $?
contains "temperature message" "$out" "temperature"
out=$("$BIN" generate --dummy-weights tiny-qwen3 --prompt-ids 1 --top-p 0 2>&1); check "top-p 0" 2 $?
contains "top-p names the flag" "$out" "--top-p must be in (0, 1], got 0"
out=$("$BIN" generate --dummy-weights tiny-qwen3 --prompt-ids 1 --max-tokens x 2>&1); check "max-tokens x" 2 $?
out=$("$BIN" generate --dummy-weights tiny-qwen3 --prompt-ids 1,99999 2>&1); check "id out of range" 2 $?
out=$("$BIN" generate --dummy-weights nope --prompt-ids 1 2>&1); check "unknown preset" 2 $?
contains "unknown preset lists presets" "$out" "qwen3-0.6b"
out=$("$BIN" generate --model /nonexistent --prompt-ids 1 2>&1); check "missing dir" 2 $?
contains "missing dir message" "$out" "No such file or directory"
out=$("$BIN" generate --model Qwen/Qwen3-0.6B --prompt-ids 1 2>&1); check "hub id" 2 $?
contains "hub id hint" "$out" "huggingface-cli download Qwen/Qwen3-0.6B"
out=$("$BIN" generate --model "$SRC/tests" --prompt-ids 1 2>&1); check "not a model dir" 2 $?
contains "not a model dir message" "$out" "config.json"
bad=$(mktemp -d); echo '{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}' > "$bad/config.json"
out=$("$BIN" generate --model "$bad" --prompt-ids 1 2>&1); check "unsupported arch" 1 $?
[ "$(echo "$out" | wc -l)" -eq 1 ]; check "runtime error is one line" 0 $?
rm -rf "$bad"
out=$("$BIN" generate --dummy-weights tiny-qwen3 --prompt-ids 1 --max-tokens 100000 2>&1); check "over context" 2 $?
contains "over context message" "$out" "context"

# Checks that need no weights come before loading them: qwen3-8b's dummy
# weights take minutes to make on a CPU, so an answer within 10 s (exit 2,
# not timeout's 124) proves the check ran first.
early() { # name, expected message, args...
  local name=$1 msg=$2; shift 2
  local o; o=$(timeout 10 "$BIN" generate --dummy-weights qwen3-8b "$@" 2>&1); check "before loading: $name" 2 $?
  contains "before loading: $name" "$o" "$msg"
}
early "top-p" "--top-p must be in (0, 1], got 0" --prompt-ids 1 --top-p 0
early "min-p" "--min-p must be in [0, 1], got 2" --prompt-ids 1 --min-p 2
early "temperature" "--temperature must be" --prompt-ids 1 --temperature -0.5
early "presence-penalty" "--presence-penalty must be in [-2, 2]" --prompt-ids 1 --presence-penalty 3
early "max-tokens 0" "--max-tokens must be an integer from 1" --prompt-ids 1 --max-tokens 0
early "max-tokens -1" "--max-tokens must be an integer from 1" --prompt-ids 1 --max-tokens -1
early "empty id" "--prompt-ids: id 2 is empty" --prompt-ids 1,,2
early "trailing comma" "--prompt-ids: id 3 is empty" --prompt-ids 1,2,
early "not an id" "'x' is not a token id" --prompt-ids 1,x
early "id past the vocabulary" "outside the model's vocabulary (0..151935)" --prompt-ids 1,151936
early "max-model-len past the model's" "more than the model's context of 40960" --prompt-ids 1 --max-model-len 50000
early "max-tokens past max-model-len" "do not fit the context of 100 tokens (--max-model-len)" --prompt-ids 1,2 \
  --max-tokens 99 --max-model-len 100
early "text prompt without a tokenizer" "a text prompt needs a tokenizer" --prompt hi
early "prompt file without a tokenizer" "a text prompt needs a tokenizer" --prompt-file /dev/null
early "stop without a tokenizer" "--stop needs a tokenizer" --prompt-ids 1 --stop x
early "missing tokenizer dir" "--tokenizer /nonexistent" --prompt hi --tokenizer /nonexistent
early "tokenizer dir without tokenizer.json" "has no tokenizer.json" --prompt hi --tokenizer "$SRC/tests"
early "two prompts" "exactly one of --prompt, --prompt-file or --prompt-ids" --prompt-ids 1 --prompt hi
early "chat with ids" "--chat needs a text prompt" --prompt-ids 1 --chat
early "empty stop" "--stop needs a non-empty string" --prompt-ids 1 --stop ""
early "old --max-batch-tokens" "--max-num-batched-tokens" --prompt-ids 1 --max-batch-tokens 64
early "bad max-num-batched-tokens" "--max-num-batched-tokens must be" --prompt-ids 1 --max-num-batched-tokens 0

# SIGTERM while the weights load ends the process at once (143), as Ctrl-C does.
"$BIN" generate --dummy-weights qwen3-8b --prompt-ids 1 -q >/dev/null 2>&1 &
pid=$!
sleep 1
kill -TERM $pid
t0=$(date +%s)
reap $pid; rc=$?
check "SIGTERM while loading" 143 $rc
[ $(($(date +%s) - t0)) -le 5 ]; check "SIGTERM while loading is prompt" 0 $?

# A directory without weights works with --load-format dummy and fails clearly without it.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$SRC/tests/fixtures/models/qwen3-tied/config.json" "$tmp/"
out=$("$BIN" generate --model "$tmp" --prompt-ids 1,2 2>&1); check "no weights" 1 $?
contains "no weights hints dummy" "$out" "--load-format dummy"
out=$("$BIN" generate --model "$tmp" --load-format dummy --prompt-ids 1,2 --max-tokens 4 -q 2>&1); check "load-format dummy" 0 $?
out=$("$BIN" generate --model "$tmp" --load-format dummy --prompt hi 2>&1); check "text prompt, no tokenizer.json" 2 $?
contains "text prompt, no tokenizer.json" "$out" "the model directory has no tokenizer.json"
# Weights that cannot load: the command line's errors still come first (2), before the load fails (1).
g="$tmp/garbage"
mkdir -p "$g"
cp "$SRC/tests/fixtures/models/qwen3-tied/config.json" "$g/"
head -c 4096 /dev/urandom > "$g/model.safetensors"
out=$("$BIN" generate --model "$g" --prompt-ids 1 --top-p 0 2>&1); check "garbage weights, bad --top-p" 2 $?
out=$("$BIN" generate --model "$g" --prompt hi 2>&1); check "garbage weights, no tokenizer" 2 $?
out=$("$BIN" generate --model "$g" --prompt-ids 1,2,3 2>&1); check "garbage weights fail to load" 1 $?

# Seeded sampling is reproducible; the stats line is printed.
a=$("$BIN" generate --dummy-weights tiny-llama3 --prompt-ids 5,6,7 --max-tokens 24 --temperature 1.5 --seed 42 --ignore-eos -q 2>/dev/null)
b=$("$BIN" generate --dummy-weights tiny-llama3 --prompt-ids 5,6,7 --max-tokens 24 --temperature 1.5 --seed 42 --ignore-eos -q 2>/dev/null)
c=$("$BIN" generate --dummy-weights tiny-llama3 --prompt-ids 5,6,7 --max-tokens 24 --temperature 1.5 --seed 43 --ignore-eos -q 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ]; check "same seed, same output" 0 $?
[ "$a" != "$c" ]; check "different seed, different output" 0 $?
[ "$(echo "$a" | wc -w)" -eq 24 ]; check "24 tokens" 0 $?
err=$("$BIN" generate --dummy-weights tiny-llama3 --prompt-ids 5,6,7 --max-tokens 8 2>&1 >/dev/null)
contains "stats line" "$err" "prefill"
contains "stats line decode" "$err" "decode"
contains "random weights warning" "$err" "RANDOM"
contains "stats line says the seed when sampling" "$err" "; seed "
err=$("$BIN" generate --dummy-weights tiny-llama3 --prompt-ids 5,6,7 --max-tokens 8 --seed 42 --temperature 0.7 2>&1 >/dev/null)
contains "stats line repeats --seed" "$err" "; seed 42"
err=$("$BIN" generate --dummy-weights tiny-llama3 --prompt-ids 5,6,7 --max-tokens 8 --temperature 0 2>&1 >/dev/null)
case "$err" in *"seed "*) check "greedy prints no seed" 0 1 ;; *) check "greedy prints no seed" 0 0 ;; esac

# Ctrl-C (SIGINT) or SIGTERM while generating: the output so far, a final
# newline, the stats line, and 130 / 143.
# The previous round's files go first: the wait below for output must see this
# round's, not SIGINT's leftovers, or SIGTERM can come before replay runs.
for sig in INT TERM; do
  rm -f "$tmp/sig.out" "$tmp/sig.err"
  "$BIN" generate --dummy-weights tiny-llama3 --prompt-ids 1,2,3 --max-tokens 8000 --ignore-eos -q \
    >"$tmp/sig.out" 2>"$tmp/sig.err" &
  pid=$!
  for _ in $(seq 200); do [ -s "$tmp/sig.out" ] && break; sleep 0.1; done
  kill -$sig $pid
  reap $pid; rc=$?
  check "SIG$sig while generating" $([ $sig = INT ] && echo 130 || echo 143) $rc
  [ "$(tail -c 1 "$tmp/sig.out" | od -An -c | tr -d ' ')" = '\n' ]; check "SIG$sig: final newline" 0 $?
  contains "SIG$sig: stats line" "$(cat "$tmp/sig.err")" "generated"
  contains "SIG$sig: stats line says interrupted" "$(cat "$tmp/sig.err")" "(interrupted)"
done

# Greedy output of the CLI equals transformers' on a fixture model.
ref="$SRC/tests/fixtures/models/llama3-scaled/reference.json"
prompt=$(python3 -c "import json;print(','.join(map(str,json.load(open('$ref'))['prompts'][2])))" 2>/dev/null)
want=$(python3 -c "import json;print(' '.join(map(str,json.load(open('$ref'))['greedy'][2])))" 2>/dev/null)
if [ -n "$prompt" ]; then
  got=$("$BIN" generate --model "$SRC/tests/fixtures/models/llama3-scaled" --prompt-ids "$prompt" \
        --max-tokens 32 --temperature 0 --ignore-eos -q 2>/dev/null)
  [ "$got" = "$want" ]; check "CLI greedy equals transformers" 0 $?
fi

# Text in and out through a SentencePiece-style tokenizer: the tiny Mistral-v0.3-style fixture
# (its chat template writes [INST] ... [/INST]) on dummy Mistral weights.
m="$tmp/mistral-text"
mkdir -p "$m"
cp "$SRC"/tests/fixtures/tokenizer/mistral_tiny/tokenizer*.json "$m/"
cat > "$m/config.json" <<'JSON'
{"architectures": ["MistralForCausalLM"], "vocab_size": 700, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
 "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2}
JSON
out=$("$BIN" generate --model "$m" --load-format dummy --prompt "Hello there" --max-tokens 8 --seed 1 -q 2>&1)
check "sentencepiece generate" 0 $?
[ -n "$out" ]; check "sentencepiece output not empty" 0 $?
out=$("$BIN" generate --model "$m" --load-format dummy --chat --prompt "Hi" --max-tokens 8 --seed 1 2>&1)
check "sentencepiece chat generate" 0 $?
contains "sentencepiece chat prompt" "$out" "prompt 5 tokens"

# Text in and out through the real Qwen3 tokenizer (scripts/fetch-tokenizers.sh puts it in .cache).
tok="$SRC/.cache/tokenizers/qwen3"
if [ -f "$tok/tokenizer.json" ]; then
  out=$("$BIN" tokenize --model "$tok" "Hello world" 2>&1); check "tokenize" 0 $?
  [ "$out" = "9707 1879" ]; check "tokenize ids equal Hugging Face's" 0 $?
  out=$("$BIN" generate --dummy-weights tiny-qwen3 --tokenizer "$tok" --prompt hi 2>&1); check "tokenizer larger than vocab" 1 $?
  contains "vocab mismatch message" "$out" "vocabulary"
  [ "$(printf '%s\n' "$out" | grep -c vocabulary)" -eq 1 ]; check "vocab mismatch said once" 0 $?
  out=$("$BIN" generate --dummy-weights tiny-qwen3 --prompt hi 2>&1); check "text prompt without tokenizer" 2 $?
  contains "no tokenizer message" "$out" "tokenizer"
  m="$tmp/qwen3-text"
  mkdir -p "$m"
  cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$m/"
  cat > "$m/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
 "tie_word_embeddings": false, "eos_token_id": 151645}
JSON
  out=$("$BIN" generate --model "$m" --load-format dummy --chat --prompt "Hi there" --max-tokens 6 --seed 1 -q 2>&1)
  check "chat generate with text" 0 $?
  [ -n "$out" ]; check "chat output not empty" 0 $?
  out=$("$BIN" generate --model "$m" --load-format dummy --chat --chat-template nope --prompt x 2>&1)
  check "chat template that is no file" 2 $?
  contains "chat template that is no file" "$out" "--chat-template takes a Jinja template file, and there is no file 'nope'"
  # --chat-template FILE replaces the model's template: one that raises, one that does not compile
  printf '{{ raise_exception("no chats today") }}' >"$tmp/raise.jinja"
  out=$("$BIN" generate --model "$m" --load-format dummy --chat --chat-template "$tmp/raise.jinja" --prompt x 2>&1)
  check "chat template that raises" 1 $?
  contains "chat template that raises" "$out" "no chats today"
  printf 'ok\n{%% include "x" %%}' >"$tmp/bad.jinja"
  out=$("$BIN" generate --model "$m" --load-format dummy --chat --chat-template "$tmp/bad.jinja" --prompt x 2>&1)
  check "chat template that does not compile" 1 $?
  contains "chat template that does not compile" "$out" "line 2"
  printf '{{ messages[0].content }}!' >"$tmp/echo.jinja"
  out=$("$BIN" generate --model "$m" --load-format dummy --chat --chat-template "$tmp/echo.jinja" --prompt "Hi" \
        --max-tokens 1 -q --print-ids --temperature 0 2>&1)
  check "chat template file" 0 $?
  # generation_config.json's sampling fills what no flag sets: temperature 0 is greedy (no seed
  # in the stats line); a flag wins; --generation-config vllm ignores the file
  printf '{"temperature": 0, "top_k": 5, "eos_token_id": 151645}' >"$m/generation_config.json"
  err=$("$BIN" generate --model "$m" --load-format dummy --prompt-ids 5,6 --max-tokens 2 2>&1 >/dev/null)
  contains "generation_config logged" "$err" "generation_config.json: temperature=0 top_k=5"
  case "$err" in *"seed "*) check "generation_config temperature 0 is greedy" 0 1 ;; *) check "generation_config temperature 0 is greedy" 0 0 ;; esac
  err=$("$BIN" generate --model "$m" --load-format dummy --prompt-ids 5,6 --max-tokens 2 --temperature 0.8 2>&1 >/dev/null)
  contains "a flag wins over generation_config" "$err" "; seed "
  err=$("$BIN" generate --model "$m" --load-format dummy --prompt-ids 5,6 --max-tokens 2 --generation-config vllm 2>&1 >/dev/null)
  contains "--generation-config vllm ignores the file" "$err" "; seed "
  out=$("$BIN" generate --model "$m" --load-format dummy --prompt-ids 5,6 --generation-config nope 2>&1)
  check "bad --generation-config" 2 $?
  printf '{"top_p": 7}' >"$m/generation_config.json"
  out=$("$BIN" generate --model "$m" --load-format dummy --prompt-ids 5,6 2>&1)
  check "generation_config out of range" 1 $?
  contains "generation_config out of range" "$out" "generation_config.json"
  rm "$m/generation_config.json"
  out=$("$BIN" generate --model "$m" --load-format dummy --prompt "Hi" --system x 2>&1); check "--system without --chat" 2 $?
  # The prompt from a file (one final newline dropped) or standard input equals --prompt.
  want=$("$BIN" generate --model "$m" --load-format dummy --prompt "Hi there" --max-tokens 6 --temperature 0 -q 2>/dev/null)
  printf 'Hi there\n' > "$tmp/prompt.txt"
  got=$("$BIN" generate --model "$m" --load-format dummy --prompt-file "$tmp/prompt.txt" --max-tokens 6 \
        --temperature 0 -q 2>/dev/null)
  check "prompt file" 0 $?
  [ -n "$want" ] && [ "$got" = "$want" ]; check "prompt file equals --prompt" 0 $?
  got=$(printf 'Hi there' | "$BIN" generate --model "$m" --load-format dummy --prompt-file - --max-tokens 6 \
        --temperature 0 -q 2>/dev/null)
  [ "$got" = "$want" ]; check "prompt from stdin equals --prompt" 0 $?
  : > "$tmp/empty.txt"
  out=$("$BIN" generate --model "$m" --load-format dummy --prompt-file "$tmp/empty.txt" 2>&1)
  check "empty prompt file" 2 $?; contains "empty prompt file" "$out" "is empty"
  out=$("$BIN" generate --model "$m" --load-format dummy --prompt-file "$tmp" 2>&1)
  check "prompt file is a directory" 2 $?; contains "prompt file is a directory" "$out" "is a directory"
  out=$("$BIN" generate --model "$m" --load-format dummy --prompt-file "$tmp/nope.txt" 2>&1)
  check "missing prompt file" 2 $?; contains "missing prompt file" "$out" "No such file"
  # --stop: the output ends where the stop string would begin (taken from the output itself)
  full=$("$BIN" generate --model "$m" --load-format dummy --prompt "Hi there" --max-tokens 24 --temperature 0 \
         --ignore-eos -q 2>/dev/null)
  stop=$(FULL="$full" python3 -c 'import os; t = os.environ["FULL"]; n = len(t); print(t[n // 2:n // 2 + 2], end="")')
  if [ -n "$stop" ]; then
    want=$(FULL="$full" STOP="$stop" python3 -c 'import os; t = os.environ["FULL"]; print(t[:t.index(os.environ["STOP"])])')
    got=$("$BIN" generate --model "$m" --load-format dummy --prompt "Hi there" --max-tokens 24 --temperature 0 \
          --ignore-eos --stop "$stop" --stop "never-in-the-output" 2>"$tmp/stop.err")
    check "--stop" 0 $?
    [ "$got" = "$want" ]; check "--stop cuts the output before the stop string" 0 $?
    contains "--stop finish reason" "$(cat "$tmp/stop.err")" "(stop)"
    # speculative rounds emit several tokens at once: the stop still cuts the text in the same place
    got=$("$BIN" generate --model "$m" --load-format dummy --prompt "Hi there" --max-tokens 24 --temperature 0 \
          --ignore-eos --stop "$stop" --speculative-method ngram --prompt-lookup-min 1 2>/dev/null)
    [ "$got" = "$want" ]; check "--stop with speculative decoding" 0 $?
  fi
fi

# Speculative decoding (n-gram drafts): bad options are usage errors before loading; the output is
# that of decoding without it, token for token, greedy and seeded with penalties
early "draft count without a method" "--num-speculative-tokens needs --speculative-method" --prompt-ids 1 \
  --num-speculative-tokens 3
early "unknown method" "--speculative-method must be ngram, draft_model or none" --prompt-ids 1 \
  --speculative-method eagle
early "draft model method without a model" "--speculative-method draft_model needs --speculative-model" \
  --prompt-ids 1 --speculative-method draft_model
early "ngram with a draft model" "--speculative-model is for --speculative-method draft_model" --prompt-ids 1 \
  --speculative-method ngram --speculative-model /nonexistent
early "two draft models" "give one of --speculative-model and --speculative-dummy-weights" --prompt-ids 1 \
  --speculative-model /nonexistent --speculative-dummy-weights tiny-qwen3
early "match lengths with a draft model" "--prompt-lookup-max is for --speculative-method ngram" --prompt-ids 1 \
  --speculative-model /nonexistent --prompt-lookup-max 3
early "9 drafts" "--num-speculative-tokens must be an integer from 1 to 8" --prompt-ids 1 \
  --speculative-method ngram --num-speculative-tokens 9
early "match lengths reversed" "--prompt-lookup-min 5 is more than --prompt-lookup-max 3" --prompt-ids 1 \
  --speculative-method ngram --prompt-lookup-min 5 --prompt-lookup-max 3
# Structured output (docs/structured.md): the flags' usage errors before the weights load, then
# a random model's outputs in their language (compact JSON: random weights would fill any
# whitespace allowed)
if [ -f "$tok/tokenizer.json" ]; then
  so() { early "$1" "$2" --prompt-ids 1 --tokenizer "$tok" "${@:3}"; }
  so "two constraints" "--json-object and --regex both constrain the output" --json-object --regex a
  so "choice and a schema" "--choice and --json-schema both constrain" --choice a --json-schema /dev/null
  so "a flag twice" "--regex is given twice" --regex a --regex b
  so "schema file missing" "--json-schema /nonexistent: No such file or directory" --json-schema /nonexistent
  so "empty schema file" "--json-schema /dev/null is empty" --json-schema /dev/null
  echo '{"type": "object", "patternProperties": {}}' >"$tmp/bad-schema.json"
  so "unsupported keyword" "invalid --json-schema: unsupported JSON Schema keyword 'patternProperties'" \
    --json-schema "$tmp/bad-schema.json"
  echo '{"type": ' >"$tmp/torn-schema.json"
  so "schema not JSON" "invalid --json-schema" --json-schema "$tmp/torn-schema.json"
  so "bad regex" "invalid --regex" --regex '(a)\1'
  printf 'root ::= item\n' >"$tmp/bad.gbnf"
  so "bad grammar" "invalid --grammar" --grammar "$tmp/bad.gbnf"
  so "bad whitespace mode" "--structured-whitespace must be any or compact, got 'some'" --regex a \
    --structured-whitespace some
  early "constraint without a tokenizer" "--regex needs a tokenizer" --prompt-ids 1 --regex a
  sm="$tmp/qwen3-structured"
  mkdir -p "$sm"
  cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$sm/"
  cat > "$sm/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
 "tie_word_embeddings": false, "eos_token_id": 151645}
JSON
  sgen() { "$BIN" generate --model "$sm" --load-format dummy --prompt "Answer:" --max-tokens 200 -q "$@"; }
  echo '{"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
         "n": {"type": "integer", "minimum": 1, "maximum": 99}, "ok": {"type": "boolean"}},
         "required": ["name", "n", "ok"]}' >"$tmp/schema.json"
  for seed in 1 2 3; do
    out=$(sgen --json-schema "$tmp/schema.json" --structured-whitespace compact --seed $seed 2>"$tmp/s.err")
    check "--json-schema (seed $seed)" 0 $?
    contains "--json-schema stops (seed $seed)" "$(cat "$tmp/s.err")" "(stop)"
    node -e 'const o = JSON.parse(process.argv[1]);
      if (Object.keys(o).join() !== "name,n,ok" || typeof o.name !== "string" || [...o.name].length > 6 ||
          !Number.isInteger(o.n) || o.n < 1 || o.n > 99 || typeof o.ok !== "boolean") process.exit(1)' "$out"
    check "--json-schema output valid (seed $seed): $out" 0 $?
  done
  out=$(sgen --json-object --structured-whitespace compact --seed 4 --max-tokens 64 2>/dev/null)
  check "--json-object" 0 $?
  [ "${out:0:1}" = "{" ]; check "--json-object starts an object: $out" 0 $?
  out=$(sgen --choice "yes" --choice "no way" --seed 5 --temperature 0 2>/dev/null); check "--choice" 0 $?
  [ "$out" = "yes" ] || [ "$out" = "no way" ]; check "--choice output is a choice: $out" 0 $?
  out=$(sgen --regex '[0-9]{3}-[a-z]{2}' --seed 6 2>/dev/null); check "--regex" 0 $?
  [[ "$out" =~ ^[0-9]{3}-[a-z]{2}$ ]]; check "--regex output matches: $out" 0 $?
  printf 'root ::= "(" [0-9] ("," [0-9])* ")"\n' >"$tmp/list.gbnf"
  out=$(sgen --grammar "$tmp/list.gbnf" --seed 7 2>/dev/null); check "--grammar" 0 $?
  [[ "$out" =~ ^\([0-9](,[0-9])*\)$ ]]; check "--grammar output matches: $out" 0 $?
  out=$(sgen --chat --choice "yes" --choice "no" --seed 8 2>/dev/null); check "--chat --choice" 0 $?
  [ "$out" = "yes" ] || [ "$out" = "no" ]; check "--chat --choice output is a choice: $out" 0 $?
fi

fx="$SRC/tests/fixtures/models/qwen3-tied"
for s in "--temperature 0" "--seed 7 --repetition-penalty 1.3 --top-k 20"; do
  # shellcheck disable=SC2086
  want=$("$BIN" generate --model "$fx" --prompt-ids 1,2,3,4,5,1,2,3 --max-tokens 60 --print-ids -q $s 2>/dev/null)
  # shellcheck disable=SC2086
  got=$("$BIN" generate --model "$fx" --prompt-ids 1,2,3,4,5,1,2,3 --max-tokens 60 --print-ids $s \
        --speculative-method ngram --num-speculative-tokens 6 --prompt-lookup-min 1 2>"$tmp/spec.err")
  check "speculative ($s)" 0 $?
  [ -n "$want" ] && [ "$got" = "$want" ]; check "speculative output equals plain ($s)" 0 $?
  contains "speculative stats ($s)" "$(cat "$tmp/spec.err")" "drafts accepted"
  # the target as its own draft model: greedy keeps every draft
  # shellcheck disable=SC2086
  got=$("$BIN" generate --model "$fx" --prompt-ids 1,2,3,4,5,1,2,3 --max-tokens 60 --print-ids $s \
        --speculative-model "$fx" --num-speculative-tokens 3 2>"$tmp/spec.err")
  check "draft model ($s)" 0 $?
  [ -n "$want" ] && [ "$got" = "$want" ]; check "draft model output equals plain ($s)" 0 $?
  contains "draft model stats ($s)" "$(cat "$tmp/spec.err")" "drafts accepted"
done
contains "self-draft keeps every greedy draft" "$("$BIN" generate --model "$fx" --prompt-ids 1,2,3 --max-tokens 40 \
  --temperature 0 --speculative-model "$fx" 2>&1 >/dev/null)" "speculative: 31 of 31 drafts accepted"
out=$("$BIN" generate --model "$fx" --prompt-ids 1,2,3 --max-tokens 4 --speculative-dummy-weights tiny-qwen3 2>&1)
check "draft model of another vocabulary" 1 $?
contains "draft model of another vocabulary" "$out" "the draft model's vocabulary has 1031 tokens, the target's 503"

# --quantization fp8: the layer matrices in e4m3 (the CPU computes with their
# dequantized values: tests/test_weights.c checks them); it generates, the
# same tokens twice; a bad value is a usage error
out=$("$BIN" generate --dummy-weights tiny-llama3 --prompt-ids 5,6,7 --max-tokens 8 --quantization int4 2>&1)
check "--quantization int4" 2 $?
contains "--quantization message" "$out" "--quantization must be none or fp8, got 'int4'"
q8=$("$BIN" generate --dummy-weights tiny-llama3 --prompt-ids 5,6,7 --max-tokens 12 --ignore-eos --print-ids -q --temperature 0 \
     --quantization fp8 2>/dev/null)
check "--quantization fp8" 0 $?
[ "$(echo "$q8" | wc -w)" -eq 12 ]; check "--quantization fp8: 12 tokens" 0 $?
q8b=$("$BIN" generate --dummy-weights tiny-llama3 --prompt-ids 5,6,7 --max-tokens 12 --ignore-eos --print-ids -q --temperature 0 \
      --quantization fp8 2>/dev/null)
[ "$q8" = "$q8b" ]; check "--quantization fp8 is deterministic" 0 $?
out=$("$BIN" generate --dummy-weights tiny-llama3 --prompt-ids 5,6,7 --max-tokens 2 --quantization none -q 2>&1)
check "--quantization none" 0 $?

# --tp N (tensor parallelism; on the CPU the shards run as N threads): the
# same greedy tokens and the same seeded samples as one device, with
# --quantization fp8 too (each shard e4m3 with the whole rows' scales); a
# model it does not divide and the multi-node flags' mistakes are usage errors
A="generate --dummy-weights tiny-llama3 --prompt-ids 1,2,3,4,5,6,7,8 --max-tokens 24 --temperature 0 --ignore-eos --print-ids -q --device cpu --threads 2"
t1=$("$BIN" $A 2>/dev/null); check "--tp 1" 0 $?
t2=$("$BIN" $A --tp 2 2>/dev/null); check "--tp 2" 0 $?
[ -n "$t1" ] && [ "$t1" = "$t2" ]; check "--tp 2 greedy equals --tp 1" 0 $?
t2=$("$BIN" $A --tensor-parallel-size 2 --temperature 0.8 --seed 5 2>/dev/null); check "--tp 2 sampled" 0 $?
t1=$("$BIN" $A --temperature 0.8 --seed 5 2>/dev/null)
[ -n "$t1" ] && [ "$t1" = "$t2" ]; check "--tp 2 sampled equals --tp 1" 0 $?
out=$("$BIN" $A --tp 4 2>&1); check "--tp 4 on 10 heads" 2 $?
contains "--tp 4 message" "$out" "does not divide num_attention_heads=10"
out=$("$BIN" $A --tp 3 2>&1); check "--tp 3" 2 $?
q1=$("$BIN" $A --quantization fp8 2>/dev/null); check "--tp 1 --quantization fp8" 0 $?
q2=$("$BIN" $A --tp 2 --quantization fp8 2>/dev/null); check "--tp 2 --quantization fp8" 0 $?
[ -n "$q1" ] && [ "$q1" = "$q2" ]; check "--tp 2 --quantization fp8 greedy equals --tp 1" 0 $?
out=$("$BIN" $A --tp 2 --nnodes 2 2>&1); check "--nnodes without address" 2 $?
contains "--nnodes message" "$out" "--dist-init-addr"
out=$("$BIN" $A --tp 2 --nnodes 3 --dist-init-addr 127.0.0.1:29500 2>&1); check "--nnodes 3 of 2" 2 $?
out=$("$BIN" $A --tp 2 --node-rank 1 2>&1); check "--node-rank without --nnodes" 2 $?
out=$("$BIN" $A --tp 2 --nnodes 2 --dist-init-addr nocolon 2>&1); check "--dist-init-addr without port" 2 $?
t1=$("$BIN" $A 2>/dev/null)
t2=$("$BIN" $A --tp 2 --dist-timeout 5 2>/dev/null); check "--tp 2 --dist-timeout 5" 0 $?
[ -n "$t1" ] && [ "$t1" = "$t2" ]; check "--dist-timeout changes no token" 0 $?
out=$("$BIN" $A --tp 2 --dist-timeout 0 2>&1); check "--dist-timeout 0" 2 $?
contains "--dist-timeout message" "$out" "--dist-timeout must be a number of seconds"
# the CPU's ranks sum in host memory: the GPUs' peer-memory path is not theirs, and the flag changes nothing
t3=$("$BIN" $A --tp 2 --disable-custom-all-reduce 2>/dev/null); check "--tp 2 --disable-custom-all-reduce" 0 $?
[ -n "$t1" ] && [ "$t1" = "$t3" ]; check "--disable-custom-all-reduce changes no token" 0 $?

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
