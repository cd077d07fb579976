/* A small, strict JSON reader for tokenizer.json.
 *
 * Why not jansson here: tokenizer.json holds ~150k vocab entries and ~150k-280k
 * merges; jansson builds a hash table per object and takes ~0.4 s on Qwen3's
 * file, longer than Hugging Face's whole load. This reader parses into one flat
 * node array (children contiguous, object keys in file order) at a few hundred
 * MB/s. It is strict (RFC 8259, UTF-8 checked, no lone surrogates, depth
 * limited) because tokenizer.json is untrusted input and is fuzzed. The small
 * tokenizer_config.json still goes through jansson. */
#ifndef RP_TOKENIZER_TJSON_H
#define RP_TOKENIZER_TJSON_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef enum { TJ_NULL, TJ_FALSE, TJ_TRUE, TJ_NUMBER, TJ_STRING, TJ_ARRAY, TJ_OBJECT } tj_type;

typedef struct tj_node {
    uint32_t type;
    uint32_t len;   /* string bytes, array items, object members */
    uint64_t first; /* string: offset in doc->strings; array/object: index in doc->kids */
    double num;
} tj_node;

typedef struct tj_doc {
    tj_node *nodes;
    size_t n_nodes, cap_nodes;
    uint32_t *kids; /* objects store key,value,key,value... */
    size_t n_kids, cap_kids;
    char *strings; /* unescaped string bytes, each NUL-terminated */
    size_t n_strings;
} tj_doc;

/* Parses text[0..len) into doc; the root is node 0. */
int tj_parse(tj_doc *doc, const char *text, size_t len, rp_err *err);
void tj_free(tj_doc *doc);

static inline const tj_node *tj_root(const tj_doc *d) { return &d->nodes[0]; }
static inline const char *tj_str(const tj_doc *d, const tj_node *n) { return d->strings + n->first; }
static inline const tj_node *tj_item(const tj_doc *d, const tj_node *arr, uint32_t i) {
    return &d->nodes[d->kids[arr->first + i]];
}
/* Object member i: key node and value node. */
static inline const tj_node *tj_key_at(const tj_doc *d, const tj_node *obj, uint32_t i) {
    return &d->nodes[d->kids[obj->first + 2 * (uint64_t)i]];
}
static inline const tj_node *tj_val_at(const tj_doc *d, const tj_node *obj, uint32_t i) {
    return &d->nodes[d->kids[obj->first + 2 * (uint64_t)i + 1]];
}
/* Last member named key (serde keeps the last duplicate), or NULL. */
const tj_node *tj_get(const tj_doc *d, const tj_node *obj, const char *key);
/* String value of obj[key] or NULL when absent / not a string. */
const char *tj_get_str(const tj_doc *d, const tj_node *obj, const char *key);
/* Boolean obj[key]: 1/0, or dflt when absent or null; -1 when of another type. */
int tj_get_bool(const tj_doc *d, const tj_node *obj, const char *key, int dflt);

#endif
