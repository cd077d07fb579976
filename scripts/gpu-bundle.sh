#!/usr/bin/env bash
# Packs what a GPU machine without apt needs into .gpu/ (git-ignored): the
# built binaries, the Debian .so files it lacks, the fixtures' tools and the
# check script. The device tool carries .gpu/ (carry: [".gpu"]); there, run
#   LD_LIBRARY_PATH=.gpu/lib .gpu/bin/<binary>
# or simply: bash .gpu/gpu-check.sh
# GPU_DIR=.gpu-NAME packs elsewhere (several people sharing one tree; pass
# GPU_DIR to gpu-check.sh / bench/decode_ab.sh there too).
# AB_BASE=REV also builds revision REV (in a git worktree, build-ab/) and
# packs its replay as $G/old/replay, for bench/decode_ab.sh's "old:" variants.
# TRACE=1 also builds this tree with the one-kernel decode step's trace
# (-DREPLAY_DECODE_STEP_TRACE=ON) and packs it as $G/trace/replay: `replay
# profile` there prints the trace, and its --timeline FILE feeds
# tools/step_timeline.py.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
G=${GPU_DIR:-.gpu}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREPLAY_CUDA=ON >/dev/null
cmake --build "$BUILD" -j "$(nproc)" >/dev/null
rm -rf "$G" && mkdir -p "$G/bin" "$G/lib"
cp "$BUILD"/replay "$G/bin/"
# the GPU tests only: the CPU tests run here (make test), and the carry limit is 64 MiB
for t in "$BUILD"/test_cuda_*; do [ -x "$t" ] && cp "$t" "$G/bin/"; done
for b in "$BUILD"/bench_*; do [ -x "$b" ] && cp "$b" "$G/bin/" || true; done
# Copies the named shared libraries (as ldconfig finds them) into a folder.
copy_libs() {
  local dest=$1 lib f; shift
  for lib in "$@"; do
    # awk reads all input (no early exit): under pipefail a SIGPIPE'd ldconfig would stop the script
    f=$(ldconfig -p | awk -v l="$lib" '$1 == l && !found {print $NF; found = 1}')
    [ -n "$f" ] && cp -L "$f" "$dest/"
  done
  return 0
}
# Libraries the GPU image lacks (it has libgomp, libjansson, libpcre2-8, CUDA 13).
copy_libs "$G/lib" libutf8proc.so.2 libcmocka.so.0 libmicrohttpd.so.12 libcjson.so.1 libedit.so.2 libbsd.so.0 libmd.so.0
cp scripts/gpu-check.sh "$G/" 2>/dev/null || true
# Qwen3's tokenizer (scripts/fetch-tokenizers.sh), xz-compressed, for the server stage's
# structured output (a constraint needs token bytes)
if [ -f .cache/tokenizers/qwen3/tokenizer.json ]; then
  tar -C .cache/tokenizers -cJf "$G/qwen3-tokenizer.tar.xz" qwen3
fi
# AB_BASE="NAME=REV ..." packs several, each as $G/NAME/replay.
for spec in ${AB_BASE:-}; do
  name=old rev=$spec
  if [[ $spec == *=* ]]; then name=${spec%%=*} rev=${spec#*=}; fi
  # resolved here: inside the worktree HEAD would name its own last checkout
  rev=$(git rev-parse --verify "$rev^{commit}")
  W=build-ab/src
  [ -d "$W" ] || git worktree add --detach "$W" "$rev" >/dev/null
  git -C "$W" checkout -q --detach "$rev"
  cmake -S "$W" -B build-ab/build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREPLAY_CUDA=ON >/dev/null
  cmake --build build-ab/build -j "$(nproc)" --target replay >/dev/null
  mkdir -p "$G/$name" && cp build-ab/build/replay "$G/$name/"
done
if [ "${TRACE:-0}" = 1 ]; then
  cmake -S . -B build-trace -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREPLAY_CUDA=ON -DREPLAY_DECODE_STEP_TRACE=ON >/dev/null
  cmake --build build-trace -j "$(nproc)" --target replay >/dev/null
  mkdir -p "$G/trace" && cp build-trace/replay "$G/trace/"
fi
# ASAN=1 also builds the host code with AddressSanitizer + UBSan (CUDA on)
# and packs it, with the sanitizer runtimes the GPU image lacks, as
# $G/asan.tgz for scripts/gpu-asan.sh (compressed: the carry limit is 64 MiB).
if [ "${ASAN:-0}" = 1 ]; then
  A=build-cuda-asan
  cmake -S . -B "$A" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREPLAY_SANITIZE=ON -DREPLAY_CUDA=ON >/dev/null
  cmake --build "$A" -j "$(nproc)" --target replay test_cuda_backend test_cuda_sample >/dev/null
  Z=$(mktemp -d)
  cp "$A/replay" "$A/test_cuda_backend" "$A/test_cuda_sample" "$Z/"
  strip --strip-debug "$Z"/*
  copy_libs "$Z" libasan.so.8 libubsan.so.1
  tar czf "$G/asan.tgz" -C "$Z" . && rm -rf "$Z"
fi
cp scripts/gpu-asan.sh "$G/" 2>/dev/null || true
strip --strip-debug "$G"/*/replay "$G"/bin/* 2>/dev/null || true
du -sh "$G"
