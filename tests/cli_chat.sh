#!/usr/bin/env bash
# `replay chat` as a script drives it, through piped standard input: the
# commands (/help, /reset, /exit, an unknown one is an error that keeps the
# session), a conversation that outgrows a small --max-model-len (the oldest
# turns are dropped, said once, and later turns still get replies), a message
# too long to send, EOF, the checks made before loading, and SIGINT / SIGTERM
# during a reply and at the prompt. Line editing on a terminal is libedit's
# and is not driven here.
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
lacks() { # name, haystack, needle
  case "$2" in *"$3"*) fail=$((fail + 1)); echo "FAIL: $1: output has '$3'" ;; *) pass=$((pass + 1)) ;; esac
}
replies() { grep -c '^\[[0-9]* tokens' "$1"; } # the stats line after each reply, on stderr

out=$("$BIN" chat --help); check "chat --help" 0 $?
contains "help: --max-model-len" "$out" "--max-model-len"
contains "help: /help" "$out" "/help"
out=$("$BIN" chat --dummy-weights tiny-qwen3 --max-context 64 2>&1); check "old --max-context" 2 $?
contains "old --max-context hint" "$out" "--max-model-len"

tok="$SRC/.cache/tokenizers/qwen3"
if [ ! -f "$tok/tokenizer.json" ]; then
  echo "skipped: no Qwen3 tokenizer (scripts/fetch-tokenizers.sh)"
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
  exit
fi

# Checks that need no weights come before loading them (qwen3-8b's dummy
# weights take minutes to make: an answer within 10 s proves it).
early() { # name, expected message, args...
  local name=$1 msg=$2; shift 2
  local o; o=$(timeout 10 "$BIN" chat --dummy-weights qwen3-8b "$@" </dev/null 2>&1); check "before loading: $name" 2 $?
  contains "before loading: $name" "$o" "$msg"
}
early "no tokenizer" "chat needs a tokenizer"
early "missing tokenizer dir" "--tokenizer /nonexistent" --tokenizer /nonexistent
early "top-p" "--top-p must be in (0, 1], got 0" --tokenizer "$tok" --top-p 0
early "temperature" "--temperature must be" --tokenizer "$tok" --temperature -3
early "max-tokens 0" "--max-tokens must be an integer from 1" --tokenizer "$tok" --max-tokens 0
early "max-tokens -1" "--max-tokens must be an integer from 1" --tokenizer "$tok" --max-tokens -1
early "max-model-len past the model's" "more than the model's context of 40960" --tokenizer "$tok" --max-model-len 50000
early "max-tokens fills the context" "leaves no room for the conversation" --tokenizer "$tok" --max-model-len 512 \
  --max-tokens 512
early "chat template name" "--chat-template" --tokenizer "$tok" --chat-template nope
early "two constraints" "--json-object and --regex both constrain" --tokenizer "$tok" --json-object --regex a
early "bad regex" "invalid --regex" --tokenizer "$tok" --regex '(a)\1'

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
m="$tmp/qwen3-text"
mkdir -p "$m"
cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$m/"
cat > "$m/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
 "tie_word_embeddings": false, "eos_token_id": 151645}
JSON
# exec: in the background, $! is replay itself, the process the signals are for
chat() { exec "$BIN" chat --model "$m" --load-format dummy --seed 2 "$@"; }

out=$(printf 'x\n' | "$BIN" chat --dummy-weights tiny-qwen3 2>&1); check "chat without tokenizer" 2 $?
out=$(printf 'x\n' | chat --temperature -3 2>&1); check "chat bad temperature" 2 $?
# structured output: every reply one of the choices; a bad constraint before the weights load
out=$(printf 'Pick one\nAgain\n' | chat --choice yes --choice "no way" --max-tokens 8 2>/dev/null)
check "chat --choice" 0 $?
[ "$(printf '%s\n' "$out" | grep -cxE 'yes|no way')" = 2 ]; check "chat --choice replies: $out" 0 $?

# Two turns, a reset, a third turn; EOF ends the session with 0.
printf 'Hello\nAnd then?\n/reset\nAgain\n' | chat --max-tokens 4 --temperature 0 >"$tmp/out" 2>"$tmp/err"
check "turns, reset, EOF" 0 $?
[ "$(replies "$tmp/err")" -eq 3 ]; check "a reply to each turn" 0 $?
contains "/reset acknowledged" "$(cat "$tmp/err")" "(conversation cleared)"

