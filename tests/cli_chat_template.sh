#!/usr/bin/env bash
# `replay chat-template` as a user runs it: Qwen3's real template on a
# conversation (the same text transformers gives, as tests/fixtures/tokenizer/chat.json
# records), tools and --kwargs reaching the template, --chat-template, a
# directory with only chat_template.jinja, the template's raise_exception and
# errors with status 1, and usage errors with status 2.
set -u
BIN=$1
SRC=$2
Q="$SRC/.cache/tokenizers/qwen3"
G="$SRC/.cache/tokenizers/gemma3"
pass=0
fail=0
check() { # name, expected, actual
  if [ "$2" = "$3" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1 (got '$3', expected '$2')"; fi
}
contains() { # name, haystack, needle
  case "$2" in *"$3"*) pass=$((pass + 1)) ;; *) fail=$((fail + 1)); echo "FAIL: $1: output lacks '$3'"; echo "$2" | head -5 ;; esac
}
"$SRC/scripts/fetch-tokenizers.sh" || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '[{"role": "user", "content": "What is 2+2?"}]' >"$tmp/one.json"
out=$("$BIN" chat-template --model "$Q" --messages "$tmp/one.json"; echo "[rc=$?]")
check "qwen3" "$(printf '<|im_start|>user\nWhat is 2+2?<|im_end|>\n[rc=0]')" "$out"
out=$("$BIN" chat-template --model "$Q" --messages "$tmp/one.json" --add-generation-prompt --kwargs '{"enable_thinking": false}'; echo "[rc=$?]")
check "qwen3 agp, thinking off" "$(printf '<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n[rc=0]')" "$out"
out=$(cat "$tmp/one.json" | "$BIN" chat-template --model "$Q" --messages -); check "stdin" "$(printf '<|im_start|>user\nWhat is 2+2?<|im_end|>')" "$out"

# tools, from the request object or --tools
printf '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]}' >"$tmp/req.json"
out=$("$BIN" chat-template --model "$Q" --messages "$tmp/req.json"); contains "tools in the object" "$out" '{"type": "function", "function": {"name": "get_weather", "parameters": {}}}'
printf '[{"type": "function", "function": {"name": "search"}}]' >"$tmp/tools.json"
out=$("$BIN" chat-template --model "$Q" --messages "$tmp/one.json" --tools "$tmp/tools.json"); contains "--tools" "$out" '"name": "search"'

# --chat-template, and a directory holding only chat_template.jinja
printf '{%% for m in messages %%}[{{ m.role }}|{{ m.content }}|{{ greeting }}]{%% endfor %%}\n' >"$tmp/t.jinja"
out=$("$BIN" chat-template --chat-template "$tmp/t.jinja" --messages "$tmp/one.json" --kwargs '{"greeting": "hey"}'); check "--chat-template" "[user|What is 2+2?|hey]" "$out"
mkdir "$tmp/dir" && cp "$tmp/t.jinja" "$tmp/dir/chat_template.jinja"
out=$("$BIN" chat-template --model "$tmp/dir" --messages "$tmp/one.json"); check "chat_template.jinja" "[user|What is 2+2?|]" "$out"

# the template's own error: Gemma 3 requires alternating roles
printf '[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]' >"$tmp/two.json"
out=$("$BIN" chat-template --model "$G" --messages "$tmp/two.json" 2>&1); check "raise rc" 1 $?
contains "raise message" "$out" "Conversation roles must alternate user/assistant/user/assistant/..."
printf '{%% if x %%}\n{{ x | nosuch }}{%% endif %%}' >"$tmp/bad.jinja"
out=$("$BIN" chat-template --chat-template "$tmp/bad.jinja" --messages "$tmp/one.json" 2>&1); check "compile error rc" 1 $?
contains "compile error line" "$out" "line 2: no filter 'nosuch'"
out=$("$BIN" chat-template --model "$SRC/tests" --messages "$tmp/one.json" 2>&1); check "no template rc" 1 $?
contains "no template msg" "$out" "no chat template"
printf '{"messages": 5}' >"$tmp/notlist.json"
out=$("$BIN" chat-template --model "$Q" --messages "$tmp/notlist.json" 2>&1); check "bad messages rc" 1 $?

# usage errors
out=$("$BIN" chat-template --messages "$tmp/one.json" 2>&1); check "no model rc" 2 $?; contains "no model msg" "$out" "--model"
out=$("$BIN" chat-template --model "$Q" 2>&1); check "no messages rc" 2 $?
out=$("$BIN" chat-template --model /nonexistent --messages "$tmp/one.json" 2>&1); check "bad dir rc" 2 $?
out=$("$BIN" chat-template --model "$Q" --messages "$tmp/nope.json" 2>&1); check "missing file rc" 2 $?
out=$("$BIN" chat-template --model "$Q" --messages "$tmp/one.json" --kwargs '[1]' 2>&1); check "bad kwargs rc" 2 $?
out=$("$BIN" chat-template --help); check "--help rc" 0 $?; contains "--help" "$out" "--add-generation-prompt"

echo "cli_chat_template: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
