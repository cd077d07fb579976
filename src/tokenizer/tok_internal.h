/* What the tokenizer's .c files share and the outside world doesn't: the
 * rp_tokenizer struct, the hash maps, the UTF-8 helpers, and the stage
 * functions of the encode pipeline
 *   sanitize UTF-8 -> split off added tokens (added_tokens.c) -> NFC
 *   (normalize.c) -> regex split (pretokenize.c) -> byte-level BPE (bpe.c),
 * or, for a SentencePiece-style tokenizer (sentencepiece.c),
 *   sanitize UTF-8 -> split off added tokens -> Prepend/Replace/NFC ->
 *   Metaspace -> BPE on characters with byte fallback (bpe.c).
 * Tests include this header to reach the stages directly. */
#ifndef RP_TOKENIZER_TOK_INTERNAL_H
#define RP_TOKENIZER_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

/* ---- hash maps (tok_map.c) ---------------------------------------------- */

/* Byte-string keys -> int32. A key is stored as an offset into a byte blob
 * that the caller passes to every call (so the blob may move, e.g. grow by
 * realloc); entries stay 16 bytes, which matters for load time: the vocab
 * maps are megabytes and every probe is a cache miss. */
typedef struct tok_map_entry {
    uint32_t off; /* UINT32_MAX = empty slot */
    uint32_t len;
    uint32_t hash;
    int32_t val;
} tok_map_entry;

typedef struct tok_map {
    tok_map_entry *e;
    size_t cap; /* power of two */
    size_t n;
} tok_map;

int tok_map_init(tok_map *m, size_t expected);
void tok_map_free(tok_map *m);
/* Inserts or overwrites the key base[off..off+len); 0, or -1 on out of memory. */
int tok_map_put(tok_map *m, const char *base, uint32_t off, uint32_t len, int32_t val);
/* The value of key[0..len), or `missing`. */
int32_t tok_map_get(const tok_map *m, const char *base, const char *key, size_t len, int32_t missing);
uint32_t tok_hash_bytes(const char *key, size_t len);

/* (id, id) pair -> merge (rank, new id), for BPE. */
typedef struct tok_pair_entry {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t new_id;
} tok_pair_entry;

typedef struct tok_pairmap {
    tok_pair_entry *e;
    size_t cap;
    size_t n;
} tok_pairmap;

int tok_pairmap_init(tok_pairmap *m, size_t expected);
void tok_pairmap_free(tok_pairmap *m);
/* Inserts or overwrites (a later duplicate merge wins, as in HF's HashMap). */
int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t new_id);

static inline uint64_t tok_pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

/* NULL when the pair has no merge. Inline: it is the BPE inner loop. */
static inline const tok_pair_entry *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = m->cap - 1, i = (size_t)tok_pair_hash(key) & mask;
    for (;;) {
        const tok_pair_entry *e = &m->e[i];
        if (e->key == key) return e;
        if (e->key == UINT64_MAX) return NULL;
        i = (i + 1) & mask;
    }
}

/* ---- UTF-8 (utf8.c) -------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at s[0..n), or 0 when s[0] starts
 * an ill-formed one. */
int tok_utf8_seq_len(const unsigned char *s, size_t n);
/* Length of the maximal subpart of an ill-formed sequence at s (Unicode
 * ch. 3, "U+FFFD substitution of maximal subparts"): what Python's
 * decode(errors="replace") and Rust's from_utf8_lossy replace by one U+FFFD.
 * Also reports whether the subpart is a truncated-but-valid prefix that ran
 * into the end of the input (more bytes could complete it). */
int tok_utf8_maximal_subpart(const unsigned char *s, size_t n, int *truncated);
/* 1 if s[0..n) is well-formed UTF-8. */
int tok_utf8_valid(const char *s, size_t n);
/* Appends the lossy decoding of s[0..n) to a growing buffer. When `final` is
 * 0, a truncated valid prefix at the end is not decoded: *consumed stops
 * before it. Returns 0 or -1 on out of memory. */
int tok_utf8_lossy_append(const unsigned char *s, size_t n, int final, char **buf, size_t *len,
                          size_t *cap, size_t *consumed);
/* Decodes one code point at s (which must be well-formed); returns its length. */
int tok_utf8_decode(const unsigned char *s, uint32_t *cp);
int tok_utf8_encode(uint32_t cp, char *out);
/* Python's str.isspace() for one code point (used by Jinja's trim/strip). */
int tok_py_isspace(uint32_t cp);

/* ---- byte-level alphabet (tokenizer.c) ------------------------------------ */

/* GPT-2's bytes_to_unicode: the code point that stands for each byte. */
uint32_t tok_byte_to_cp(unsigned char b);
/* The byte a code point stands for, or -1 when it is not in the alphabet. */
int tok_cp_to_byte(uint32_t cp);

