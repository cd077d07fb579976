#!/usr/bin/env python3
"""Checks prompt logprobs, logit_bias and min_tokens against a running `replay serve`
(any backend: this is how the CUDA backend is checked, where the C tests do not run).

  python3 tools/check_prompt_logprobs.py http://127.0.0.1:8000 [--eos ID] [--tol T]

Prompt logprobs: at each position of a prompt, greedy decoding of the prompt up to there
makes a token and a logprob; prompt_logprobs (20 alternatives, computed for the whole
prompt in one prefill) must list that token with that logprob (within --tol: the CUDA
backend's prefill and decode kernels round differently in bf16, so near ties may swap
the first two), echo's logprobs must equal prompt_logprobs' own entries, a prompt longer
than a step's logit rows (300 tokens) and the same prompt sent again (its prefix cached)
must give the same values. logit_bias +100 writes a token, -100 bans the greedy one;
min_tokens holds back an EOS made certain by a bias. Prints one line per check; exit
status 1 when any failed. Standard library only.
"""
import argparse
import json
import sys
import urllib.request

failures = 0


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def check(name, ok, detail=""):
    global failures
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + str(detail)[:400]))
    if not ok:
        failures += 1


def greedy(base, prompt):
    """The greedy token's text and logprob after prompt (ids)."""
    c = post(base, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 0,
                                       "ignore_eos": True})
    lp = c["choices"][0]["logprobs"]
    return lp["tokens"][0], lp["token_logprobs"][0]


def check_prompt(base, prompt, positions, tol, what):
    c = post(base, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0, "echo": True,
                                       "logprobs": 1, "prompt_logprobs": 20, "ignore_eos": True})
    ch = c["choices"][0]
    plp, elp = ch["prompt_logprobs"], ch["logprobs"]
    check(f"{what}: shape", len(plp) == len(prompt) and plp[0] is None and elp["token_logprobs"][0] is None,
          (len(plp), len(prompt)))
    bad = []
    for i in range(1, len(prompt)):
        mine = plp[i].get(str(prompt[i]))
        if not mine or mine["logprob"] != elp["token_logprobs"][i] or mine["rank"] < 1:
            bad.append((i, "echo", mine, elp["token_logprobs"][i]))
    check(f"{what}: echo's logprobs are prompt_logprobs' own", not bad, bad[:3])
    bad = []
    for i in positions:
        tok, lp = greedy(base, prompt[:i])
        found = [e for e in plp[i].values() if e["decoded_token"] == tok]
        if not found or abs(found[0]["logprob"] - lp) > tol:
            bad.append((i, tok, lp, found[:1]))
    check(f"{what}: greedy decoding's token and logprob at {len(positions)} positions", not bad, bad[:3])
    return plp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--eos", type=int, default=151645)
    ap.add_argument("--tol", type=float, default=0.05)
    a = ap.parse_args()
    base = a.base.rstrip("/")
    short = [9707, 1879, 374, 264, 1273, 315, 279, 1849, 13, 576, 3974, 13876]
    check_prompt(base, short, list(range(1, len(short))), a.tol, "12 tokens")
    long = [(k * 7919 + 17) % 150000 for k in range(300)]
    first = check_prompt(base, long, list(range(1, 300, 37)) + [299], a.tol, "300 tokens")
    again = post(base, "/v1/completions", {"prompt": long, "max_tokens": 1, "prompt_logprobs": 20})
    check("300 tokens again (cached prefix): the same prompt_logprobs", again["choices"][0]["prompt_logprobs"] == first)
    chat = post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                                               "prompt_logprobs": 0})
    check("chat prompt_logprobs", len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"])
    c = post(base, "/v1/completions", {"prompt": "x", "max_tokens": 3, "temperature": 0, "ignore_eos": True,
                                       "logit_bias": {"9707": 100}})
    check("logit_bias +100", c["choices"][0]["text"] == "HelloHelloHello", c["choices"][0]["text"])
    tok, _ = greedy(base, short)
    ids = post(base, "/tokenize", {"prompt": tok, "add_special_tokens": False})["tokens"]
    if len(ids) == 1:
        c = post(base, "/v1/completions", {"prompt": short, "max_tokens": 1, "temperature": 0,
                                           "logprobs": 0, "logit_bias": {str(ids[0]): -100}})
        check("logit_bias -100 bans the greedy token", c["choices"][0]["logprobs"]["tokens"][0] != tok)
    else:
        print(f"note: the greedy token {tok!r} does not tokenize alone; -100 not checked")
    eos = {str(a.eos): 100}
    c = post(base, "/v1/completions", {"prompt": "x", "max_tokens": 10, "logit_bias": eos})
    check("EOS biased ends at once", c["usage"]["completion_tokens"] == 1, c["usage"])
    c = post(base, "/v1/completions", {"prompt": "x", "max_tokens": 10, "min_tokens": 5, "logit_bias": eos})
    check("min_tokens 5 holds EOS back", c["usage"]["completion_tokens"] == 6 and
          c["choices"][0]["finish_reason"] == "stop", c["usage"])
    print(f"{failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
