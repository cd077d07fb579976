/* The fast path for a prompt of token ids (json_ids.h says why). A scanner
 * of the body's top level only: it must find value boundaries exactly as a
 * JSON parser would, and gives up (0) on anything it does not understand,
 * so the general parser stays the judge of what is valid. */
#include "server/json_ids.h"

#include <stdlib.h>
#include <string.h>

typedef struct scan {
    const char *p, *end;
} scan;

static void skip_ws(scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

/* Past a string that starts at s->p ('"'); 0, or -1 if it does not end. */
static int skip_string(scan *s) {
    s->p++;
    while (s->p < s->end) {
        if (*s->p == '\\') {
            s->p += 2;
            continue;
        }
        if (*s->p++ == '"') return 0;
    }
    return -1;
}

/* Past one value of any kind (nested arrays and objects counted, strings
 * skipped whole); 0, or -1 if the body ends first. */
static int skip_value(scan *s) {
    int depth = 0;
    do {
        skip_ws(s);
        if (s->p >= s->end) return -1;
        const char c = *s->p;
        if (c == '"') {
            if (skip_string(s)) return -1;
        } else if (c == '[' || c == '{') {
            depth++, s->p++;
        } else if (c == ']' || c == '}') {
            if (--depth < 0) return -1;
            s->p++;
        } else if (c == ',' || c == ':') {
            if (depth == 0) return -1;
            s->p++;
        } else { /* a number or literal: up to a delimiter; a NUL or other stray byte ends the scan */
            const char *start = s->p;
            while (s->p < s->end && *s->p && !strchr(" \t\n\r,:[]{}\"", *s->p)) s->p++;
            if (s->p == start) return -1;
        }
    } while (depth > 0);
    return 0;
}

/* The array at s->p ('['), if it holds only plain integers in [0, 2^31 - 1]:
 * 1 with the ids, 0 if it is anything else, -1 out of memory. */
static int read_ids(scan *s, int32_t **ids_out, int *n_out) {
    const char *p = s->p + 1;
    int cap = 0, n = 0;
    int32_t *ids = NULL;
    for (;;) {
        while (p < s->end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
        if (p >= s->end || *p < '0' || *p > '9') break;
        /* JSON allows no leading zeros: "01" is left to the general parser's error */
        if (*p == '0' && p + 1 < s->end && p[1] >= '0' && p[1] <= '9') break;
        int64_t v = 0;
        while (p < s->end && *p >= '0' && *p <= '9') {
            v = v * 10 + (*p++ - '0');
            if (v > 0x7fffffff) goto no;
        }
        if (n == cap) {
            int32_t *grown = realloc(ids, (size_t)(cap = cap ? cap * 2 : 1024) * sizeof *ids);
            if (!grown) {
                free(ids);
                return -1;
            }
            ids = grown;
        }
        ids[n++] = (int32_t)v;
        while (p < s->end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
        if (p < s->end && *p == ',') {
            p++;
            continue;
        }
        if (p < s->end && *p == ']') {
            s->p = p + 1;
            *ids_out = ids;
            *n_out = n;
            return 1;
        }
        break;
    }
no:
    free(ids);
    return 0;
}

int rp_json_lift_prompt_ids(const char *body, size_t len, rp_json_ids *out) {
    memset(out, 0, sizeof *out);
    scan s = {body, body + len};
    skip_ws(&s);
    if (s.p >= s.end || *s.p != '{') return 0;
    s.p++;
    const char *arr_begin = NULL, *arr_end = NULL;
    int32_t *ids = NULL;
    int n = 0, prompts = 0;
    for (;;) {
        skip_ws(&s);
        if (s.p >= s.end || *s.p != '"') break;
        const char *key = s.p + 1;
        if (skip_string(&s)) break;
        /* a key written with escapes is compared as written: "pr\u006fmpt" is
         * not lifted, which only costs the fast path */
        const int is_prompt = s.p - key - 1 == 6 && !memcmp(key, "prompt", 6);
        skip_ws(&s);
        if (s.p >= s.end || *s.p != ':') break;
        s.p++;
        skip_ws(&s);
        if (is_prompt && ++prompts == 1 && s.p < s.end && *s.p == '[') {
            const char *begin = s.p;
            const int r = read_ids(&s, &ids, &n);
            if (r < 0) return -1;
            if (r == 1) arr_begin = begin, arr_end = s.p;
            else if (skip_value(&s)) break;
        } else if (skip_value(&s)) {
            break;
        }
        skip_ws(&s);
        if (s.p < s.end && *s.p == ',') {
            s.p++;
            continue;
        }
        if (s.p < s.end && *s.p == '}') {
            s.p++;
            skip_ws(&s);
            if (s.p != s.end || prompts != 1 || !arr_begin) break;
            const size_t head = (size_t)(arr_begin - body), tail = (size_t)(body + len - arr_end);
            out->rest = malloc(head + 3 + tail + 1);
            if (!out->rest) {
                free(ids);
                return -1;
            }
            memcpy(out->rest, body, head);
            memcpy(out->rest + head, "[0]", 3);
            memcpy(out->rest + head + 3, arr_end, tail);
            out->rest_len = head + 3 + tail;
            out->rest[out->rest_len] = 0;
            out->ids = ids;
            out->num_ids = n;
            return 1;
        }
        break;
    }
    free(ids);
    return 0;
}

void rp_json_ids_free(rp_json_ids *j) {
    free(j->rest);
    free(j->ids);
    memset(j, 0, sizeof *j);
}
