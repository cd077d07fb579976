#!/usr/bin/env bash
# `replay check-output` as a user runs it: each constraint kind on valid,
# refused and incomplete texts, from a file and from standard input, with
# exit status 0, 1 and its message (the byte offset); whitespace any and
# compact; a trailing newline named; usage errors (no constraint, two, a
# schema that does not compile, a missing file) with status 2. Then the
# schema corpus through the command: for a sample of its schemas, every
# instance gets the fixture's label (test_structured_corpus checks all of
# them through the library).
set -u
BIN=$1
SRC=$2
pass=0
fail=0
check() { # name, expected, actual
  if [ "$2" = "$3" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1 (got '$3', expected '$2')"; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
co() { "$BIN" check-output "$@" 2>&1; echo "[rc=$?]"; }

printf '{"type": "object", "properties": {"name": {"type": "string"}, "id": {"type": "integer", "minimum": 0}}, "required": ["name", "id"]}' >"$tmp/user.json"
printf '{"name": "Ann", "id": 7}' >"$tmp/ok.json"
check "schema valid (file)" "$(printf 'valid\n[rc=0]')" "$(co --json-schema "$tmp/user.json" "$tmp/ok.json")"
check "schema valid (stdin)" "$(printf 'valid\n[rc=0]')" "$(co --json-schema "$tmp/user.json" <"$tmp/ok.json")"
check "schema valid (-)" "$(printf 'valid\n[rc=0]')" "$(co --json-schema "$tmp/user.json" - <"$tmp/ok.json")"
check "schema refused" "$(printf "invalid at byte 22: '\"' cannot follow \"{\"name\": \"Ann\", \"id\": \"\n[rc=1]")" \
  "$(printf '{"name": "Ann", "id": "7"}' | co --json-schema "$tmp/user.json")"
check "schema bound" "$(printf "invalid at byte 22: '-' cannot follow \"{\"name\": \"Ann\", \"id\": \"\n[rc=1]")" \
  "$(printf '{"name": "Ann", "id": -7}' | co --json-schema "$tmp/user.json")"
check "schema incomplete" \
  "$(printf 'invalid at byte 14: incomplete: the text is a proper prefix of an allowed output (ends "{"name": "Ann"")\n[rc=1]')" \
  "$(printf '{"name": "Ann"' | co --json-schema "$tmp/user.json")"
check "empty input" \
  "$(printf 'invalid at byte 0: incomplete: the text is a proper prefix of an allowed output (ends "")\n[rc=1]')" \
  "$(co --json-object </dev/null)"
check "compact refuses a space" "$(printf "invalid at byte 8: ' ' cannot follow \"{\"name\":\"\n[rc=1]")" \
  "$(co --json-schema "$tmp/user.json" --structured-whitespace compact "$tmp/ok.json")"
check "compact" "$(printf 'valid\n[rc=0]')" \
  "$(printf '{"name":"Ann","id":7}' | co --json-schema "$tmp/user.json" --structured-whitespace compact)"
check "trailing newline" \
  "$(printf "invalid at byte 7: '\\\\n' cannot follow \"{\"a\":1}\" (a trailing newline: the text before it is valid)\n[rc=1]")" \
  "$(echo '{"a":1}' | co --json-object)"
check "regex" "$(printf 'valid\n[rc=0]')" "$(printf 'ab-123' | co --regex '[a-z]+-\d{3}')"
check "regex refused" "$(printf "invalid at byte 4: '4' cannot follow \"ab-1\"\n[rc=1]")" "$(printf 'ab-14' | co --regex '[a-z]+-1\d{0}3')"
check "choice" "$(printf 'valid\n[rc=0]')" "$(printf 'blue sky' | co --choice red --choice 'blue sky')"
check "choice prefix" \
  "$(printf 'invalid at byte 4: incomplete: the text is a proper prefix of an allowed output (ends "blue")\n[rc=1]')" \
  "$(printf 'blue' | co --choice red --choice 'blue sky')"
printf 'root ::= "(" [0-9]+ ")"\n' >"$tmp/g.gbnf"
check "grammar" "$(printf 'valid\n[rc=0]')" "$(printf '(42)' | co --grammar "$tmp/g.gbnf")"
check "grammar refused" "$(printf "invalid at byte 1: ')' cannot follow \"(\"\n[rc=1]")" "$(printf '()' | co --grammar "$tmp/g.gbnf")"
check "byte shown" "$(printf 'invalid at byte 0: byte 0xff cannot follow ""\n[rc=1]')" "$(printf '\377' | co --json-object)"

# usage errors: status 2, the compiler's message
out=$(co </dev/null); case "$out" in *"a constraint is required"*"[rc=2]") pass=$((pass + 1)) ;; *) fail=$((fail + 1)); echo "FAIL: no constraint: $out" ;; esac
out=$(co --json-object --regex a </dev/null); case "$out" in *"both constrain the output"*"[rc=2]") pass=$((pass + 1)) ;; *) fail=$((fail + 1)); echo "FAIL: two constraints: $out" ;; esac
printf '{"type": "object", "patternProperties": {}}' >"$tmp/bad.json"
out=$(co --json-schema "$tmp/bad.json" </dev/null); case "$out" in *"patternProperties"*"[rc=2]") pass=$((pass + 1)) ;; *) fail=$((fail + 1)); echo "FAIL: bad schema: $out" ;; esac
out=$(co --json-object "$tmp/missing.json"); case "$out" in *"missing.json"*"[rc=2]") pass=$((pass + 1)) ;; *) fail=$((fail + 1)); echo "FAIL: missing file: $out" ;; esac
out=$(co --json-object a b); case "$out" in *"unexpected argument 'b'"*"[rc=2]") pass=$((pass + 1)) ;; *) fail=$((fail + 1)); echo "FAIL: two files: $out" ;; esac

# the corpus through the command: every instance of every 8th schema (node
# splits the fixture into files; skipped without node)
if command -v node >/dev/null; then
  node -e '
    const fs = require("fs"), [src, dir] = process.argv.slice(1);
    const d = JSON.parse(fs.readFileSync(src + "/tests/fixtures/structured/schemas.json", "utf8"));
    d.schemas.filter((s, i) => i % 8 === 0).forEach((s, i) => {
      fs.writeFileSync(`${dir}/s${i}.schema`, JSON.stringify(s.schema));
      s.instances.forEach((x, k) => fs.writeFileSync(`${dir}/s${i}.${k}.${x.valid ? "valid" : "invalid"}`, x.text));
      s.differs.forEach((x, k) => fs.writeFileSync(`${dir}/s${i}.d${k}.${x.replay ? "valid" : "invalid"}`, x.text));
    });' "$SRC" "$tmp"
  n=0
  for f in "$tmp"/s*.*valid; do
    base=${f##*/}
    want=0; [ "${base##*.}" = invalid ] && want=1
    "$BIN" check-output --json-schema "$tmp/${base%%.*}.schema" "$f" >/dev/null 2>&1
    got=$?
    n=$((n + 1))
    [ "$got" = "$want" ] || { fail=$((fail + 1)); echo "FAIL: corpus $base: status $got"; }
  done
  [ "$n" -gt 200 ] || { fail=$((fail + 1)); echo "FAIL: only $n corpus instances"; }
  echo "corpus: $n instances through replay check-output"
fi

echo "cli_check_output: $pass passed, $fail failed"
[ $fail = 0 ]
