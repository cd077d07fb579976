#!/usr/bin/env python3
"""Reference data for replay's tokenizer, made with Hugging Face's own code.

Writes, from the real Qwen3 and Llama 3 tokenizer files (scripts/fetch-tokenizers.sh):
  parity.json   a deterministic corpus of >= 2,000 strings with the ids that
                `tokenizers` gives (encode(text, add_special_tokens=False)) and
                the text that decode(ids) gives, with and without special tokens
  chat.json     conversations rendered by transformers' apply_chat_template
  bench.txt     (--bench) a deterministic ~10 MB text, and timings of HF loading
                tokenizer.json and encoding that text, in bench_hf.json

Invalid UTF-8: HF takes a Python str, so raw bytes reach it only after a
decode. The corpus holds byte strings that are not UTF-8; their reference is
HF's result on bytes.decode("utf-8", errors="replace") (one U+FFFD per maximal
ill-formed subsequence), which is what replay's encode does by default with
the same bytes. Such cases carry "bytes_hex" next to "text".

Run where `tokenizers` and `transformers` are installed (no network needed):
  python3 tools/make_tokenizer_fixtures.py --tokenizers .cache/tokenizers \
      --out tests/fixtures/tokenizer [--bench OUTDIR]
"""
import argparse
import json
import os
import random
import sys
import time
import unicodedata

SEED = 20241122

# ---- corpus -----------------------------------------------------------------

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "Call me Ishmael. Some years ago—never mind how long precisely—having little or no money in my purse, "
    "and nothing particular to interest me on shore, I thought I would sail about a little.",
    "In the beginning the Universe was created. This has made a lot of people very angry and been widely "
    "regarded as a bad move.",
    "We hold these truths to be self-evident, that all men are created equal.",
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer "
    "The slings and arrows of outrageous fortune...",
    "Mr. and Mrs. Dursley, of number four, Privet Drive, were proud to say that they were perfectly normal, "
    "thank you very much.",
    "A transformer layer applies self-attention followed by a feed-forward network; residual connections "
    "and normalization keep the activations well-behaved.",
    "The U.S.A. isn't the U.K., and e.g. \"quotes\" (parentheses) [brackets] {braces} <angles> differ.",
    "Prices rose 3.5% in Q3 2023, from $1,234.56 to $1,277.77 — a 0.043 increase per unit.",
]

WORDS = ("the of and to in is was that for it with as his on be at by had are but from or have an they which one "
         "you were her all she there would their we him been has when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now such like "
         "our over man me even most made after also did many before must through back years where much your way "
         "well down should because each just those people Mr how too little state good very make world still own "
         "see men work long get here between both life being under never day same another know while last might "
         "us great old year off come since against go came right used take three tokenizer inference engine "
         "kernel latency throughput batch cache attention decode prefill").split()

CONTRACTIONS = ["I'm", "you're", "he's", "she'd", "we've", "they'll", "it's", "don't", "can't", "won't",
                "I'M", "YOU'RE", "DON'T", "It'S", "WE'VE", "THEY'LL", "y'all", "o'clock", "rock'n'roll",
                "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D",
                "Il'ſ", "it'ſ", "it\u2019s", "don\u2019t", "'ſ", "'K", "'\u212a"]

