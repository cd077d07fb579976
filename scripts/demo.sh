#!/usr/bin/env bash
# `make demo`: generates from a small built-in model on the CPU, no download.
set -euo pipefail
BIN=${1:-build/replay}
cd "$(dirname "$0")/.."
echo "== replay demo: a tiny Qwen3-shaped model with RANDOM weights (no download), CPU backend"
echo "== its output is meaningless; the point is the whole path: weights -> forward -> sampling -> stream"
echo
"$BIN" generate --dummy-weights tiny-qwen3 --prompt-ids 1,2,3,4,5,6,7,8 --max-tokens 48 \
  --temperature 0.8 --top-p 0.95 --seed 1 --ignore-eos
echo
echo "== the same path on a model directory made by transformers (tests/fixtures/models/llama3-scaled), greedy:"
"$BIN" generate --model tests/fixtures/models/llama3-scaled --prompt-ids 10,20,30 --max-tokens 16 \
  --temperature 0 --ignore-eos
