/* The tool-call parsers (tool_parse.h). One state machine serves the
 * stream and the whole output: it holds the bytes not yet decided and
 * hands out a piece (content, or a whole call) only once no later byte can
 * change it, so any cut of the text into deltas gives the same result.
 *
 * What is held back: in text, a tail that may still become the parser's
 * marker (`<tool_call>`, `[TOOL_CALLS]`) and the whitespace before it;
 * after a marker, everything up to the end of its JSON (a call is never
 * half-announced, so text that turns out not to be a call is still
 * content). Whitespace right before a call and right after one is part of
 * the call's framing and dropped; all other text is content as written.
 * A marker whose call does not parse becomes content, and the text after
 * it is read again as text (it may hold the next, good, call).
 *
 * JSON is checked twice over: a small scanner here finds where a value ends
 * (or that it has not ended yet, or cannot be JSON: a stream needs all
 * three), and jansson checks what the scanner accepted (UTF-8, escapes)
 * and decodes the function's name. Arguments are copied from the model's
 * text with the whitespace outside strings removed, rather than
 * re-serialised, so numbers keep their digits and keys their order. */
#include "server/tool_parse.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "server/sbuf.h"
#include "util/rng.h"

static const char HERMES_OPEN[] = "<tool_call>";
static const char HERMES_CLOSE[] = "</tool_call>";
static const char MISTRAL_MARK[] = "[TOOL_CALLS]";
static const char MISTRAL_ARGS[] = "[ARGS]";
static const char MISTRAL_CALL_ID[] = "[CALL_ID]";
static const char PYTHON_TAG[] = "<|python_tag|>";
#define SLEN(s) (sizeof s - 1)

int rp_tool_parser_from_name(const char *name, rp_tool_parser *out) {
    if (!strcmp(name, "hermes")) *out = RP_TOOL_PARSER_HERMES;
    else if (!strcmp(name, "llama3_json")) *out = RP_TOOL_PARSER_LLAMA3_JSON;
    else if (!strcmp(name, "mistral")) *out = RP_TOOL_PARSER_MISTRAL;
    else return -1;
    return 0;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_alnum(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && is_space(s[i])) i++;
    return i;
}

/* Where the run of whitespace that ends at i begins. */
static size_t ws_start(const char *s, size_t i) {
    while (i && is_space(s[i - 1])) i--;
    return i;
}

/* 1 if s[0, n) is a prefix of tag (and shorter than it). */
static int is_partial(const char *s, size_t n, const char *tag, size_t tag_len) {
    return n < tag_len && !memcmp(s, tag, n);
}