# /help lists the commands; an unknown /command is an error, not a message,
# and the session goes on; '//' sends a message starting with '/'.
printf '/help\n/frobnicate\nHi\n//usr/bin\n/reset now\n/exit\nnever sent\n' | chat --max-tokens 4 >"$tmp/out" 2>"$tmp/err"
check "commands" 0 $?
for c in /help /reset /exit; do contains "/help lists $c" "$(cat "$tmp/out")" "$c"; done
contains "unknown command" "$(cat "$tmp/err")" "unknown command '/frobnicate'"
contains "command with arguments" "$(cat "$tmp/err")" "/reset takes no arguments"
[ "$(replies "$tmp/err")" -eq 2 ]; check "unknown command keeps the session; /exit quits" 0 $?

# A conversation that outgrows the context: the oldest turns are dropped, it
# is said once, and every turn gets a reply.
for i in $(seq 12); do echo "message number $i of a conversation that grows"; done |
  chat --max-tokens 8 --max-model-len 96 >"$tmp/out" 2>"$tmp/err"
check "context overflow session" 0 $?
[ "$(grep -c 'context full' "$tmp/err")" -eq 1 ]; check "context full said once" 0 $?
contains "context full message" "$(cat "$tmp/err")" "dropped the oldest"
[ "$(replies "$tmp/err")" -eq 12 ]; check "every turn answered after the context filled" 0 $?
lacks "no failed turn" "$(cat "$tmp/err")" "not sent"

# A message that cannot fit even alone is not sent; the next one is.
long=$(for i in $(seq 60); do printf 'word%d ' "$i"; done)
printf 'Hi\n%s\nAnd now?\n' "$long" | chat --max-tokens 8 --max-model-len 64 >"$tmp/out" 2>"$tmp/err"
check "message too long" 0 $?
contains "message too long" "$(cat "$tmp/err")" "not sent"
[ "$(replies "$tmp/err")" -eq 2 ]; check "the turns around it answered" 0 $?

# Signals once the model is loaded. A fifo keeps stdin open between lines.
fifo="$tmp/in"
mkfifo "$fifo"
wait_for() { # file, pattern: up to 60 s
  for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
# SIGINT during a reply stops it and the session goes on; SIGINT at an
# (empty) prompt quits with 130.
size() { stat -c %s "$1"; }
grows() { # file, size: until the file is larger, up to 60 s
  for _ in $(seq 600); do [ "$(size "$1")" -gt "$2" ] && return 0; sleep 0.1; done
  return 1
}
chat --max-tokens 1900 --max-model-len 2048 <"$fifo" >"$tmp/out" 2>"$tmp/err" &
pid=$!
exec 3>"$fifo"
echo "Tell me a long story" >&3
grows "$tmp/out" 0
kill -INT $pid
wait_for "$tmp/err" "stopped]"; check "SIGINT stops the reply" 0 $?
kill -0 $pid 2>/dev/null; check "the session goes on after SIGINT" 0 $?
before=$(size "$tmp/out")
echo "Another one" >&3
grows "$tmp/out" "$before"; check "the next message gets a reply" 0 $?
kill -INT $pid
for _ in $(seq 600); do [ "$(grep -c 'stopped]' "$tmp/err")" -ge 2 ] && break; sleep 0.1; done
[ "$(grep -c 'stopped]' "$tmp/err")" -eq 2 ]; check "SIGINT stops the second reply" 0 $?
kill -INT $pid
reap $pid; check "SIGINT at the prompt quits" 130 $?
exec 3>&-
# SIGTERM during a reply ends the session with 143.
chat --max-tokens 1900 --max-model-len 2048 <"$fifo" >"$tmp/out" 2>"$tmp/err" &
pid=$!
exec 3>"$fifo"
echo "Tell me a long story" >&3
for _ in $(seq 600); do [ -s "$tmp/out" ] && break; sleep 0.1; done
kill -TERM $pid
reap $pid; check "SIGTERM during a reply" 143 $?
exec 3>&-

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