CODE = [
    '#include <stdio.h>\n\nint main(int argc, char **argv) {\n    printf("hello, %s\\n", argv[0]);\n    return 0;\n}\n',
    'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n',
    'const add = (a, b) => a + b;\nexport default function App() {\n  return <div className="app">{add(1, 2)}</div>;\n}\n',
    'fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}\n',
    'package main\n\nimport "fmt"\n\nfunc main() {\n\tch := make(chan int, 3)\n\tch <- 42\n\tfmt.Println(<-ch)\n}\n',
    'SELECT u.id, COUNT(*) AS n\nFROM users u JOIN orders o ON o.user_id = u.id\nWHERE o.created_at >= \'2024-01-01\'\nGROUP BY u.id HAVING n > 3;\n',
    '<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>T</title></head>\n<body><p class=\'x\'>Hi &amp; bye</p></body>\n</html>\n',
    '{"model": "qwen3", "layers": 28, "rope_theta": 1000000.0, "eos": [151645, 151643], "ok": true, "n": null}',
    '#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l "$f" | awk \'{print $1}\'\ndone 2>&1 | sort -n\n',
    'public class Main {\n    public static void main(String[] args) {\n        System.out.println("Hi");\n    }\n}\n',
    'template <typename T>\nstd::vector<T> twice(const std::vector<T>& v) {\n  std::vector<T> r; r.reserve(v.size()*2);\n  for (auto& x : v) { r.push_back(x); r.push_back(x); }\n  return r;\n}\n',
    '\\begin{equation}\n  E = mc^2 \\quad \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}\n',
    'x = [i**2 for i in range(10) if i % 2 == 0]  # squares\r\ny = {k: v for k, v in zip("abc", x)}\r\n',
    '    \tmixed\t  indentation\n\t\t    here\n        \n',
    'diff --git a/f.c b/f.c\n@@ -1,3 +1,3 @@\n-int x = 1;\n+int x = 2;\n',
    'a := ^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}$ ; s/\\s+$//g; echo $((1<<10))',
]

SCRIPTS = {
    "zh": "我们今天学习自然语言处理。机器学习模型需要大量的数据，训练过程可能需要很多天。你好，世界！",
    "ja": "日本語のテキストです。ひらがな、カタカナ、漢字が混ざっています。東京は大きな都市です。ｶﾀｶﾅ",
    "ko": "안녕하세요. 한국어 문장입니다. 토크나이저가 잘 작동하는지 확인합니다.",
    "ar": "مرحبا بالعالم. هذه جملة باللغة العربية مع أرقام ١٢٣٤٥ وعلامات ترقيم؟",
    "he": "שלום עולם. זהו משפט בעברית עם ניקוד: בְּרֵאשִׁית בָּרָא.",
    "hi": "नमस्ते दुनिया। यह हिंदी में एक वाक्य है, जिसमें संख्याएँ १२३ भी हैं।",
    "ru": "Привет, мир! Это предложение на русском языке. Ёжик в тумане, ёлка и йод.",
    "uk": "Привіт, світе! Ґанок, їжак, єнот — українські літери.",
    "el": "Γειά σου Κόσμε! Αυτή είναι μια ελληνική πρόταση με τόνους: άέήίόύώ ΐΰ.",
    "th": "สวัสดีชาวโลก นี่คือประโยคภาษาไทย ที่ไม่มีช่องว่างระหว่างคำ",
    "vi": "Xin chào thế giới. Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ ấ ầ ẩ ẫ ậ đ.",
    "tr": "Merhaba dünya! İstanbul'da ılık bir gün. Şişli, Çağlayan, Ğ ğ.",
    "de": "Grüß Gott! Die Straße ist schön, Äpfel und Öl, Übermaß. ẞ",
    "fr": "Bonjour le monde ! L'été, où est-ce qu'on va ? « Ça va » — c'est ça.",
    "es": "¡Hola, mundo! ¿Qué tal? El niño comió piña y jalapeños.",
    "pl": "Zażółć gęślą jaźń. Łódź i Kraków.",
    "hy": "Բարեւ աշխարհ։ Սա հայերեն նախադասություն է։",
    "ka": "გამარჯობა მსოფლიო. ეს ქართული წინადადებაა.",
    "ta": "வணக்கம் உலகம். இது தமிழ் வாக்கியம்.",
    "bn": "ওহে বিশ্ব। এটি একটি বাংলা বাক্য।",
    "am": "ሰላም ልዑል። ይህ የአማርኛ ዓረፍተ ነገር ነው።",
    "my": "မင်္ဂလာပါ ကမ္ဘာ။",
    "km": "សួស្តី​ពិភពលោក។",
    "mn": "Сайн байна уу ᠮᠣᠩᠭᠣᠯ\u180e ᠪᠢᠴᠢᠭ",
    "yi": "װאָס מאַכסטו?",
    "math": "∀x∈ℝ: x²≥0, ∑ᵢ aᵢ = ∫ f(x) dx ≈ π·r², ½ ⅓ ¼ ⅕ Ⅻ ⅻ ① ② ③ ⁴ ₅",
    "fullwidth": "ＡＢＣ１２３！？　全角スペース",
}

