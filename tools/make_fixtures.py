#!/usr/bin/env python3
"""Writes the tiny random-weight model fixtures the CPU backend is tested on.

Run where torch and transformers are installed (the GPU machine has them; no
GPU is needed):  python3 tools/make_fixtures.py OUT_DIR [NAME ...]
(NAMEs: only those models; each model's seeds depend on its place in MODELS
only, so regenerating some leaves the others as they were.)

For each model it writes a Hugging Face directory (config.json,
generation_config.json, bf16 safetensors; one of them sharded with an index)
and reference.json + logits.bin: transformers' logits at every prompt
position (computed in float64 from the same bf16-rounded weights) and the
greedy continuation of 32 tokens (EOS ignored). The shapes are small and
deliberately odd (head_dim != hidden/heads, GQA ratios 1, 2, 5, 6, tied and
untied heads, llama3 RoPE scaling with a short original context so the
scaled band matters) to catch indexing bugs. The other families: Qwen2 (its
q/k/v biases, set nonzero here: transformers initialises them to zero),
Mistral (sliding_window null, an explicit head_dim), yarn RoPE (Qwen3's
long-context setting, over a 64-token original context so that it matters)
and linear RoPE. reference.json also records the rotary embedding's
inv_freq and attention scaling as transformers computed them, which
tests/test_cpu_forward.c checks replay's RoPE tables against.
"""
import json
import os
import sys

import torch
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, AutoModelForCausalLM

MODELS = [
    ("qwen3-tied", Qwen3Config, dict(
        vocab_size=503, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
        rope_theta=1000000.0, max_position_embeddings=2048, rms_norm_eps=1e-6,
        bos_token_id=1, eos_token_id=2), dict(eos_token_id=[2, 5]), None),
    ("qwen3-gqa6", Qwen3Config, dict(
        vocab_size=611, hidden_size=96, intermediate_size=200, num_hidden_layers=3,
        num_attention_heads=6, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False,
        rope_theta=10000.0, max_position_embeddings=1024, rms_norm_eps=1e-6,
        bos_token_id=1, eos_token_id=2), dict(eos_token_id=2), "150KB"),
    ("llama3-scaled", LlamaConfig, dict(
        vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=False,
        rope_theta=500000.0, max_position_embeddings=4096, rms_norm_eps=1e-5,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=64),
        bos_token_id=1, eos_token_id=[2, 3]), dict(eos_token_id=[2, 3, 4]), None),
    ("llama3-tied", LlamaConfig, dict(
        vocab_size=457, hidden_size=80, intermediate_size=216, num_hidden_layers=4,
        num_attention_heads=10, num_key_value_heads=2, tie_word_embeddings=True,
        rope_theta=500000.0, max_position_embeddings=4096, rms_norm_eps=1e-5,
        bos_token_id=1, eos_token_id=2), None, None),
    # head_dim 128 and 64: the sizes the CUDA kernels take, so the GPU backend
    # can be checked on committed fixtures too.
    ("qwen3-hd128", Qwen3Config, dict(
        vocab_size=300, hidden_size=128, intermediate_size=136, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=128, tie_word_embeddings=True,
        rope_theta=1000000.0, max_position_embeddings=2048, rms_norm_eps=1e-6,
        bos_token_id=1, eos_token_id=2), dict(eos_token_id=2), None),
    ("llama3-hd64", LlamaConfig, dict(
        vocab_size=256, hidden_size=128, intermediate_size=136, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False,
        rope_theta=500000.0, max_position_embeddings=4096, rms_norm_eps=1e-5,
        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=128),
        bos_token_id=1, eos_token_id=2), None, None),
    # ---- the other families (issue 39). Appended: the models above keep
    # their seeds (1000 + index, 77 + index).
    # Qwen2: biases on q, k, v (not o); head_dim is hidden / heads (16);
    # sliding_window off (use_sliding_window false).
    ("qwen2-bias", Qwen2Config, dict(
        vocab_size=419, hidden_size=96, intermediate_size=200, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False,
        rope_theta=1000000.0, max_position_embeddings=2048, rms_norm_eps=1e-6,
        use_sliding_window=False, bos_token_id=1, eos_token_id=2), dict(eos_token_id=[2, 3]), None),
    # Qwen2 at a CUDA head size (128) with yarn, Qwen2.5's long-context recipe,
    # for the GPU tests. max_position_embeddings = factor x original: some
    # transformers versions take the factor as that ratio when the original
    # context is given, others take "factor"; here both are 4.
    ("qwen2-hd128", Qwen2Config, dict(
        vocab_size=320, hidden_size=256, intermediate_size=136, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
        rope_theta=1000000.0, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64),
        use_sliding_window=False, bos_token_id=1, eos_token_id=2), None, None),
    # Mistral: no biases, sliding_window null (MistralConfig's default is
    # 4096: set it), head_dim 24 != hidden / heads (as Mistral Nemo's 128 !=
    # 5120 / 32).
    ("mistral-hd24", MistralConfig, dict(
        vocab_size=389, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, tie_word_embeddings=False,
        rope_theta=1000000.0, max_position_embeddings=2048, rms_norm_eps=1e-5, sliding_window=None,
        bos_token_id=1, eos_token_id=2), dict(eos_token_id=2), None),
    # Qwen3 with yarn as its model card writes it for 128k contexts (factor 4),
    # the original context shortened to 64 so the prompts reach into it.
    ("qwen3-yarn", Qwen3Config, dict(
        vocab_size=401, hidden_size=64, intermediate_size=144, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
        rope_theta=10000.0, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64),
        bos_token_id=1, eos_token_id=2), dict(eos_token_id=2), None),
    # Llama with linear RoPE scaling (positions divided by 4).
    ("llama3-linear", LlamaConfig, dict(
        vocab_size=353, hidden_size=96, intermediate_size=224, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=3, tie_word_embeddings=False,
        rope_theta=10000.0, max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_scaling=dict(rope_type="linear", factor=4.0),
        bos_token_id=1, eos_token_id=2), None, None),
]

