#!/usr/bin/env node
// Reference data for replay's SentencePiece-style BPE tokenizer (Llama 2,
// Mistral 7B), made with transformers.js's tokenizer library
// (@huggingface/tokenizers, the code transformers.js runs), an implementation
// of Hugging Face `tokenizers` independent of replay's. No Python `tokenizers`
// is reachable from the development machines (npm is, PyPI is not).
//
// Writes:
//   tests/fixtures/tokenizer/mistral_tiny/tokenizer.json, tokenizer_config.json
//       (--tiny) a Mistral-v0.3-style tokenizer of 700 tokens, cut from Llama 2's
//       vocab and merges: control tokens [INST] [/INST] [TOOL_CALLS] ... as
//       special added tokens, <0x00>..<0xFF>, Metaspace pre-tokenizer with
//       prepend_scheme "first", byte_fallback, fuse_unk
//   tests/fixtures/tokenizer/sp_parity.json
//       for each corpus text and each tokenizer (llama2, mistral_tiny): the ids of
//       encode(text, add_special_tokens=false) and decode(ids) with and without
//       skip_special_tokens
//
// Cases where transformers.js reads tokenizer.json differently from the Rust
// `tokenizers` (docs/tokenizer.md lists them) are not in this corpus; the C
// tests check those by hand against the Rust source.
//
// Run (the tokenizer files from scripts/fetch-tokenizers.sh):
//   npm install --prefix .cache/npm @huggingface/tokenizers@0.2.0
//   node tools/make_sp_tokenizer_fixtures.mjs [--tiny]
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const require = createRequire(path.join(root, ".cache/npm/package.json"));
const lib = await import(require.resolve("@huggingface/tokenizers"));
const Tokenizer = lib.Tokenizer ?? lib.default.Tokenizer;
const REFERENCE = "@huggingface/tokenizers " +
  JSON.parse(fs.readFileSync(path.join(root, ".cache/npm/node_modules/@huggingface/tokenizers/package.json"), "utf8")).version;

const fixdir = path.join(root, "tests/fixtures/tokenizer");
const readJson = (p) => JSON.parse(fs.readFileSync(p, "utf8"));

// ---- the tiny Mistral-v0.3-style tokenizer ---------------------------------
// Layout as Mistral-7B-v0.3's tokenizer.json: <unk> <s> </s>, then the control
// tokens ([INST] = 3, [/INST] = 4, ...; the real file has [control_N] up to
// id 770), then the 256 byte tokens, then the pieces; every control token is
// also an added token with special true. Pipeline as transformers'
// LlamaConverter writes it for a non-legacy SentencePiece model
// (convert_slow_tokenizer.py): normalizer null, pre_tokenizer Metaspace
// {replacement "▁", prepend_scheme "first", split false}, decoder Replace
// "▁" -> " ", ByteFallback, Fuse, Strip(" ", 1, 0).
function makeTiny() {
  const llama = readJson(path.join(root, ".cache/tokenizers/llama2/tokenizer.json"));
  const specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[control_8]", "[control_9]"];
  const vocab = new Map();
  for (const s of specials) vocab.set(s, vocab.size);
  for (let b = 0; b < 256; b++) vocab.set(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`, vocab.size);
  // single characters: ▁, printable ASCII but a few (they take byte fallback), some accented letters, one CJK
  const chars = ["\u2581"];
  for (let c = 33; c < 127; c++) if (!"`~^|".includes(String.fromCharCode(c))) chars.push(String.fromCharCode(c));
  chars.push("é", "è", "à", "ü", "ö", "ñ", "ç", "你", "好", "—");
  for (const c of chars) vocab.set(c, vocab.size);
  // Llama 2's merges in rank order whose halves are already in: a realistic, consistent BPE
  const merges = [];
  for (const m of llama.model.merges) {
    if (vocab.size >= 700) break;
    const [a, b] = Array.isArray(m) ? m : m.split(" ");
    if (vocab.has(a) && vocab.has(b) && !vocab.has(a + b)) {
      vocab.set(a + b, vocab.size);
      merges.push([a, b]);
    }
  }
  const added = specials.map((content, id) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  }));
  const tok = {
    version: "1.0", truncation: null, padding: null, added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false },
    post_processor: {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
        { SpecialToken: { id: "<s>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
      special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
    },
    decoder: {
      type: "Sequence",
      decoders: [{ type: "Replace", pattern: { String: "\u2581" }, content: " " }, { type: "ByteFallback" },
        { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 }],
    },
    model: {
      type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab: Object.fromEntries(vocab), merges,
    },
  };
  const cfg = {
    add_bos_token: true, add_eos_token: false, bos_token: "<s>", eos_token: "</s>", unk_token: "<unk>",
    clean_up_tokenization_spaces: false, legacy: false, model_max_length: 32768, tokenizer_class: "LlamaTokenizer",
    chat_template: "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}",
  };
  const dir = path.join(fixdir, "mistral_tiny");
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(tok, null, 1) + "\n");
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(cfg, null, 1) + "\n");
  console.error(`mistral_tiny: ${vocab.size} tokens, ${merges.length} merges`);
}

