#!/usr/bin/env bash
# Builds bench/bench_tokenizer.c into build-bench/bench_tokenizer (optimised,
# -O2 like the main build). With --static the binary carries its libraries,
# so it runs on a machine without libjansson/libpcre2/libutf8proc (the GPU
# machine, where HF tokenizers is timed next to it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT_DIR:-$root/build-bench}"
mkdir -p "$out"
static=()
[ "${1:-}" = "--static" ] && static=(-static)
cc -std=c11 -O2 -D_GNU_SOURCE -fopenmp -I"$root/include" -I"$root/src" "${static[@]}" \
  -o "$out/bench_tokenizer" "$root/bench/bench_tokenizer.c" "$root"/src/tokenizer/*.c \
  "$root/src/util/err.c" "$root/src/util/log.c" -ljansson -lpcre2-8 -lutf8proc -lm