PROMPT_LENS = [1, 7, 23, 50]
GREEDY_TOKENS = 32


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):  # Qwen2's q/k/v: large enough that a missing one shows
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:  # norms: near 1, but not 1, so a missing weight shows
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:  # keep activations O(1) through the stack
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)


def greedy(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):]


def main(out_root, only=None):
    torch.manual_seed(0)
    for idx, (name, cls, kw, gen_kw, shard) in enumerate(MODELS):
        if only and name not in only:
            continue
        cfg = cls(**kw, torch_dtype="bfloat16")
        cfg._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32, attn_implementation="eager")
        init_weights(model, 1000 + idx)
        model = model.to(torch.bfloat16)  # the weights as stored
        out = os.path.join(out_root, name)
        os.makedirs(out, exist_ok=True)
        save_kw = dict(safe_serialization=True)
        if shard:
            save_kw["max_shard_size"] = shard
        model.save_pretrained(out, **save_kw)
        if gen_kw is None and os.path.exists(os.path.join(out, "generation_config.json")):
            os.remove(os.path.join(out, "generation_config.json"))
        elif gen_kw is not None:
            with open(os.path.join(out, "generation_config.json"), "w") as f:
                json.dump(dict(bos_token_id=1, **gen_kw), f, indent=2)
        # Reference: reload from disk (what replay reads), compute in float64.
        ref = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float64, attn_implementation="eager")
        ref.eval()
        g = torch.Generator().manual_seed(77 + idx)
        prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENS]
        logits_all = []
        greedy_all = []
        for p in prompts:
            with torch.no_grad():
                lg = ref(torch.tensor([p])).logits[0]
            logits_all.append(lg.to(torch.float32))
            greedy_all.append(greedy(ref, p, GREEDY_TOKENS))
        # The RoPE table transformers built (after its scaling), for replay's to be checked against.
        rope = {}
        rot = getattr(ref.model, "rotary_emb", None)
        if rot is not None and hasattr(rot, "inv_freq"):
            rope = dict(rope_inv_freq=[float(x) for x in rot.inv_freq.float().tolist()],
                        rope_attention_scaling=float(getattr(rot, "attention_scaling", 1.0)))
        if cls is Qwen2Config:
            assert any(n.endswith("q_proj.bias") for n, _ in ref.named_parameters()), "Qwen2 without biases?"
            assert not any(n.endswith("o_proj.bias") for n, _ in ref.named_parameters())
        blob = torch.cat(logits_all).contiguous().numpy().astype("<f4").tobytes()
        with open(os.path.join(out, "logits.bin"), "wb") as f:
            f.write(blob)
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(dict(vocab_size=cfg.vocab_size, prompts=prompts, greedy=greedy_all,
                           logits_file="logits.bin", logits_dtype="float32 little-endian",
                           logits_layout="prompt-major, then position, then vocab",
                           made_by="tools/make_fixtures.py",
                           transformers=__import__("transformers").__version__,
                           torch=torch.__version__, **rope), f)
        print(name, "params", sum(p.numel() for p in model.parameters()), "files", sorted(os.listdir(out)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/models", sys.argv[2:] or None)