/* The longest end of s[0, n) that is a proper prefix of tag. */
static size_t partial_tag(const char *s, size_t n, const char *tag, size_t tag_len) {
    size_t k = n < tag_len - 1 ? n : tag_len - 1;
    for (; k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}

/* n, less a UTF-8 sequence that s[0, n) ends inside of. */
static size_t utf8_whole(const char *s, size_t n) {
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue;
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

/* ---- where a JSON value ends ---------------------------------------------- */

enum { J_BAD = -1, J_MORE = 0, J_OK = 1 }; /* cannot be JSON / a valid prefix / complete */
#define JSON_MAX_DEPTH 128

static int scan_string(const char *s, size_t n, size_t *i) {
    size_t k = *i + 1; /* past the opening quote */
    while (k < n) {
        unsigned char c = (unsigned char)s[k];
        if (c == '"') {
            *i = k + 1;
            return J_OK;
        }
        if (c < 0x20) return J_BAD;
        if (c != '\\') {
            k++;
            continue;
        }
        if (k + 1 >= n) return J_MORE;
        char e = s[k + 1];
        if (e == 'u') {
            for (size_t j = k + 2; j < k + 6; j++) {
                if (j >= n) return J_MORE;
                char h = s[j];
                if (!is_digit(h) && !(h >= 'a' && h <= 'f') && !(h >= 'A' && h <= 'F')) return J_BAD;
            }
            k += 6;
        } else if (e && strchr("\"\\/bfnrt", e)) {
            k += 2;
        } else {
            return J_BAD;
        }
    }
    return J_MORE;
}

static int scan_digits(const char *s, size_t n, size_t *k) {
    if (*k >= n) return J_MORE;
    if (!is_digit(s[*k])) return J_BAD;
    while (*k < n && is_digit(s[*k])) (*k)++;
    return *k < n ? J_OK : J_MORE; /* a number at the end may go on */
}

static int scan_number(const char *s, size_t n, size_t *i) {
    size_t k = *i;
    if (s[k] == '-') k++;
    if (k >= n) return J_MORE;
    int rc;
    if (s[k] == '0') {
        if (++k >= n) return J_MORE;
    } else if ((rc = scan_digits(s, n, &k)) != J_OK) {
        return rc;
    }
    if (s[k] == '.') {
        k++;
        if ((rc = scan_digits(s, n, &k)) != J_OK) return rc;
    }
    if (s[k] == 'e' || s[k] == 'E') {
        k++;
        if (k < n && (s[k] == '+' || s[k] == '-')) k++;
        if ((rc = scan_digits(s, n, &k)) != J_OK) return rc;
    }
    *i = k;
    return J_OK;
}

static int scan_value(const char *s, size_t n, size_t *i, int depth);

/* An object or array from its opening bracket. */
static int scan_container(const char *s, size_t n, size_t *i, int depth) {
    int object = s[*i] == '{';
    char close = object ? '}' : ']';
    if (depth >= JSON_MAX_DEPTH) return J_BAD;
    size_t k = skip_ws(s, n, *i + 1);
    if (k >= n) return J_MORE;
    if (s[k] == close) {
        *i = k + 1;
        return J_OK;
    }
    for (;;) {
        int rc;
        if (object) {
            if (s[k] != '"') return J_BAD;
            if ((rc = scan_string(s, n, &k)) != J_OK) return rc;
            k = skip_ws(s, n, k);
            if (k >= n) return J_MORE;
            if (s[k] != ':') return J_BAD;
            k = skip_ws(s, n, k + 1);
        }
        if ((rc = scan_value(s, n, &k, depth + 1)) != J_OK) return rc;
        k = skip_ws(s, n, k);
        if (k >= n) return J_MORE;
        if (s[k] == close) {
            *i = k + 1;
            return J_OK;
        }
        if (s[k] != ',') return J_BAD;
        k = skip_ws(s, n, k + 1);
        if (k >= n) return J_MORE;
    }
}

static int scan_literal(const char *s, size_t n, size_t *i, const char *word) {
    size_t len = strlen(word), have = n - *i < len ? n - *i : len;
    if (memcmp(s + *i, word, have)) return J_BAD;
    if (have < len) return J_MORE;
    *i += len;
    return J_OK;
}

static int scan_value(const char *s, size_t n, size_t *i, int depth) {
    if (*i >= n) return J_MORE;
    char c = s[*i];
    if (c == '{' || c == '[') return scan_container(s, n, i, depth);
    if (c == '"') return scan_string(s, n, i);
    if (c == '-' || is_digit(c)) return scan_number(s, n, i);
    if (c == 't') return scan_literal(s, n, i, "true");
    if (c == 'f') return scan_literal(s, n, i, "false");
    if (c == 'n') return scan_literal(s, n, i, "null");
    return J_BAD;
}

/* The items of a complete, valid object or array: *i starts just past the
 * opening bracket; each call finds the next item's key (objects: the raw
 * string, quotes included) and value spans. 0 at the closing bracket. */
static int next_item(const char *s, size_t n, int object, size_t *i, size_t *ks, size_t *ke, size_t *vs, size_t *ve) {
    size_t k = skip_ws(s, n, *i);
    if (s[k] == ',') k = skip_ws(s, n, k + 1);
    if (s[k] == '}' || s[k] == ']') return 0;
    if (object) {
        *ks = k;
        scan_string(s, n, &k);
        *ke = k;
        k = skip_ws(s, n, skip_ws(s, n, k) + 1); /* past ':' */
    }
    *vs = k;
    scan_value(s, n, &k, 0);
    *ve = k;
    *i = k;
    return 1;
}

/* The value of the last member whose key is written exactly "key". */
static int member(const char *s, size_t n, const char *key, size_t *vs, size_t *ve) {
    size_t i = 1, ks, ke, a, b, key_len = strlen(key);
    int found = 0;
    while (next_item(s, n, 1, &i, &ks, &ke, &a, &b))
        if (ke - ks == key_len + 2 && !memcmp(s + ks + 1, key, key_len)) {
            *vs = a;
            *ve = b;
            found = 1;
        }
    return found;
}

/* The JSON text s[0, n) (valid) without the whitespace outside strings. */
static char *compact(const char *s, size_t n) {
    char *out = malloc(n + 1), *o = out;
    if (!out) return NULL;
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_string) {
            *o++ = c;
            if (c == '\\') *o++ = s[++i];
            else if (c == '"') in_string = 0;
        } else if (!is_space(c)) {
            *o++ = c;
            if (c == '"') in_string = 1;
        }
    }
    *o = 0;
    return out;
}

