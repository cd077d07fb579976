#!/usr/bin/env python3
"""Compares replay's CUDA backend with Hugging Face transformers at real model
shapes, on the GPU machine (torch + transformers + a GPU; no downloads).

For each shape, the weights are replay's own dummy weights (--dummy-weights
NAME), reproduced here bit for bit: element i of weight (kind, layer) is
bf16((u * 2 - 1) * sqrt(3) * scale (+1 for norms)) with u from replay's
counter-based hash (src/util/rng.h, src/model/weights.c). transformers runs the
same weights in float32; replay runs them in bf16 and must stay within a
relative L2 error of 1e-2 at every compared position.

    python3 tools/gpu_compare.py --replay .gpu/bin/replay [--shapes qwen3-0.6b,...] [--decode]

--decode compares the batch-1 decode path instead of prefill: replay gets the
prompt one token per step.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

# replay's presets (src/model/config.c): name -> (class, kwargs)
PRESETS = {
    "qwen3-0.6b": (Qwen3Config, dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                   num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                   tie_word_embeddings=True, max_position_embeddings=40960, rms_norm_eps=1e-6,
                   rope_theta=1e6)),
    "qwen3-4b": (Qwen3Config, dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                 num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                 tie_word_embeddings=True, max_position_embeddings=40960, rms_norm_eps=1e-6,
                 rope_theta=1e6)),
    "qwen3-8b": (Qwen3Config, dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                 num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                 tie_word_embeddings=False, max_position_embeddings=40960, rms_norm_eps=1e-6,
                 rope_theta=1e6)),
    "llama3.2-1b": (LlamaConfig, dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                    tie_word_embeddings=True, max_position_embeddings=131072, rms_norm_eps=1e-5,
                    rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=32.0,
                    low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192))),
    "llama3-8b": (LlamaConfig, dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                  tie_word_embeddings=False, max_position_embeddings=131072, rms_norm_eps=1e-5,
                  rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0,
                  low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192))),
    # Test shapes: replay runs them on its CPU backend, which checks that this
    # script reproduces the dummy weights exactly (errors ~1e-6, not 1e-2).
    "tiny-qwen3": (Qwen3Config, dict(vocab_size=1031, hidden_size=96, intermediate_size=200,
                   num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, head_dim=24,
                   tie_word_embeddings=True, max_position_embeddings=4096, rms_norm_eps=1e-6,
                   rope_theta=1e6)),
    "tiny-llama3": (LlamaConfig, dict(vocab_size=997, hidden_size=80, intermediate_size=216,
                    num_hidden_layers=2, num_attention_heads=10, num_key_value_heads=2, head_dim=8,
                    tie_word_embeddings=False, max_position_embeddings=8192, rms_norm_eps=1e-5,
                    rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0,
                    low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192))),
}

# rp_weight_kind order (src/model/arch.h)
EMBED, FINAL_NORM, LM_HEAD, ATTN_NORM, Q, K, V, O, Q_NORM, K_NORM, MLP_NORM, GATE, UP, DOWN = range(14)
M64 = (1 << 64) - 1


def s64(x):
    x &= M64
    return x - (1 << 64) if x >= (1 << 63) else x


GOLD, C1, C2 = s64(0x9E3779B97F4A7C15), s64(0xBF58476D1CE4E5B9), s64(0x94D049BB133111EB)


def mix_py(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def srl(z, k):  # logical shift right of an int64 tensor
    return (z >> k) & ((1 << (64 - k)) - 1)


def mix_t(z):  # int64 tensors wrap on overflow, like uint64 in C
    z = z + GOLD
    z = (z ^ srl(z, 30)) * C1
    z = (z ^ srl(z, 27)) * C2
    return z ^ srl(z, 31)


def dummy_tensor(shape, seed, kind, layer, dev):
    """replay's rp_model_dummy values for one weight, as bf16."""
    rows, cols = shape[0], (shape[1] if len(shape) > 1 else 1)
    n = rows * cols
    stream = kind * 100003 + layer
    base = s64(mix_py(seed ^ mix_py(stream)))
    c = torch.tensor(float(cols), dtype=torch.float32)
    if kind == EMBED:
        scale = torch.tensor(1.0, dtype=torch.float32)
    elif cols == 1:
        scale = torch.tensor(0.1, dtype=torch.float32)
    else:
        scale = torch.tensor(1.0, dtype=torch.float32) / torch.sqrt(c)
    scale = scale.to(dev)
    out = torch.empty(n, dtype=torch.bfloat16, device=dev)
    chunk = 1 << 26
    for s in range(0, n, chunk):
        cnt = torch.arange(s, min(n, s + chunk), dtype=torch.int64, device=dev)
        x = mix_t(cnt + base)
        u = srl(x, 40).to(torch.float32) * (1.0 / 16777216.0)
        u = u * 2.0 - 1.0
        v = u * 1.7320508 * scale
        if cols == 1:
            v = 1.0 + v
        out[s:s + cnt.numel()] = v.to(torch.bfloat16)
    return out.view(shape)


