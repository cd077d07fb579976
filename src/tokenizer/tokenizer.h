/* The tokenizer: text <-> token ids exactly as Hugging Face `tokenizers` does
 * it for a model's own tokenizer.json, plus the model's chat template that
 * turns a conversation into the prompt text (exactly as transformers'
 * apply_chat_template), and a streaming detokenizer for generation.
 *
 * Supported tokenizer.json: model BPE on the GPT-2 byte-level alphabet
 * (merges as "a b" strings or ["a","b"] pairs, ignore_merges), added/special
 * tokens, normalizer NFC / Sequence of NFC / null, pre-tokenizer Split (regex,
 * Isolated) and ByteLevel (with or without its own regex), decoder ByteLevel.
 * That is what Qwen2/Qwen3 and Llama 3 ship. Also SentencePiece-style BPE
 * (Llama 2, Mistral 7B): Prepend/Replace normalizers or a Metaspace
 * pre-tokenizer, byte_fallback, fuse_unk, and the Replace/Metaspace,
 * ByteFallback, Fuse, Strip decoders (sentencepiece.c). Anything else is a
 * load error that names the unsupported piece. docs/tokenizer.md has the
 * details.
 *
 * A loaded rp_tokenizer is immutable: encode/decode from several threads at
 * once is fine (each call keeps its own scratch). */
#ifndef RP_TOKENIZER_TOKENIZER_H
#define RP_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct rp_tokenizer rp_tokenizer;

/* Reads model_dir/tokenizer.json and (if present) model_dir/tokenizer_config.json. */
rp_tokenizer *rp_tokenizer_load(const char *model_dir, rp_err *err);
/* The same from explicit files; config_path may be NULL. */
rp_tokenizer *rp_tokenizer_load_files(const char *tokenizer_json_path, const char *config_path,
                                      rp_err *err);
/* The same from memory (fuzzing, tests); config_json may be NULL. */
rp_tokenizer *rp_tokenizer_load_json(const char *tokenizer_json, size_t len,
                                     const char *config_json, size_t config_len, rp_err *err);
void rp_tokenizer_free(rp_tokenizer *t);

/* Encode flags for rp_tokenizer_encode_ex. */
enum {
    /* Fail on invalid UTF-8 instead of replacing it. By default each maximal
     * invalid subsequence becomes U+FFFD, as Python's
     * bytes.decode("utf-8", "replace") does before HF ever sees the text. */
    RP_ENCODE_STRICT_UTF8 = 1 << 0,
    /* Treat special tokens inside the text as plain text (HF's
     * split_special_tokens=True); user content in a server wants this. */
    RP_ENCODE_SPLIT_SPECIAL = 1 << 1,
};

/* Same ids as HF tokenizer.encode(text, add_special_tokens=False): special
 * tokens written in the text are recognised. *ids_out is malloc'd (free()),
 * non-NULL even when *n_out is 0. */
int rp_tokenizer_encode(const rp_tokenizer *t, const char *text, size_t len, int32_t **ids_out,
                        size_t *n_out, rp_err *err);
int rp_tokenizer_encode_ex(const rp_tokenizer *t, const char *text, size_t len, unsigned flags,
                           int32_t **ids_out, size_t *n_out, rp_err *err);

/* Full decode, as HF decode(ids, skip_special_tokens): bytes that are not
 * valid UTF-8 become U+FFFD. An id outside [0, vocab_size) is an error (HF
 * drops it silently). *out is malloc'd and NUL-terminated; out_len may be NULL. */
int rp_tokenizer_decode(const rp_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                        char **out, size_t *out_len, rp_err *err);

/* Ids run 0..vocab_size-1, added tokens included. */
int rp_tokenizer_vocab_size(const rp_tokenizer *t);
/* Id of a token by its tokenizer.json text ("<|im_end|>", "Ġthe"); -1 if absent. */
int rp_tokenizer_token_id(const rp_tokenizer *t, const char *token_text);
/* The token's tokenizer.json text, NULL if id is out of range or unused. */
const char *rp_tokenizer_token_text(const rp_tokenizer *t, int id);
/* The bytes the token decodes to (may be a partial UTF-8 character): the
 * byte-level alphabet mapped back, or for SentencePiece-style tokens "▁" as a
 * space and <0xNN> as that byte; added tokens their text. A whole decode can
 * still differ at its start (a Strip or Metaspace decoder drops the first
 * space) and where byte tokens are not valid UTF-8. 0 or -1. */
int rp_tokenizer_token_bytes(const rp_tokenizer *t, int id, const char **bytes, size_t *len);
/* 1 for special added tokens (skipped by skip_special), else 0. */
int rp_tokenizer_is_special(const rp_tokenizer *t, int id);