/* ---- calls ---------------------------------------------------------------- */

typedef struct {
    char *name, *arguments;
} call;

static void call_free(call *c) {
    free(c->name);
    free(c->arguments);
    c->name = c->arguments = NULL;
}

/* jansson's reading of s[0, n), which the scanner accepted. Integers are
 * read as reals, so that one past 64 bits is not refused (arguments keep
 * the digits as written; only the name is taken from jansson). */
static json_t *load(const char *s, size_t n, int *oom) {
    json_error_t err = {0};
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &err);
    /* Out of memory is not the text's fault, so not "no call": jansson
     * (2.14) reports some allocation failures as such and others with no
     * error text at all, which a syntax error always has. */
    *oom = !v && (json_error_code(&err) == json_error_out_of_memory || !err.text[0]);
    return v;
}

/* A call's arguments from the value s[0, n): an object, or a string that
 * holds one's JSON text (some models quote it). 1 valid, 0 not, -1 out of
 * memory. */
static int arguments(const char *s, size_t n, const json_t *value, char **out) {
    if (json_is_object(value)) return (*out = compact(s, n)) ? 1 : -1;
    if (!json_is_string(value)) return 0;
    const char *text = json_string_value(value);
    size_t len = json_string_length(value), from = skip_ws(text, len, 0), k = from;
    if (k >= len || text[k] != '{' || scan_value(text, len, &k, 0) != J_OK || skip_ws(text, len, k) != len) return 0;
    int oom;
    json_t *inner = load(text + from, k - from, &oom);
    int ok = json_is_object(inner);
    json_decref(inner);
    if (!ok) return oom ? -1 : 0;
    return (*out = compact(text + from, k - from)) ? 1 : -1;
}

/* A call from the object s[0, n) (complete by the scanner): {"name":
 * string, "arguments" or "parameters": object}; no arguments means {}. */
static int call_from_object(const char *s, size_t n, call *out) {
    out->name = out->arguments = NULL;
    int oom;
    json_t *root = load(s, n, &oom);
    int rc = oom ? -1 : 0;
    if (!json_is_object(root)) goto done;
    json_t *name = json_object_get(root, "name");
    if (!json_is_string(name) || !json_string_length(name) || memchr(json_string_value(name), 0, json_string_length(name)))
        goto done;
    const char *key = json_object_get(root, "arguments") ? "arguments" : "parameters";
    json_t *args = json_object_get(root, key);
    size_t vs, ve;
    if (!args) {
        rc = (out->arguments = strdup("{}")) ? 1 : -1;
    } else if (member(s, n, key, &vs, &ve)) {
        rc = arguments(s + vs, ve - vs, args, &out->arguments);
    } /* else the key is written with escapes: not a call */
    if (rc == 1 && !(out->name = strdup(json_string_value(name)))) rc = -1;
done:
    json_decref(root);
    if (rc != 1) call_free(out);
    return rc;
}

