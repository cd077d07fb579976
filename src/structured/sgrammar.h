/* The grammar inside src/structured: a builder (rules of alternatives of
 * element sequences, filled by the GBNF parser) and the flat form the matcher
 * runs on. Everything is over bytes: a character class over code points
 * becomes alternatives of byte-set sequences (its UTF-8 encodings), so the
 * matcher never decodes UTF-8.
 *
 * An element is a byte set (one byte from the set), a reference to a rule,
 * or a counted repetition of a rule (X{m,n} with a count above 4: the
 * matcher keeps the count). Groups, short repetitions and multi-byte classes
 * become auxiliary rules: X* is R ::= X R | "" (right recursion; the matcher
 * elides tail calls, so repetition does not grow its stack). */
#ifndef RP_STRUCTURED_SGRAMMAR_H
#define RP_STRUCTURED_SGRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct sg_byteset {
    uint64_t w[4];
} sg_byteset;

static inline int sg_set_has(const sg_byteset *s, unsigned b) { return (int)((s->w[b >> 6] >> (b & 63)) & 1); }
static inline void sg_set_add(sg_byteset *s, unsigned b) { s->w[b >> 6] |= 1ull << (b & 63); }

/* ---- builder ---- */
/* An element value: >= 0 a byte set index, < 0 a rule reference, from
 * SG_REP_BASE a counted repetition (an index into the builder's reps). */
#define SG_REF(r) (-(int32_t)(r)-1)
#define SG_IS_REF(e) ((e) < 0)
#define SG_REF_RULE(e) (-(e)-1)
#define SG_REP_BASE (1 << 28)
#define SG_IS_REP(e) ((e) >= SG_REP_BASE)

/* body{min,max} (max -1: unbounded) as one element: the matcher counts
 * (a stack node holds the count), so a long repetition costs no more
 * grammar than a short one. */
typedef struct sg_rep {
    int32_t rule, min, max;
} sg_rep;

typedef struct sg_ivec {
    int32_t *v;
    int n, cap;
} sg_ivec;

typedef struct sg_brule {
    char *name;
    sg_ivec *alts;
    int n_alts, cap_alts;
    int defined;   /* has a definition (GBNF: "name ::=" seen) */
    int aux;       /* made for a group, repetition or class, not named by the user */
    int line, col; /* where it was first referenced or defined */
} sg_brule;

typedef struct sg_builder {
    sg_brule *rules;
    int n_rules, cap_rules;
    sg_byteset *sets;
    int n_sets, cap_sets;
    sg_rep *reps;
    int n_reps, cap_reps;
    int32_t *names; /* open addressing over rule names: rule + 1, 0 empty */
    uint32_t names_mask;
    long total_elems, max_elems;
    int aux_counter;
} sg_builder;

int sg_ivec_push(sg_ivec *v, int32_t x);
void sg_builder_init(sg_builder *b, long max_elems);
void sg_builder_free(sg_builder *b);
/* The rule called name (created undefined when new); -1 on OOM. */
int sg_rule_named(sg_builder *b, const char *name, size_t len, rp_err *err);
/* A fresh auxiliary rule, named after base. */
int sg_rule_aux(sg_builder *b, const char *base, rp_err *err);
int sg_add_alt(sg_builder *b, int rule, const int32_t *elems, int n, rp_err *err);
/* The element for one byte from set s. */
int32_t sg_elem_set(sg_builder *b, const sg_byteset *s, rp_err *err);
/* The element for rule{min,max}; -1 on OOM. */
int32_t sg_elem_rep(sg_builder *b, int rule, int32_t min, int32_t max, rp_err *err);

/* Code point ranges [lo, hi], sorted and merged by sg_ranges_norm. */
typedef struct sg_ranges {
    uint32_t (*r)[2];
    int n, cap;
} sg_ranges;
int sg_ranges_add(sg_ranges *s, uint32_t lo, uint32_t hi);
void sg_ranges_norm(sg_ranges *s);
int sg_ranges_negate(sg_ranges *s); /* complement within valid Unicode scalar values */
void sg_ranges_free(sg_ranges *s);
/* The element matching one character of the set (as UTF-8); an element that
 * matches nothing is an error (empty class). */
int sg_elem_ranges(sg_builder *b, sg_ranges *s, const char *rule_base, int32_t *elem, rp_err *err);

/* ---- the flat grammar the matcher runs on ---- */
enum { SG_E_SET = 0, SG_E_REF = 1, SG_E_END = 2, SG_E_REP = 3 };

typedef struct sg_grammar {
    int n_rules, root;
    char **rule_names;
    int32_t *rule_alt_off; /* alts of rule r: alt_start[rule_alt_off[r] .. rule_alt_off[r+1]) */
    int32_t *alt_start;
    int n_elems;
    uint8_t *ekind;    /* SG_E_* */
    int32_t *earg;     /* set index or rule (REF, REP: the body) */
    int32_t *erep_min, *erep_max; /* REP's counts (max -1: unbounded) */
    int32_t *erule;    /* the rule an element belongs to */
    sg_byteset *sets;
    int n_sets;
    int32_t *follow_off; /* rule r's reference sites: follow_sites[follow_off[r] .. follow_off[r+1]) */
    int32_t *follow_sites;
} sg_grammar;

/* Checks (undefined rules, empty language, left recursion), drops
 * unproductive alternatives, inlines small non-recursive rules and
 * flattens. The builder is left empty either way. */
sg_grammar *sg_grammar_finish(sg_builder *b, const char *root_name, rp_err *err);
void sg_grammar_free(sg_grammar *g);

/* GBNF text -> builder -> grammar. */
sg_grammar *sg_parse_gbnf(const char *text, size_t len, long max_elems, rp_err *err);

/* Text generators: each appends GBNF to a growing string. */
typedef struct sg_str {
    char *s;
    size_t n, cap;
    int oom;
} sg_str;
void sg_str_cat(sg_str *s, const char *t);
void sg_str_catn(sg_str *s, const char *t, size_t n);
void sg_str_printf(sg_str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A GBNF string literal for bytes t (quoted, escaped). */
void sg_str_literal(sg_str *s, const char *t, size_t n);

/* Regex -> a GBNF expression (no rule definitions), appended to out. In
 * json_string mode the expression matches the JSON-escaped form of strings
 * the regex matches (for a schema's "pattern"), and ^ $ anchors are
 * optional (unanchored sides match any content). */
int sg_regex_to_gbnf(const char *re, size_t len, int json_string, sg_str *out, rp_err *err);
/* A JSON Schema (or json_object when schema is NULL) -> a GBNF grammar. */
int sg_json_schema_to_gbnf(const char *schema, size_t len, int json_object, int allow_ws, int max_depth,
                           sg_str *out, rp_err *err);

#endif
