#!/usr/bin/env python3
"""TTFT of a long prompt whose prefix is cached against a short prompt, through
a running `replay serve` (issue 36: an 8,000-token prompt cached but for its
last 64 tokens must see its first token within 1.5x of a 64-token prompt's).

    replay serve --dummy-weights llama3-8b --port 8123 &
    python3 bench/prefix_ttft.py --url http://127.0.0.1:8123 --prefix 8000 --new 64

Prompts are token ids (the completions API takes them). Per round: a fresh
random prefix is sent once to fill the cache (its TTFT is the uncached
number), then prefix + 64 new tokens (cached but the tail), then a fresh
64-token prompt. Streaming, max_tokens 1; TTFT = time to the first event
with a token. Prints each round and the medians. Standard library only.
"""
import argparse
import json
import random
import statistics
import time
import urllib.request


def ttft(url, model, ids):
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": 1, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first = None
    cached = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if first is None and ev.get("choices"):
                first = time.perf_counter() - t0
            usage = ev.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            if "cached_tokens" in details:
                cached = details["cached_tokens"]
    return first, cached


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--prefix", type=int, default=8000)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()
    models = json.load(urllib.request.urlopen(args.url + "/v1/models"))
    model = models["data"][0]["id"]
    rng = random.Random(1)
    rand = lambda n: [rng.randrange(args.vocab) for _ in range(n)]
    # warm-up: graphs, allocator
    ttft(args.url, model, rand(args.new))
    ttft(args.url, model, rand(args.prefix))
    cold, warm, short = [], [], []
    print(f"{'round':>5} {'uncached ms':>12} {'cached+new ms':>14} {'cached tok':>10} {'short ms':>9}")
    for k in range(args.rounds):
        prefix = rand(args.prefix)
        c, _ = ttft(args.url, model, prefix)
        w, cached = ttft(args.url, model, prefix + rand(args.new))
        s, _ = ttft(args.url, model, rand(args.new))
        cold.append(c), warm.append(w), short.append(s)
        print(f"{k:>5} {c * 1e3:>12.1f} {w * 1e3:>14.1f} {str(cached):>10} {s * 1e3:>9.1f}")
    mc, mw, ms = (statistics.median(x) * 1e3 for x in (cold, warm, short))
    print(f"median: {args.prefix}-token prompt uncached {mc:.1f} ms; cached but its last {args.new} tokens "
          f"{mw:.1f} ms; a {args.new}-token prompt {ms:.1f} ms; ratio {mw / ms:.2f}x")


if __name__ == "__main__":
    main()