EMOJI = ["😀", "😂🤣", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🇺🇸🇯🇵🇩🇪", "❤️", "🏳️‍🌈", "1️⃣", "🫠", "🧑🏿‍🚀",
         "☕️", "🐍 + 🦀 = ❤", "🤖🤖🤖", "⭐", "🔥🔥", "✅ done", "⚠️ warning"]

# decomposed text whose NFC differs (Qwen3 normalises, Llama 3 does not)
NFC_CASES = ["e\u0301", "Cafe\u0301", "A\u030a", "n\u0303", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af",
             "o\u0308\u0301", "a\u0328\u0301", "\u0041\u0301\u0323", "\u212b", "\u2126", "\u0958", "\u0344",
             "\u1e9b\u0323", "\u0627\u0653", "\u30ab\u3099", "\u304b\u3099\u3099", "s\u0323\u0307", "\u00c5\u0301"]

WS = [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", "\r\r\n", " \n ", "\u00a0", "\u3000", "\u2028",
      "\u2029", "\u0085", "\u180e", "\u200b", "\u2003", "\u202f", "\u205f", "\x0b", "\x0c", "\x1c", "\x1f",
      "\ufeff", "\u1680"]

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
           "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|reserved_special_token_5|>", "<|fim_prefix|>", "<|vision_start|>", "<|im_start", "im_end|>",
           "<|endoftext|", "<|", "|>", "<<|im_end|>>", "<|im_end|><|im_end|>"]

INVALID = [b"\xff", b"\xfe\xff", b"\x80", b"abc\x80def", b"\xc0\x80", b"\xc3", b"\xc3(", b"\xe2\x82",
           b"\xe2\x82(", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf0\x9f\x98", b"\xf0\x9f\x98 x", b"\xf4\x90\x80\x80",
           b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"caf\xe9",
           b"\x9f\x98\x80", b"\xc2\xc2\xa9", b"hello \xe4\xbd world", b"<|im_end|>\xff<|im_end|>",
           b"\xef\xbb\xbfBOM", b"\xe6\x97\xa5\xe6\x9c", b"\xa0\xa1", b"\xf1\x80", b"\xe1\x80\xe1\x80\x80"]

# code point ranges assigned long before every Unicode version in play
# (Onig 6.9.8 / PCRE2 10.42: Unicode 14; utf8proc 2.8: 15)
SAFE_RANGES = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x5d0, 0x5ea), (0x620, 0x64a),
               (0x660, 0x669), (0x900, 0x97f), (0xe01, 0xe3a), (0x1100, 0x11ff), (0x1e00, 0x1eff), (0x2000, 0x206f),
               (0x2070, 0x209c), (0x20a0, 0x20bf), (0x2100, 0x218b), (0x2190, 0x23ff), (0x2460, 0x24ff),
               (0x2500, 0x27bf), (0x3000, 0x303f), (0x3041, 0x3096), (0x30a0, 0x30ff), (0x4e00, 0x9fa5),
               (0xac00, 0xd7a3), (0xff01, 0xffee), (0x1f300, 0x1f5ff), (0x1f600, 0x1f64f), (0x1d400, 0x1d4ff),
               (0x300, 0x36f), (0x10000, 0x1000b)]


def rand_cp(rng):
    a, b = rng.choice(SAFE_RANGES)
    while True:
        c = rng.randint(a, b)
        ch = chr(c)
        if unicodedata.category(ch) != "Cn":
            return ch


def rand_sentence(rng, n):
    w = [rng.choice(WORDS) for _ in range(n)]
    w[0] = w[0].capitalize()
    return " ".join(w) + rng.choice([".", "!", "?", "...", ";", ":", ""])