// ---- corpus ---------------------------------------------------------------
const CORPUS = [
  "", "Hello", "Hello world", "Hello world!", "The quick brown fox jumps over the lazy dog.",
  " Hello", "  Hello", "Hello ", "Hello  ", " ", "  ", "   ", "a  b", "a   b    c", " leading and trailing ",
  "\n", "\n\n", "line one\nline two\n", "\tTabbed\ttext\t", "a\r\nb", "  \n  indented\n\tmore",
  "It's 3.14159 — or so, they said; isn't it?", "1234567890 + 987654321 = 1111111111",
  "naïve café résumé façade jalapeño Ångström", "Straße Größe über", "e\u0301 (decomposed é)",
  "你好，世界！", "日本語のテキストです。", "한국어 텍스트", "Привет, мир", "مرحبا بالعالم", "שלום עולם", "สวัสดีครับ",
  "🦙🦙 llama", "👩‍👩‍👧‍👦 family", "🇫🇷 flag", "emoji at end 😀", "😀",
  "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math letters", "ꙮ", "\u0001\u0002\u007f control", "\u0000NUL", "tab\u000bvt\u000cff",
  "\u00a0nbsp\u3000ideographic space", "zero\u200bwidth",
  "<s>", "</s>", "<unk>", "<s>Hello", "Hello<s>", "Hello <s> world", "<s> Hello", "<s>  Hello",
  "Hi</s><s>again", "<s>[INST] What is 2+2? [/INST] 4</s>", "[INST]Hello[/INST]", "[INST] Hello [/INST]",
  "[TOOL_CALLS] [{\"name\": \"f\"}]", "<s[INST]", "<s >", "[/INST", "▁already▁metaspace", "▁", "▁▁ x",
  "<0x41>", "<0xFF> literal", "def f(x):\n    return x * 2\n", "{\"key\": [1, 2, {\"a\": null}]}",
  "`~^| rare ascii in tiny", "Supercalifragilisticexpialidocious", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "The year 2024: 50% off!!! ???", "UPPER lower MiXeD", "x".repeat(300), "word ".repeat(40),
];

// plus texts put together at random (a fixed seed) from pieces that meet at
// every kind of boundary: spaces, specials, characters in and out of the vocab
let seed = 20261128;
const rnd = (n) => {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed % n;
};
const PIECES = [" ", "  ", "\n", "\t", "\r\n", "a", "the", "Hello", "world", "é", "ñ", "你", "好", "🦙", "€", "<s>", "</s>",
  "[INST]", "[/INST]", "ꙮ", "Ω", "ß", "x", "1", "23", ".", ",", "!", "?", "'", "\"", "(", ")", "-", "—", "über", "naïve",
  "😀", "👍🏽", "한", "ع", "\u00a0", "\u3000", "<", ">", "s", "INST", "▁"];
for (let i = 0; i < 600; i++) {
  let t = "";
  const k = rnd(16);
  // code points below U+3020 make no lone surrogates
  for (let j = 0; j < k; j++) t += rnd(8) === 0 ? String.fromCodePoint(0x20 + rnd(0x3000)) : PIECES[rnd(PIECES.length)];
  CORPUS.push(t);
}

function run(name, dir) {
  const tok = new Tokenizer(readJson(path.join(dir, "tokenizer.json")), readJson(path.join(dir, "tokenizer_config.json")));
  return CORPUS.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const dec = (skip) => ids.length ? tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false }) : "";
    return { text, ids, decode: dec(false), decode_skip: dec(true) };
  });
}

if (process.argv.includes("--tiny")) makeTiny();
const out = {
  reference: REFERENCE,
  generator: "tools/make_sp_tokenizer_fixtures.mjs",
  tokenizers: {
    llama2: run("llama2", path.join(root, ".cache/tokenizers/llama2")),
    mistral_tiny: run("mistral_tiny", path.join(fixdir, "mistral_tiny")),
  },
};
fs.writeFileSync(path.join(fixdir, "sp_parity.json"), JSON.stringify(out, null, 0).replace(/\},\{/g, "},\n{") + "\n");
console.error(`sp_parity.json: ${CORPUS.length} texts x 2 tokenizers (${REFERENCE})`);
