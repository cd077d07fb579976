#!/usr/bin/env bash
# ajv, a JSON Schema validator independent of replay's grammar compiler,
# on the structured-output tests: (1) the schema corpus's labels
# (tests/fixtures/structured/schemas.json) are what
# tools/make_structured_corpus.mjs writes with the pinned ajv, and (2) every
# output of test_structured_generate (structured_generations.json in the
# build directory; ctest runs that test first) is JSON valid against its
# schema (tests/structured_ajv.mjs). ajv and ajv-formats are installed once
# into .cache/npm-ajv/ (ignored by git). Without node, or where npm cannot
# install them, the test is skipped (status 77): the C tests check the
# committed labels without npm.
set -u
BIN=$1
SRC=$2
AJV_VERSION=8.17.1
FORMATS_VERSION=3.0.1
cache="$SRC/.cache/npm-ajv"
gens="$(dirname "$BIN")/structured_generations.json"
command -v node >/dev/null || { echo "SKIP: node is not installed (scripts/deps.sh installs nodejs and npm)"; exit 77; }
have() { [ "$(node -p "require('$cache/node_modules/$1/package.json').version" 2>/dev/null)" = "$2" ]; }
if ! have ajv "$AJV_VERSION" || ! have ajv-formats "$FORMATS_VERSION"; then
  command -v npm >/dev/null || { echo "SKIP: npm is needed to install ajv"; exit 77; }
  mkdir -p "$cache"
  # a lock so parallel ctest runs (normal and ASan builds) do not install over each other
  ( flock 9
    have ajv "$AJV_VERSION" && have ajv-formats "$FORMATS_VERSION" && exit 0
    [ -f "$cache/package.json" ] || echo '{"private": true}' > "$cache/package.json"
    npm install --prefix "$cache" --no-audit --no-fund --silent "ajv@$AJV_VERSION" "ajv-formats@$FORMATS_VERSION" \
      >"$cache/install.log" 2>&1
  ) 9>"$cache.lock" || { echo "SKIP: npm install ajv@$AJV_VERSION ajv-formats@$FORMATS_VERSION failed"; cat "$cache/install.log"; exit 77; }
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# (1) the committed corpus is what the generator writes now
node "$SRC/tools/make_structured_corpus.mjs" "$tmp/schemas.json" || { echo "FAIL: make_structured_corpus.mjs"; exit 1; }
if ! cmp -s "$tmp/schemas.json" "$SRC/tests/fixtures/structured/schemas.json"; then
  echo "FAIL: tests/fixtures/structured/schemas.json is not what tools/make_structured_corpus.mjs writes; run it"
  diff "$tmp/schemas.json" "$SRC/tests/fixtures/structured/schemas.json" | head -20
  fail=1
fi

# (2) the generations, by ajv
[ -f "$gens" ] || { echo "FAIL: $gens is missing: run test_structured_generate first"; exit 1; }
node "$SRC/tests/structured_ajv.mjs" "$cache" "$SRC/tests/fixtures/structured/schemas.json" "$gens" || fail=1
[ $fail = 0 ] && echo "PASS"
exit $fail
