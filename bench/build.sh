#!/usr/bin/env bash
# Builds bench/bench_kernels against build/libreplay_core.a with the same
# link line CMake uses for the CUDA tests (run after the CMake build).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
gcc -O2 -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -DREPLAY_HAVE_CUDA=1 -Iinclude -Isrc -isystem /usr/local/cuda/include \
  -fopenmp -c bench/bench_kernels.c -o "$BUILD"/bench_kernels.o
(cd "$BUILD" && g++ bench_kernels.o -o bench_kernels @CMakeFiles/test_cuda_kernels.dir/linkLibs.rsp \
  -L/usr/local/cuda/targets/x86_64-linux/lib/stubs -L/usr/local/cuda/targets/x86_64-linux/lib)