def build_corpus():
    rng = random.Random(SEED)
    cases = []  # (str or bytes)

    def add(x):
        cases.append(x)

    # edge cases
    for x in ["", " ", "a", "\n", "  ", "\t\t", "0", "'", "''", "\x00", "a\x00b", "\x7f", "\u0300", "\ufffd"]:
        add(x)
    # every byte-sized code point and every printable ASCII pair
    add("".join(chr(i) for i in range(1, 256)))
    for i in range(0, 256, 8):
        add("".join(chr(j) for j in range(i, i + 8)))
    # prose
    for p in PROSE:
        add(p)
        add(p.upper())
        add(p.lower())
        add(" " + p)
        add(p + "\n")
    for _ in range(300):
        add(" ".join(rand_sentence(rng, rng.randint(3, 25)) for _ in range(rng.randint(1, 4))))
    # contractions
    for c in CONTRACTIONS:
        add(c)
        add("word" + c)
        add(" " + c + " ")
        add("x" + c + "x")
    for _ in range(120):
        add(" ".join(rng.choice(CONTRACTIONS + WORDS) for _ in range(rng.randint(2, 12))))
    # code
    for c in CODE:
        add(c)
        add(c.replace("\n", "\r\n"))
        add(c.replace("    ", "\t"))
    for _ in range(150):
        c = rng.choice(CODE)
        a = rng.randrange(len(c))
        add(c[a:a + rng.randint(1, 120)])
    # scripts
    for k, s in SCRIPTS.items():
        add(s)
        add(s + " " + s)
        for _ in range(6):
            a = rng.randrange(len(s))
            add(s[a:a + rng.randint(1, 40)])
    for _ in range(150):
        parts = [rng.choice(list(SCRIPTS.values()))[:rng.randint(1, 30)] for _ in range(rng.randint(2, 5))]
        add(rng.choice(["", " ", "\n", ", "]).join(parts))
    # emoji
    for e in EMOJI:
        add(e)
        add("hi " + e + " there")
        add(e * 3)
    for _ in range(100):
        add("".join(rng.choice(EMOJI + WORDS + [" ", "!", "\n"]) for _ in range(rng.randint(2, 10))))
    # NFC
    for c in NFC_CASES:
        add(c)
        add("x" + c + " " + c.upper() + "!")
    # numbers
    for s in ["1", "12", "123", "1234", "12345", "123456", "1234567", "3.14159", "-42", "1e10", "0x1F",
              "1,000,000", "2024-11-22", "10:30:59", "+1 (555) 123-4567", "١٢٣٤", "１２３４", "٣.١٤", "४२",
              "²³", "½", "Ⅻ", "①②", "0.000001", "9" * 40, "v1.2.3-rc.4"]:
        add(s)
        add("abc" + s + "def")
        add(" " + s + " ")
    for _ in range(150):
        add(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 12))) for _ in range(rng.randint(1, 6))))
    for _ in range(60):
        add("".join(rng.choice("0123456789.,-+ eE") for _ in range(rng.randint(1, 30))))
    # whitespace
    for w in WS:
        add(w)
        add("a" + w + "b")
        add(w * 5)
        add("x" + w * 3 + "y")
        add(w + "lead")
        add("trail" + w)
    for _ in range(200):
        add("".join(rng.choice(WS + ["a", "bc", "1", ".", "Z"]) for _ in range(rng.randint(2, 20))))
    # line endings
    for _ in range(60):
        lines = [rand_sentence(rng, rng.randint(1, 8)) for _ in range(rng.randint(2, 6))]
        add("".join(l + rng.choice(["\n", "\r\n", "\r", "\n\n", "\r\n\r\n", " \n", "\t\r\n"]) for l in lines))
    # special tokens in text
    for s in SPECIAL:
        add(s)
        add("a" + s + "b")
        add(" " + s + " ")
        add("\n" + s + "\n")
        add(s + s)
    for _ in range(150):
        add("".join(rng.choice(SPECIAL + WORDS + [" ", "\n", "x"]) for _ in range(rng.randint(2, 12))))
    add("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
    add("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>")
    # random code points
    for _ in range(300):
        add("".join(rand_cp(rng) for _ in range(rng.randint(1, 24))))
    # invalid UTF-8
    for b in INVALID:
        add(b)
        add(b"x " + b + b" y")
    for _ in range(100):
        bs = bytearray(rng.choice(PROSE + list(SCRIPTS.values())).encode()[: rng.randint(1, 60)])
        for _ in range(rng.randint(1, 3)):
            bs.insert(rng.randrange(len(bs) + 1), rng.randint(0x80, 0xff))
        add(bytes(bs))
    # long inputs: one long word, one long whitespace run, long CJK, long mixed
    add("a" * 3000)
    add("ab" * 1500)
    add(" " * 2000 + "x")
    add("\n" * 500)
    add(SCRIPTS["zh"] * 40)
    add(SCRIPTS["th"] * 30)
    add("".join(rand_cp(rng) for _ in range(2000)))
    add(" ".join(rand_sentence(rng, 20) for _ in range(60)))
    return cases


def bench_text(target_bytes=10_000_000):
    """A deterministic ~10 MB mixed text: prose, code, scripts, numbers."""
    rng = random.Random(SEED + 1)
    parts, n = [], 0
    scripts = list(SCRIPTS.values())
    while n < target_bytes:
        r = rng.random()
        if r < 0.6:
            s = " ".join(rand_sentence(rng, rng.randint(5, 30)) for _ in range(rng.randint(1, 5))) + "\n"
        elif r < 0.8:
            s = rng.choice(CODE)
        elif r < 0.95:
            s = rng.choice(scripts) + "\n"
        else:
            s = " ".join(str(rng.randint(0, 10 ** 9)) for _ in range(8)) + "\n"
        parts.append(s)
        n += len(s.encode())
    return "".join(parts)


# ---- chat cases -------------------------------------------------------------

def chat_cases():
    sys_m = {"role": "system", "content": "You are a helpful assistant."}
    u1 = {"role": "user", "content": "What is 2+2?"}
    a1 = {"role": "assistant", "content": "4"}
    u2 = {"role": "user", "content": "And 3+3? Answer briefly."}
    a_think = {"role": "assistant", "content": "<think>\nSimple arithmetic.\n</think>\n\n6"}
    a_think2 = {"role": "assistant", "content": "<think>Let me think.</think>The answer is 6."}
    u_ws = {"role": "user", "content": "  \n\tpadded with whitespace \u3000\n "}
    u_uni = {"role": "user", "content": "你好！¿Qué tal? 👋 <|im_end|> in text"}
    tool = {"role": "tool", "content": "{\"temp\": 21}"}
    tool2 = {"role": "tool", "content": "{\"humidity\": 40}"}
    u_tr = {"role": "user", "content": "<tool_response>\nok\n</tool_response>"}
    convs = [
        [u1],
        [sys_m, u1],
        [sys_m, u1, a1],
        [sys_m, u1, a1, u2],
        [u1, a1, u2, a_think],
        [u1, a_think2],
        [sys_m, u1, a_think, u2, a_think2],
        [u1, a_think, u2],
        [u_ws],
        [sys_m, u_ws, {"role": "assistant", "content": "\n\n  reply  \n"}],
        [u_uni],
        [sys_m, u1, a1, tool, tool2, u2],
        [u1, {"role": "assistant", "content": "calling"}, tool, {"role": "assistant", "content": "done"}],
        [u1, a_think, u_tr, {"role": "assistant", "content": "<think>\nafter tool\n</think>\nfinal"}],
        [sys_m, {"role": "system", "content": "Second system."}, u1],
        [{"role": "user", "content": ""}],
        [u1, {"role": "assistant", "content": ""}],
        [u1, {"role": "assistant", "content": "<think>\n\n</think>\n\nEmpty thoughts."}, u2],
        [{"role": "user", "content": "multi\nline\r\ncontent\n\n"}, a1],
    ]
    return convs


# ---- main ---------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", default=".cache/tokenizers")
    ap.add_argument("--out", default="tests/fixtures/tokenizer")
    ap.add_argument("--bench", help="also write bench.txt and HF timings (bench_hf.json) here")
    ap.add_argument("--count", action="store_true", help="only print the corpus size")
    args = ap.parse_args()

    corpus = build_corpus()
    if args.count:
        print(len(corpus), sum(len(c if isinstance(c, bytes) else c.encode()) for c in corpus))
        return

    import tokenizers
    from tokenizers import Tokenizer

    names = ["qwen3", "llama3"]
    toks = {n: Tokenizer.from_file(os.path.join(args.tokenizers, n, "tokenizer.json")) for n in names}
    out_cases = []
    for c in corpus:
        if isinstance(c, bytes):
            text = c.decode("utf-8", errors="replace")
            case = {"text": text, "bytes_hex": c.hex()}
        else:
            text = c
            case = {"text": text}
        for n in names:
            ids = toks[n].encode(text, add_special_tokens=False).ids
            case[n] = ids
            dec = toks[n].decode(ids, skip_special_tokens=False)
            if dec != text:
                case[n + "_decoded"] = dec
            dec_skip = toks[n].decode(ids, skip_special_tokens=True)
            if dec_skip != dec:
                case[n + "_decoded_skip"] = dec_skip
        out_cases.append(case)

    # transformers' tokenizer should agree with the tokenizers package; record it
    agree = {}
    try:
        import transformers
        from transformers import AutoTokenizer
        tversion = transformers.__version__
        auto = {n: AutoTokenizer.from_pretrained(os.path.join(args.tokenizers, n)) for n in names}
        for n in names:
            agree[n] = sum(1 for c in out_cases
                           if auto[n](c["text"], add_special_tokens=False)["input_ids"] == c[n])
    except Exception as e:  # noqa: BLE001 - record, keep going
        tversion = "unavailable: %r" % (e,)
        auto = None

    os.makedirs(args.out, exist_ok=True)
    meta = {"generator": "tools/make_tokenizer_fixtures.py", "seed": SEED,
            "tokenizers_version": tokenizers.__version__, "transformers_version": tversion,
            "transformers_agreement": agree, "count": len(out_cases)}
    with open(os.path.join(args.out, "parity.json"), "w", encoding="utf-8") as f:
        f.write('{"meta": %s,\n"cases": [\n' % json.dumps(meta))
        f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in out_cases))
        f.write("\n]}\n")

    # chat templates
    chat = {"meta": meta, "cases": []}
    if auto is not None:
        for n in names:
            for conv in chat_cases():
                for agp in (False, True):
                    thinking = [None, True, False] if n == "qwen3" else [None]
                    for et in thinking:
                        kw = {} if et is None else {"enable_thinking": et}
                        try:
                            text = auto[n].apply_chat_template(conv, tokenize=False, add_generation_prompt=agp, **kw)
                        except Exception as e:  # noqa: BLE001
                            text = None
                            print("chat template error", n, e, file=sys.stderr)
                        chat["cases"].append({"tokenizer": n, "messages": conv, "add_generation_prompt": agp,
                                              "enable_thinking": et, "text": text})
    with open(os.path.join(args.out, "chat.json"), "w", encoding="utf-8") as f:
        json.dump(chat, f, ensure_ascii=False, indent=0)

    print("cases", len(out_cases), "chat", len(chat["cases"]), "agree", agree, "tokenizers", tokenizers.__version__,
          "transformers", tversion)

    if args.bench:
        os.makedirs(args.bench, exist_ok=True)
        text = bench_text()
        with open(os.path.join(args.bench, "bench.txt"), "w", encoding="utf-8") as f:
            f.write(text)
        res = {"bytes": len(text.encode()), "tokenizers_version": tokenizers.__version__}
        for n in names:
            path = os.path.join(args.tokenizers, n, "tokenizer.json")
            loads = []
            for _ in range(5):
                t0 = time.perf_counter()
                Tokenizer.from_file(path)
                loads.append(time.perf_counter() - t0)
            encs = []
            for _ in range(3):
                t = Tokenizer.from_file(path)  # fresh: no warm BPE cache
                t0 = time.perf_counter()
                ids = t.encode(text, add_special_tokens=False).ids
                encs.append(time.perf_counter() - t0)
            with open(os.path.join(args.bench, "ids_%s.bin" % n), "wb") as f:
                import array
                f.write(array.array("i", ids).tobytes())
            res[n] = {"load_s": sorted(loads), "encode_s": sorted(encs), "tokens": len(ids)}
            print(n, "load median %.3f s" % sorted(loads)[2], "encode median %.3f s" % sorted(encs)[1],
                  "tokens", len(ids), flush=True)
        with open(os.path.join(args.bench, "bench_hf.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