/* ---- the tokenizer -------------------------------------------------------- */

typedef struct tok_added {
    char *content;
    uint32_t len;
    /* what is matched in the text: the content, or for a "normalized" token
     * of a SentencePiece-style tokenizer the content normalized (HF's
     * AddedVocabulary matches those on normalized text, e.g. "▁<s>" after a
     * Prepend normalizer); match_owned when it is a copy */
    const char *match;
    uint32_t match_len;
    char *match_owned;
    int32_t id;
    unsigned char special, single_word, lstrip, rstrip, normalized;
} tok_added;

/* A regex split step of the pre-tokenizer (Split, or ByteLevel's own regex). */
typedef struct tok_split {
    pcre2_code *re;
    int jit; /* JIT compiled */
} tok_split;

#define TOK_MAX_SPLITS 4

typedef struct tok_chat tok_chat;

/* SentencePiece-style BPE (sentencepiece.c): what Llama 2 and Mistral ship.
 * The normalizer is a list of steps run in order on each piece of text
 * between added tokens; the decoder is per-token string replacements, then
 * ByteFallback, then a Strip of leading characters of the whole output. */
enum { TOK_NORM_NFC, TOK_NORM_PREPEND, TOK_NORM_REPLACE };
typedef struct tok_norm_step {
    int kind;
    char *from, *to; /* REPLACE: every `from` becomes `to`; PREPEND: `to` */
    size_t from_len, to_len;
} tok_norm_step;

#define TOK_MAX_NORM_STEPS 8
#define TOK_MAX_DEC_REPLACES 4

enum { TOK_PREPEND_NEVER, TOK_PREPEND_FIRST, TOK_PREPEND_ALWAYS };

typedef struct tok_sp {
    tok_norm_step norm[TOK_MAX_NORM_STEPS];
    int n_norm;
    /* the Metaspace pre-tokenizer */
    int metaspace;
    char ms_rep[8]; /* the replacement character ("▁"), UTF-8 */
    size_t ms_rep_len;
    int ms_prepend; /* TOK_PREPEND_* */
    int ms_split;
    /* the model */
    int byte_fallback, fuse_unk;
    int32_t ascii_id[128];        /* vocab id of each ASCII character, -1 if none */
    int32_t fallback_id[256];     /* the <0xNN> tokens, -1 if missing */
    tok_map vocab;                /* model vocab only (added tokens excluded), text -> id */
    /* the decoder */
    struct { char from[8], to[8]; size_t from_len, to_len; } dec_rep[TOK_MAX_DEC_REPLACES];
    int n_dec_rep;
    int dec_metaspace_first;  /* a Metaspace decoder that drops the first token's replacement chars */
    char dec_ms_rep[8];
    size_t dec_ms_rep_len;
    int dec_byte_fallback;    /* <0xNN> tokens decode to that byte, runs as UTF-8 */
    int dec_strip;            /* Strip: how many leading dec_strip_char to drop from the output */
    uint32_t dec_strip_char;
    int16_t *dec_byte;        /* per id: the byte of a ByteFallback token, or -1 */
} tok_sp;

struct rp_tokenizer {
    int32_t vocab_size; /* max id + 1 */

    /* per id: the tokenizer.json text and the bytes it decodes to */
    uint32_t *text_off;  /* into text_blob; UINT32_MAX = unused id */
    uint32_t *bytes_off; /* into bytes_blob */
    uint32_t *bytes_len;
    char *text_blob;
    char *bytes_blob;
    unsigned char *is_special;
    unsigned char *is_added;

    tok_map text_to_id;  /* model vocab and added tokens by text */
    tok_map bytes_to_id; /* model vocab by decoded bytes (ignore_merges) */
    tok_pairmap merges;
    int32_t byte_id[256]; /* the single-byte tokens; -1 if missing */
    int32_t unk_id;
    int ignore_merges;

    tok_added *added; /* sorted by content length, longest first */
    int n_added;
    int any_normalized_added;
    unsigned char added_first_byte[256]; /* 1 if some added token starts with it */

    int nfc;
    tok_split splits[TOK_MAX_SPLITS];
    int n_splits;

    int is_sp;  /* SentencePiece-style (sp below), else byte-level */
    tok_sp sp;

    char *bos_token, *eos_token;
    int32_t bos_id, eos_id;
    int config_has_chat_template; /* tokenizer_config.json has a chat_template */
    tok_chat *chat;               /* the compiled chat template (chat_template.c); NULL until loaded */
};

/* ---- pipeline stages ------------------------------------------------------ */

