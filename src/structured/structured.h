/* Structured output: a constraint (JSON schema, json_object, regular
 * expression, choice list or GBNF grammar) compiled to a byte-level grammar,
 * a matcher that follows generated tokens through it, and the allowed-token
 * bitmask for the matcher's current state. docs/structured.md has the design.
 *
 * Data path: rp_svocab_new once per tokenizer; rp_sgrammar_compile once per
 * constraint text (cached by text in the vocabulary; it precomputes the
 * per-position token classes); rp_smatcher_new per request; then per step
 * rp_smatcher_fill_mask (on the host, while the GPU runs the forward) and
 * rp_smatcher_accept_token with the sampled token.
 *
 * Thread safety: a vocabulary and its compiled grammars are shared and
 * immutable after compile (the cache takes a lock); a matcher belongs to one
 * request and is used by one thread at a time. */
#ifndef RP_STRUCTURED_STRUCTURED_H
#define RP_STRUCTURED_STRUCTURED_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct rp_svocab rp_svocab;
typedef struct rp_sgrammar rp_sgrammar;
typedef struct rp_smatcher rp_smatcher;

typedef enum rp_skind {
    RP_SKIND_JSON_SCHEMA = 0, /* text: a JSON Schema document */
    RP_SKIND_JSON_OBJECT,     /* text ignored: any JSON object */
    RP_SKIND_REGEX,           /* text: a regular expression (the whole output must match) */
    RP_SKIND_CHOICE,          /* text: a JSON array of strings; the output is one of them */
    RP_SKIND_GBNF,            /* text: a GBNF grammar with a rule named root */
} rp_skind;

typedef struct rp_sopts {
    /* JSON kinds: 0 = compact (no whitespace between tokens), 1 = JSON
     * whitespace (space, tab, newline, CR) allowed wherever JSON allows it. */
    int allow_whitespace;
    /* Limits (0 = the default): schema nesting depth (64) and grammar size in
     * elements (1,000,000). Past a limit, compile fails naming it. */
    int max_depth;
    int max_elements;
    /* Compile classifies the vocabulary at each grammar position for up to
     * this long (0 = the default, 100 ms; < 0 = none), in element order; the
     * positions left are classified when a mask first reaches them. */
    int precompute_ms;
} rp_sopts;

/* The tokens as byte strings (what each id decodes to; may be part of a
 * UTF-8 character). is_special[id] != 0 marks special/added control tokens:
 * never allowed, except the eos ids, which are allowed exactly when the
 * grammar accepts. NULL bytes/len 0 = an unused id (never allowed). */
rp_svocab *rp_svocab_new(int n_tokens, const char *const *bytes, const size_t *lens,
                         const uint8_t *is_special, const int32_t *eos_ids, int n_eos, rp_err *err);
void rp_svocab_free(rp_svocab *v); /* after every grammar and matcher of it is freed */
int rp_svocab_n_tokens(const rp_svocab *v);
/* Words of a mask: (n_tokens + 31) / 32. */
int rp_svocab_mask_words(const rp_svocab *v);

/* Compiles (or finds in the vocabulary's cache) a constraint. On error NULL,
 * with a message naming the keyword or construct and err->param naming the
 * request field ("response_format", "guided_regex", ...) left to the caller. */
rp_sgrammar *rp_sgrammar_compile(rp_svocab *v, rp_skind kind, const char *text, size_t len,
                                 const rp_sopts *opts, rp_err *err);
void rp_sgrammar_release(rp_sgrammar *g);
/* The grammar as GBNF text (the compiled form of a schema or regex; for
 * debugging and docs). Owned by g. */
const char *rp_sgrammar_gbnf(const rp_sgrammar *g);

rp_smatcher *rp_smatcher_new(rp_sgrammar *g, rp_err *err);
void rp_smatcher_free(rp_smatcher *m);
/* 0 if the token is allowed (the state advances), -1 if not (state unchanged).
 * An eos id is allowed only when accepting; after it the matcher is finished. */
int rp_smatcher_accept_token(rp_smatcher *m, int32_t id);
/* Raw bytes (tests, instance checks): 0 and advanced, or -1 and unchanged.
 * Counts as one step for rollback. */
int rp_smatcher_accept_bytes(rp_smatcher *m, const char *bytes, size_t len);
/* Undoes the last n accepted steps (speculative decoding); n larger than the
 * number accepted undoes all. */
void rp_smatcher_rollback(rp_smatcher *m, int n);
int rp_smatcher_is_accepting(const rp_smatcher *m); /* the output so far is complete */
int rp_smatcher_is_dead(const rp_smatcher *m);      /* no token can follow (and not accepting) */
int rp_smatcher_is_finished(const rp_smatcher *m);  /* eos was accepted */
/* Fills mask (rp_svocab_mask_words words; bit id%32 of word id/32, 1 =
 * allowed) for the current state. Returns 1 if some token is allowed, 0 if
 * none is: the generation cannot go on (a state no token of this vocabulary
 * continues, or the matcher is finished). */
int rp_smatcher_fill_mask(rp_smatcher *m, uint32_t *mask);

#endif
