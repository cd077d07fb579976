#!/usr/bin/env bash
# `replay generate` and `replay --help` as a user runs them: exit codes (0 ok,
# 2 usage error, 1 runtime error), one-line errors, streaming output, the
# stats line, seeded reproducibility, and greedy output equal to
# transformers' on a fixture model.
set -u
BIN=$1
SRC=$2
pass=0
fail=0
check() { # name, expected rc, actual rc
  if [ "$2" = "$3" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1 (rc $3, expected $2)"; fi
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

# A directory without weights works with --load-format dummy and fails clearly without it.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$SRC/tests/fixtures/models/qwen3-tied/config.json" "$tmp/"
out=$("$BIN" generate --model "$tmp" --prompt-ids 1,2 2>&1); check "no weights" 1 $?
contains "no weights hints dummy" "$out" "--load-format dummy"
out=$("$BIN" generate --model "$tmp" --load-format dummy --prompt-ids 1,2 --max-tokens 4 -q 2>&1); check "load-format dummy" 0 $?

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

# Greedy output of the CLI equals transformers' on a fixture model.
ref="$SRC/tests/fixtures/models/llama3-scaled/reference.json"
prompt=$(python3 -c "import json;print(','.join(map(str,json.load(open('$ref'))['prompts'][2])))" 2>/dev/null)
want=$(python3 -c "import json;print(' '.join(map(str,json.load(open('$ref'))['greedy'][2])))" 2>/dev/null)
if [ -n "$prompt" ]; then
  got=$("$BIN" generate --model "$SRC/tests/fixtures/models/llama3-scaled" --prompt-ids "$prompt" \
        --max-tokens 32 --temperature 0 --ignore-eos -q 2>/dev/null)
  [ "$got" = "$want" ]; check "CLI greedy equals transformers" 0 $?
fi

# Text in and out through the real Qwen3 tokenizer (scripts/fetch-tokenizers.sh puts it in .cache).
tok="$SRC/.cache/tokenizers/qwen3"
if [ -f "$tok/tokenizer.json" ]; then
  out=$("$BIN" tokenize --model "$tok" "Hello world" 2>&1); check "tokenize" 0 $?
  [ "$out" = "9707 1879" ]; check "tokenize ids equal Hugging Face's" 0 $?
  out=$("$BIN" generate --dummy-weights tiny-qwen3 --tokenizer "$tok" --prompt hi 2>&1); check "tokenizer larger than vocab" 1 $?
  contains "vocab mismatch message" "$out" "vocabulary"
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
  check "unknown chat template name" 2 $?
  out=$("$BIN" generate --model "$m" --load-format dummy --prompt "Hi" --system x 2>&1); check "--system without --chat" 2 $?
  # chat REPL fed from a pipe: two turns, a reset, a third turn, EOF ends it
  out=$(printf 'Hello\nAnd then?\n/reset\nAgain\n' | "$BIN" chat --model "$m" --load-format dummy --max-tokens 4 \
        --seed 2 --temperature 0 -q 2>/dev/null)
  check "chat REPL" 0 $?
  [ "$(printf '%s\n' "$out" | wc -l)" -ge 3 ]; check "chat REPL answers each turn" 0 $?
  out=$(printf 'x\n' | "$BIN" chat --dummy-weights tiny-qwen3 2>&1); check "chat without tokenizer" 2 $?
  out=$(printf 'x\n' | "$BIN" chat --model "$m" --load-format dummy --temperature -3 2>&1); check "chat bad temperature" 2 $?
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
