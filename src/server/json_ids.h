/* A request's prompt of token ids, read without the general JSON parser.
 *
 * jansson makes one allocated object per array element: an 8,000-id prompt
 * costs ~2 ms to parse on the GPU machine's CPU, a fifth of the time to the
 * first token of a request whose prefix is cached (bench/RESULTS.md, issue
 * 36). So when a body's top-level "prompt" is one flat array of plain
 * non-negative integers, it is read here, and jansson parses the rest of the
 * body with that array replaced by [0] (a placeholder the caller swaps for
 * the ids). Anything else (strings, nested lists, signs, fractions,
 * exponents, ids past 2^31 - 1, a duplicate "prompt" key, malformed JSON)
 * is left alone: the general parser then gives its usual answer or error. */
#ifndef RP_SERVER_JSON_IDS_H
#define RP_SERVER_JSON_IDS_H

#include <stddef.h>
#include <stdint.h>

typedef struct rp_json_ids {
    char *rest;      /* the body with the ids replaced by [0]; NUL-terminated */
    size_t rest_len;
    int32_t *ids;
    int num_ids;
} rp_json_ids;

/* 1 if the prompt was lifted into out (free with rp_json_ids_free), 0 if the
 * body is left to the general parser, -1 out of memory. */
int rp_json_lift_prompt_ids(const char *body, size_t len, rp_json_ids *out);
void rp_json_ids_free(rp_json_ids *j);

#endif