/* From tokenizer_config.json; -1 / NULL when not set. */
int rp_tokenizer_bos_id(const rp_tokenizer *t);
int rp_tokenizer_eos_id(const rp_tokenizer *t);
const char *rp_tokenizer_bos_token(const rp_tokenizer *t);
const char *rp_tokenizer_eos_token(const rp_tokenizer *t);

/* ---- streaming detokenizer --------------------------------------------
 * Push ids one at a time; each push hands back the bytes that became complete
 * UTF-8 characters. A character split across tokens is held back until its
 * last byte arrives, so output never ends in half a character, and the
 * concatenation of all pushes plus the final flush equals
 * rp_tokenizer_decode of the same ids. */
typedef struct rp_detok {
    const rp_tokenizer *tok;
    int skip_special;
    unsigned char pending[4]; /* an incomplete UTF-8 prefix, at most 3 bytes */
    int n_pending;
    char *buf; /* output of the last call, owned */
    size_t buf_cap;
    /* SentencePiece-style decoders: a run of <0xNN> byte tokens is decoded
     * as a whole when it ends (one invalid byte turns the whole run into
     * U+FFFDs), so it is held back until then; the decoder treats the first
     * token and the output's leading characters specially. */
    unsigned char *run;
    size_t n_run, run_cap;
    size_t n_tokens; /* tokens the decoder has seen (special ones skipped) */
    int strip_left;  /* leading characters the Strip decoder may still drop */
} rp_detok;

void rp_detok_init(rp_detok *d, const rp_tokenizer *t, int skip_special);
/* The stream continues text decoded before it (a completion after its
 * prompt): the decoders' start-of-text rules (Strip's leading characters,
 * Metaspace's first "▁") do not apply, so "▁Paris" after "The capital is"
 * is " Paris", as vLLM's incremental detokenizer makes it and as the
 * prompt's text plus the completion's reads. No effect on byte-level BPE. */
void rp_detok_continue(rp_detok *d);
/* *text points into d (valid until the next call), *len may be 0. */
int rp_detok_push(rp_detok *d, int32_t id, const char **text, size_t *len, rp_err *err);
/* Ends the stream: a dangling partial character becomes U+FFFD. Resets d for reuse. */
void rp_detok_flush(rp_detok *d, const char **text, size_t *len);
void rp_detok_free(rp_detok *d);

/* ---- chat templates ----------------------------------------------------
 * The model's own Jinja chat template (src/template/), compiled once and kept
 * with the tokenizer, and the ids that end an assistant turn. Nothing here
 * knows a model family: chat_template.c says where each piece comes from. */

/* Loads and compiles the chat template: the file template_file when given
 * (--chat-template FILE), else template_dir's chat_template.jinja or
 * tokenizer_config.json's chat_template (with its "tool_use" variant); and
 * the turn-ending ids: the eos token, model_dir's generation_config.json
 * eos_token_id (or config.json's), and the special token the template writes
 * after an assistant message. template_dir and model_dir may be NULL. A
 * directory without a template is no error (rendering then is); a template
 * outside the supported subset is, naming its line and construct. */
int rp_tokenizer_load_chat_template(rp_tokenizer *t, const char *template_dir, const char *model_dir,
                                    const char *template_file, rp_err *err);
int rp_chat_has_template(const rp_tokenizer *t);
/* Where the template came from (a file path), for logs; NULL without one. */
const char *rp_chat_template_origin(const rp_tokenizer *t);

/* Renders what transformers' apply_chat_template(messages, tools=tools,
 * add_generation_prompt=..., tokenize=False, **kwargs) returns: messages is
 * a JSON list of message objects, tools a JSON list or NULL (None), kwargs a
 * JSON object whose every key becomes a template variable, or NULL. *out is
 * malloc'd and NUL-terminated (out_len, when not NULL, counts its bytes).
 * Returns RP_OK, RP_ERR ("chat template line N: ...") or RP_TEMPLATE_RAISED
 * (src/template/template.h: err->msg is the template's own message). */
struct json_t;
int rp_chat_render(const rp_tokenizer *t, const struct json_t *messages, const struct json_t *tools,
                   int add_generation_prompt, const struct json_t *kwargs, char **out, size_t *out_len, rp_err *err);

/* Ids that end an assistant turn (chat_template.c says which), deduplicated;
 * returns how many were written (at most max). Without a loaded template:
 * the eos id alone. */
int rp_chat_stop_ids(const rp_tokenizer *t, int32_t *out, int max);

#endif