def build_model(name, seed, dev):
    cls, kw = PRESETS[name]
    cfg = cls(**kw)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    layer_kinds = {"input_layernorm": ATTN_NORM, "self_attn.q_proj": Q, "self_attn.k_proj": K,
                   "self_attn.v_proj": V, "self_attn.o_proj": O, "self_attn.q_norm": Q_NORM,
                   "self_attn.k_norm": K_NORM, "post_attention_layernorm": MLP_NORM,
                   "mlp.gate_proj": GATE, "mlp.up_proj": UP, "mlp.down_proj": DOWN}
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname == "model.embed_tokens.weight":
                kind, layer = EMBED, 0
            elif pname == "model.norm.weight":
                kind, layer = FINAL_NORM, 0
            elif pname == "lm_head.weight":
                kind, layer = LM_HEAD, 0
            else:
                parts = pname.split(".")
                layer = int(parts[2])
                kind = layer_kinds[".".join(parts[3:-1])]
            p.copy_(dummy_tensor(tuple(p.shape), seed, kind, layer, dev))
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def rel_l2(a, b):
    return (torch.linalg.vector_norm(a.double() - b.double()) / torch.linalg.vector_norm(b.double())).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replay", default=".gpu/bin/replay")
    ap.add_argument("--shapes", default="tiny-qwen3,tiny-llama3,qwen3-0.6b,llama3.2-1b,qwen3-4b,llama3-8b")
    ap.add_argument("--lens", default="1,7,100,1000")
    ap.add_argument("--last", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decode", action="store_true",
                    help="feed replay the prompt one token per step (--max-num-batched-tokens 1): every position is a batch-1 "
                         "decode step, the one-kernel path where the shape allows it")
    args = ap.parse_args()
    dev = "cuda"
    lens = [int(x) for x in args.lens.split(",")]
    rows = []
    tmp = tempfile.mkdtemp()
    for name in args.shapes.split(","):
        t0 = time.time()
        model = build_model(name, args.seed, dev).eval()
        vocab = model.config.vocab_size
        g = torch.Generator().manual_seed(1234)
        prompts = [torch.randint(0, vocab, (L,), generator=g) for L in lens]
        # transformers' own bf16 error, the yardstick for "bf16 tolerance"
        hf_bf16 = []
        with torch.no_grad():
            for ids in prompts:
                hf_bf16.append(model(ids[None].to(dev)).logits[0, -min(args.last, len(ids)):].float().cpu())
        model = model.float()
        for ids, hb in zip(prompts, hf_bf16):
            L = len(ids)
            with torch.no_grad():
                ref = model(ids[None].to(dev)).logits[0, -min(args.last, L):].float().cpu()
            idfile = os.path.join(tmp, "ids.txt")
            with open(idfile, "w") as f:
                f.write(",".join(map(str, ids.tolist())))
            out = os.path.join(tmp, "out.bin")
            device = "cpu" if name.startswith("tiny") else "cuda"
            cmd = [args.replay, "logits", "--dummy-weights", name, "--weight-seed", str(args.seed),
                   "--device", device, "--prompt-ids", "@" + idfile, "--last", str(args.last), "--out", out]
            if args.decode:
                cmd += ["--max-num-batched-tokens", "1"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            hf_err = max(rel_l2(hb[i], ref[i]) for i in range(ref.shape[0]))
            if r.returncode != 0:
                rows.append((name, L, float("nan"), hf_err, float("nan"), "replay failed: " + r.stderr.strip()[-300:]))
                continue
            got = torch.frombuffer(bytearray(open(out, "rb").read()), dtype=torch.float32).view(-1, vocab)
            errs = [rel_l2(got[i], ref[i]) for i in range(ref.shape[0])]
            same_top = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
            # bf16 tolerance: the issue's 1e-2 (transformers' own bf16 run is
            # printed beside it, ~2e-2); the tiny shapes run on replay's fp32
            # CPU backend and must match to 1e-4
            tol = 1e-4 if name.startswith("tiny") else 1e-2
            res = "ok" if max(errs) < tol else "FAIL"
            rows.append((name, L, max(errs), hf_err, same_top, res))
        del model
        torch.cuda.empty_cache()
        print(f"{name}: {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
    print("\nreplay (CUDA, bf16) vs transformers (fp32), same dummy weights; relative L2 of logits, "
          f"worst of the last {args.last} positions; 'HF bf16' is transformers' own bf16 run against its fp32 run")
    print(f"{'shape':<13} {'prompt':>6} {'replay':>10} {'HF bf16':>10} {'argmax agree':>13}  result")
    bad = 0
    for name, L, e, hf, top, res in rows:
        print(f"{name:<13} {L:>6} {e:>10.2e} {hf:>10.2e} {top:>13.2f}  {res}")
        bad += not res.startswith("ok")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