/* ---- the stream ----------------------------------------------------------- */

enum mode {
    M_TEXT,         /* hermes, mistral: content, looking for the marker */
    M_CALL,         /* hermes, mistral: after a marker, until its call is known good or bad */
    M_LLAMA_START,  /* llama3_json: does the output open with a call? */
    M_LLAMA_CALLS,  /* llama3_json: calls separated by ';' */
    M_PLAIN,        /* llama3_json: the rest is content */
};

struct rp_tool_stream {
    rp_tool_parser parser;
    uint64_t id_seed;
    enum mode mode;
    rp_sbuf buf; /* bytes not decided yet, from buf.p + start */
    size_t start;
    size_t ws_len;      /* M_CALL: the whitespace before the marker, held with it */
    int after_call;     /* M_TEXT: whitespace right after a call is dropped */
    size_t scanned;     /* bytes held when the JSON was last found unfinished; 0: none */
    int num_calls;
    int err; /* once nonzero (emit's return, or -1: out of memory), the stream is stopped */
};

/* What a step tells the loop: wait for more bytes, go on, or stop (the
 * error is in err). */
enum { STOP = -1, STEP_WAIT = 0, GO_ON = 1 };

static const char ALNUM[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

void rp_tool_call_id(rp_tool_parser parser, uint64_t id_seed, int index, char out[32]) {
    int n = 0, len = 24;
    if (parser == RP_TOOL_PARSER_MISTRAL) {
        len = 9; /* Mistral's templates refuse any other id in the history */
    } else {
        memcpy(out, "call_", 5);
        n = 5;
    }
    for (int j = 0; j < len; j++)
        out[n++] = ALNUM[rp_rand_u64(id_seed, 0x746f6f6c63616c6cull, (uint64_t)index * 64 + (uint64_t)j) % 62];
    out[n] = 0;
}

rp_tool_stream *rp_tool_stream_new(rp_tool_parser parser, uint64_t id_seed) {
    rp_tool_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->parser = parser;
    s->id_seed = id_seed;
    s->mode = parser == RP_TOOL_PARSER_LLAMA3_JSON ? M_LLAMA_START : M_TEXT;
    return s;
}

void rp_tool_stream_free(rp_tool_stream *s) {
    if (!s) return;
    rp_sbuf_free(&s->buf);
    free(s);
}

int rp_tool_stream_num_calls(const rp_tool_stream *s) { return s->num_calls; }

static const char *held(const rp_tool_stream *s) { return s->buf.p ? s->buf.p + s->start : ""; }
static size_t held_len(const rp_tool_stream *s) { return s->buf.len - s->start; }

static int stop(rp_tool_stream *s, int rc) {
    s->err = rc;
    return STOP;
}

static void consume(rp_tool_stream *s, size_t n) {
    if (!n) return;
    s->start += n;
    s->scanned = 0; /* it counted held bytes from the old start */
}

static int emit_content(rp_tool_stream *s, size_t n, rp_tool_emit emit, void *ctx) {
    if (!n) return 0;
    rp_tool_event ev = {.kind = RP_TOOL_EVENT_CONTENT, .index = -1, .text = held(s), .len = n};
    int rc = emit(ctx, &ev);
    consume(s, n);
    return rc ? stop(s, rc) : 0;
}

/* Announces a call (and frees it). */
static int emit_call(rp_tool_stream *s, call *c, rp_tool_emit emit, void *ctx) {
    char id[32];
    int index = s->num_calls++;
    rp_tool_call_id(s->parser, s->id_seed, index, id);
    rp_tool_event ev = {.kind = RP_TOOL_EVENT_CALL, .index = index, .id = id, .name = c->name};
    int rc = emit(ctx, &ev);
    if (!rc) {
        rp_tool_event args = {.kind = RP_TOOL_EVENT_ARGUMENTS, .index = index, .text = c->arguments,
                              .len = strlen(c->arguments)};
        rc = emit(ctx, &args);
    }
    call_free(c);
    return rc ? stop(s, rc) : 0;
}

/* Scans the JSON value at held()[at]: J_OK with *end, J_MORE, J_BAD. A value
 * found unfinished is not scanned again until a closing bracket arrives
 * (it cannot finish before one) or the output ends. */
static int scan_held(rp_tool_stream *s, size_t at, int final, size_t *end) {
    const char *p = held(s);
    size_t n = held_len(s);
    if (!final && s->scanned && !memchr(p + s->scanned, '}', n - s->scanned) && !memchr(p + s->scanned, ']', n - s->scanned))
        return J_MORE;
    size_t k = at;
    int rc = scan_value(p, n, &k, 0);
    s->scanned = rc == J_MORE ? n : 0;
    *end = k;
    return rc;
}

/* Text (hermes, mistral): content up to the marker, or as far as it cannot
 * become one. */
static int step_text(rp_tool_stream *s, int final, rp_tool_emit emit, void *ctx) {
    const char *p = held(s), *mark = s->parser == RP_TOOL_PARSER_HERMES ? HERMES_OPEN : MISTRAL_MARK;
    size_t n = held_len(s), mark_len = strlen(mark);
    if (s->after_call) {
        size_t k = skip_ws(p, n, 0);
        consume(s, k);
        if (k == n) return STEP_WAIT;
        s->after_call = 0;
        return GO_ON;
    }
    const char *m = memmem(p, n, mark, mark_len);
    if (m) {
        size_t at = (size_t)(m - p), w = ws_start(p, at);
        int rc = emit_content(s, w, emit, ctx);
        if (rc) return rc;
        s->ws_len = at - w;
        s->mode = M_CALL;
        return GO_ON;
    }
    if (final) return emit_content(s, n, emit, ctx);
    size_t ready = utf8_whole(p, ws_start(p, n - partial_tag(p, n, mark, mark_len)));
    return emit_content(s, ready, emit, ctx);
}

/* A marker whose call did not parse: it and the whitespace before it are
 * content, and what follows is read as text again. */
static int fail_call(rp_tool_stream *s, rp_tool_emit emit, void *ctx) {
    size_t mark_len = s->parser == RP_TOOL_PARSER_HERMES ? SLEN(HERMES_OPEN) : SLEN(MISTRAL_MARK);
    s->mode = M_TEXT;
    int rc = emit_content(s, s->ws_len + mark_len, emit, ctx);
    return rc ? rc : GO_ON;
}

static int accept_call(rp_tool_stream *s, call *c, size_t end, rp_tool_emit emit, void *ctx) {
    consume(s, end);
    s->mode = M_TEXT;
    s->after_call = 1;
    int rc = emit_call(s, c, emit, ctx);
    return rc ? rc : GO_ON;
}

/* hermes: <tool_call> {json} </tool_call>; the closing tag may be missing
 * at the very end of the output. */
static int step_hermes_call(rp_tool_stream *s, int final, rp_tool_emit emit, void *ctx) {
    const char *p = held(s);
    size_t n = held_len(s), k = skip_ws(p, n, s->ws_len + SLEN(HERMES_OPEN)), end;
    if (k >= n) return final ? fail_call(s, emit, ctx) : STEP_WAIT;
    if (p[k] != '{') return fail_call(s, emit, ctx);
    int rc = scan_held(s, k, final, &end);
    if (rc == J_MORE && !final) return STEP_WAIT;
    if (rc != J_OK) return fail_call(s, emit, ctx);
    size_t j = skip_ws(p, n, end);
    if (j < n && is_partial(p + j, n - j, HERMES_CLOSE, SLEN(HERMES_CLOSE)) && !final) return STEP_WAIT;
    if (j == n && !final) return STEP_WAIT;
    size_t close_end;
    if (j == n) close_end = n;
    else if (n - j >= SLEN(HERMES_CLOSE) && !memcmp(p + j, HERMES_CLOSE, SLEN(HERMES_CLOSE))) close_end = j + SLEN(HERMES_CLOSE);
    else return fail_call(s, emit, ctx);
    call c;
    int ok = call_from_object(p + k, end - k, &c);
    if (ok < 0) return stop(s, -1);
    if (!ok) return fail_call(s, emit, ctx);
    return accept_call(s, &c, close_end, emit, ctx);
}

/* mistral: [TOOL_CALLS] [{"name", "arguments"}, ...], or the newer
 * [TOOL_CALLS]name[CALL_ID]id[ARGS]{json} ([CALL_ID] and [ARGS] optional). */
static int step_mistral_call(rp_tool_stream *s, int final, rp_tool_emit emit, void *ctx) {
    const char *p = held(s);
    size_t n = held_len(s), k = skip_ws(p, n, s->ws_len + SLEN(MISTRAL_MARK)), end;
    if (k >= n) return final ? fail_call(s, emit, ctx) : STEP_WAIT;
    if (p[k] == '[') { /* the array form, all calls or none */
        int rc = scan_held(s, k, final, &end);
        if (rc == J_MORE && !final) return STEP_WAIT;
        if (rc != J_OK) return fail_call(s, emit, ctx);
        int oom;
        json_t *all = load(p + k, end - k, &oom);
        int good = json_is_array(all) && json_array_size(all) > 0;
        json_decref(all);
        if (oom) return stop(s, -1);
        if (!good) return fail_call(s, emit, ctx);
        size_t count = 0, i = k + 1, ks, ke, vs, ve;
        while (next_item(p, n, 0, &i, &ks, &ke, &vs, &ve)) count++;
        call *calls = calloc(count, sizeof *calls);
        if (!calls) return stop(s, -1);
        size_t made = 0;
        int ok = 1;
        for (i = k + 1; ok == 1 && next_item(p, n, 0, &i, &ks, &ke, &vs, &ve); made++)
            ok = p[vs] == '{' ? call_from_object(p + vs, ve - vs, &calls[made]) : 0;
        if (ok != 1) {
            for (size_t j = 0; j < made; j++) call_free(&calls[j]);
            free(calls);
            return ok < 0 ? stop(s, -1) : fail_call(s, emit, ctx);
        }
        consume(s, end);
        s->mode = M_TEXT;
        s->after_call = 1;
        int rc2 = 0;
        for (size_t j = 0; j < count; j++) {
            if (!rc2) rc2 = emit_call(s, &calls[j], emit, ctx);
            else call_free(&calls[j]);
        }
        free(calls);
        return rc2 ? rc2 : GO_ON;
    }
    /* the name form */
    size_t name_at = k;
    while (k < n && (is_alnum(p[k]) || p[k] == '_' || p[k] == '-' || p[k] == '.')) k++;
    if (k == name_at) return fail_call(s, emit, ctx);
    size_t name_end = k;
    if (k == n) return final ? fail_call(s, emit, ctx) : STEP_WAIT;
    if (is_partial(p + k, n - k, MISTRAL_CALL_ID, SLEN(MISTRAL_CALL_ID))) return final ? fail_call(s, emit, ctx) : STEP_WAIT;
    if (n - k >= SLEN(MISTRAL_CALL_ID) && !memcmp(p + k, MISTRAL_CALL_ID, SLEN(MISTRAL_CALL_ID))) {
        k += SLEN(MISTRAL_CALL_ID);
        while (k < n && is_alnum(p[k])) k++;
        if (k == n) return final ? fail_call(s, emit, ctx) : STEP_WAIT;
    }
    if (is_partial(p + k, n - k, MISTRAL_ARGS, SLEN(MISTRAL_ARGS))) return final ? fail_call(s, emit, ctx) : STEP_WAIT;
    if (n - k >= SLEN(MISTRAL_ARGS) && !memcmp(p + k, MISTRAL_ARGS, SLEN(MISTRAL_ARGS))) k += SLEN(MISTRAL_ARGS);
    k = skip_ws(p, n, k);
    if (k >= n) return final ? fail_call(s, emit, ctx) : STEP_WAIT;
    if (p[k] != '{') return fail_call(s, emit, ctx);
    int rc = scan_held(s, k, final, &end);
    if (rc == J_MORE && !final) return STEP_WAIT;
    if (rc != J_OK) return fail_call(s, emit, ctx);
    int oom;
    json_t *args = load(p + k, end - k, &oom);
    int good = json_is_object(args);
    json_decref(args);
    if (oom) return stop(s, -1);
    if (!good) return fail_call(s, emit, ctx);
    call c = {0};
    c.name = strndup(p + name_at, name_end - name_at);
    c.arguments = compact(p + k, end - k);
    if (!c.name || !c.arguments) {
        call_free(&c);
        return stop(s, -1);
    }
    return accept_call(s, &c, end, emit, ctx);
}

static int to_plain(rp_tool_stream *s) {
    s->mode = M_PLAIN;
    s->scanned = 0;
    return GO_ON;
}

/* llama3_json: does the output (after whitespace and <|python_tag|>) open
 * with an object? Otherwise all of it is content. */
static int step_llama_start(rp_tool_stream *s, int final) {
    const char *p = held(s);
    size_t n = held_len(s), k = skip_ws(p, n, 0);
    if (k < n && is_partial(p + k, n - k, PYTHON_TAG, SLEN(PYTHON_TAG))) return final ? to_plain(s) : STEP_WAIT;
    if (n - k >= SLEN(PYTHON_TAG) && !memcmp(p + k, PYTHON_TAG, SLEN(PYTHON_TAG))) k = skip_ws(p, n, k + SLEN(PYTHON_TAG));
    if (k == n) return final ? to_plain(s) : STEP_WAIT;
    if (p[k] != '{') return to_plain(s);
    s->mode = M_LLAMA_CALLS;
    return GO_ON;
}

/* llama3_json: the next call, with what leads to it (the opening for the
 * first, ';' after that) and the whitespace around. What does not parse,
 * and all after it, is content. */
static int step_llama_calls(rp_tool_stream *s, int final, rp_tool_emit emit, void *ctx) {
    const char *p = held(s);
    size_t n = held_len(s), k = skip_ws(p, n, 0), end;
    if (!s->num_calls) {
        if (n - k >= SLEN(PYTHON_TAG) && !memcmp(p + k, PYTHON_TAG, SLEN(PYTHON_TAG))) k = skip_ws(p, n, k + SLEN(PYTHON_TAG));
    } else {
        consume(s, k); /* whitespace after a call, as in the other parsers */
        p = held(s);
        n = held_len(s);
        k = 0;
        if (k == n) return STEP_WAIT;
        if (p[k] != ';') return to_plain(s);
        k = skip_ws(p, n, k + 1);
        if (k == n) return final ? to_plain(s) : STEP_WAIT;
        if (p[k] != '{') return to_plain(s);
    }
    int rc = scan_held(s, k, final, &end);
    if (rc == J_MORE && !final) return STEP_WAIT;
    if (rc != J_OK) return to_plain(s);
    call c;
    int ok = call_from_object(p + k, end - k, &c);
    if (ok < 0) return stop(s, -1);
    if (!ok) return to_plain(s);
    consume(s, end);
    rc = emit_call(s, &c, emit, ctx);
    return rc ? rc : GO_ON;
}

static int step(rp_tool_stream *s, int final, rp_tool_emit emit, void *ctx) {
    for (;;) {
        int rc;
        switch (s->mode) {
        case M_TEXT: rc = step_text(s, final, emit, ctx); break;
        case M_CALL:
            rc = s->parser == RP_TOOL_PARSER_HERMES ? step_hermes_call(s, final, emit, ctx)
                                                    : step_mistral_call(s, final, emit, ctx);
            break;
        case M_LLAMA_START: rc = step_llama_start(s, final); break;
        case M_LLAMA_CALLS: rc = step_llama_calls(s, final, emit, ctx); break;
        case M_PLAIN: {
            size_t n = held_len(s);
            rc = emit_content(s, final ? n : utf8_whole(held(s), n), emit, ctx);
            break;
        }
        default: rc = stop(s, -1);
        }
        if (rc != GO_ON) return rc == STOP ? s->err : 0;
    }
}

int rp_tool_stream_feed(rp_tool_stream *s, const char *delta, size_t len, rp_tool_emit emit, void *ctx) {
    if (s->err) return s->err;
    if (s->start && s->start >= s->buf.len - s->start) { /* drop what was handed out */
        size_t keep = s->buf.len - s->start;
        memmove(s->buf.p, s->buf.p + s->start, keep);
        rp_sbuf_truncate(&s->buf, keep);
        s->start = 0;
    }
    if (rp_sbuf_add(&s->buf, delta, len)) return stop(s, -1), -1;
    return step(s, 0, emit, ctx);
}

int rp_tool_stream_finish(rp_tool_stream *s, rp_tool_emit emit, void *ctx) {
    return s->err ? s->err : step(s, 1, emit, ctx);
}

/* ---- whole output: the stream, fed once ----------------------------------- */

typedef struct {
    rp_sbuf content;
    rp_tool_call *calls;
    int num_calls, cap;
} collect;

static int collect_event(void *ctx, const rp_tool_event *ev) {
    collect *c = ctx;
    if (ev->kind == RP_TOOL_EVENT_CONTENT) return rp_sbuf_add(&c->content, ev->text, ev->len);
    if (ev->kind == RP_TOOL_EVENT_CALL) {
        if (c->num_calls == c->cap) {
            int cap = c->cap ? c->cap * 2 : 4;
            rp_tool_call *q = realloc(c->calls, (size_t)cap * sizeof *q);
            if (!q) return -1;
            c->calls = q;
            c->cap = cap;
        }
        rp_tool_call *t = &c->calls[c->num_calls];
        t->id = strdup(ev->id);
        t->name = strdup(ev->name);
        t->arguments = NULL;
        c->num_calls++;
        return t->id && t->name ? 0 : -1;
    }
    rp_tool_call *t = &c->calls[ev->index];
    size_t have = t->arguments ? strlen(t->arguments) : 0;
    char *q = realloc(t->arguments, have + ev->len + 1);
    if (!q) return -1;
    memcpy(q + have, ev->text, ev->len);
    q[have + ev->len] = 0;
    t->arguments = q;
    return 0;
}

void rp_tool_parsed_free(rp_tool_parsed *p) {
    for (int i = 0; i < p->num_calls; i++) {
        free(p->calls[i].id);
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    free(p->content);
    memset(p, 0, sizeof *p);
}

int rp_tool_parse(rp_tool_parser parser, const char *text, size_t len, uint64_t id_seed, rp_tool_parsed *out) {
    memset(out, 0, sizeof *out);
    rp_tool_stream *s = rp_tool_stream_new(parser, id_seed);
    if (!s) return -1;
    collect c = {0};
    int rc = rp_tool_stream_feed(s, text, len, collect_event, &c);
    if (!rc) rc = rp_tool_stream_finish(s, collect_event, &c);
    rp_tool_stream_free(s);
    out->content = c.content.p; /* NULL unless something was added, and nothing empty is */
    out->calls = c.calls;
    out->num_calls = c.num_calls;
    if (rc) {
        rp_tool_parsed_free(out);
        return -1;
    }
    return 0;
}