/* A growing id vector. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
int tok_ids_push(tok_ids *ids, int32_t id);

/* Per-call scratch of encode: BPE cache and working arrays. */
typedef struct tok_scratch tok_scratch;
tok_scratch *tok_scratch_new(void);
void tok_scratch_free(tok_scratch *s);

/* NFC-normalises s[0..n) (well-formed UTF-8). *out is NULL when the text is
 * already NFC (the common case, detected without calling utf8proc), else a
 * malloc'd buffer of *out_n bytes. */
int tok_nfc(const char *s, size_t n, char **out, size_t *out_n, rp_err *err);

/* Compiles a tokenizer.json regex for PCRE2, rewriting what Oniguruma (HF's
 * engine) and PCRE2 read differently: \s and \S. */
int tok_split_compile(tok_split *sp, const char *pattern, int literal, rp_err *err);
void tok_split_free(tok_split *sp);
/* Runs split step `level` and the ones after it over s[0..n), then BPE on
 * each final piece, appending ids. */
int tok_pretokenize_and_bpe(const rp_tokenizer *t, int level, const char *s, size_t n,
                            tok_scratch *sc, pcre2_match_data **md, tok_ids *out, rp_err *err);

/* Byte-level BPE of one pre-token (raw bytes), with the per-call cache.
 * force: 0 = pick the algorithm by length, 1 = the short-word quadratic one,
 * 2 = the heap one (tests compare them). */
int tok_bpe_word(const rp_tokenizer *t, const unsigned char *s, size_t n, tok_scratch *sc,
                 int force, tok_ids *out);

/* Splits text on added tokens as HF's AddedVocabulary does. Calls seg() for
 * every piece in order: id >= 0 for an added token, -1 for text between. */
typedef int (*tok_segment_fn)(void *ctx, int32_t id, const char *s, size_t n);
int tok_split_added(const rp_tokenizer *t, const char *s, size_t n, int normalized_pass,
                    int skip_special, tok_segment_fn seg, void *ctx);

/* Decode one token's bytes (tokenizer.c): the ByteLevel decoder's per-token step. */
int tok_token_bytes(const rp_tokenizer *t, int32_t id, const char **b, size_t *n);

/* ---- SentencePiece-style BPE (sentencepiece.c) ---------------------------- */

struct tj_doc;
struct tj_node;
/* Reads normalizer, pre_tokenizer and decoder for a SentencePiece-style
 * tokenizer into t->sp; refuses what it cannot reproduce. */
int tok_sp_load_pipeline(rp_tokenizer *t, const struct tj_doc *d, const struct tj_node *root, rp_err *err);
/* Model fields (byte_fallback, fuse_unk) and the lookup tables, once the
 * vocab is in t->text_blob; vocab_off[i] is the blob offset of vocab entry i. */
int tok_sp_load_model(rp_tokenizer *t, const struct tj_doc *d, const struct tj_node *model,
                      const uint32_t *vocab_off, rp_err *err);
/* The bytes one token stands for (decoder's Replace and ByteFallback), into
 * out (at most text_len bytes); sets t->sp.dec_byte[id]. */
size_t tok_sp_token_bytes(rp_tokenizer *t, int32_t id, const char *text, size_t text_len, char *out);
/* Encodes one piece of text between added tokens; at_start: the piece begins
 * at offset 0 of the original text (Metaspace prepend_scheme "first"). */
/* The normalizer steps on s[0..n): *out is NULL when nothing changed, else a
 * malloc'd buffer of *out_n bytes. */
int tok_sp_normalize(const rp_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n, rp_err *err);
int tok_sp_encode_piece(const rp_tokenizer *t, const char *s, size_t n, int at_start, int skip_special,
                        tok_scratch *sc, tok_ids *out, rp_err *err);
/* BPE of one pre-token on characters, with byte fallback and unk, as HF's
 * BPE::merge_word; bpe.c's tok_bpe_word calls it to make the first symbols. */
size_t tok_sp_init_symbols(const rp_tokenizer *t, const unsigned char *s, size_t n, int32_t *sym);
void tok_sp_free(tok_sp *sp);
/* Whole decode of a SentencePiece-style tokenizer (detok_stream.c): the
 * streamer run over all ids, so that streaming equals it by construction.
 * Ids must already be checked to be in range. */
int tok_sp_decode(const rp_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out,
                  size_t *out_len, rp_err *err);

/* Frees a loaded chat template (chat_template.c). */
void tok_chat_free(tok_chat *c);

/* A growing NUL-terminated byte string (pre-tokenizer patterns, normalized
 * text): tok_buf_put appends n bytes, 0 or -1 when memory runs out. */
typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;

static inline int tok_buf_put(tok_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 256;
        while (c < b->n + n + 1) c *= 2;
        char *np = realloc(b->p, c);
        if (!np) return -1;
        b->p = np;
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

#endif
