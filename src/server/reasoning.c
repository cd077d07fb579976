/* The `<think>` reasoning parsers (reasoning.h). One state machine serves
 * the stream and the whole output: it holds the bytes not yet decided and
 * hands out a piece only once no later byte can change what it is, so any
 * cut of the text into deltas gives the same pieces in total.
 *
 * The rules (docs/tools.md, "Reasoning"):
 *   - prompt CLOSED: all content, nothing parsed;
 *   - an output that starts with `<think>` (the tag is dropped), or any
 *     output of a prompt left OPEN, or any deepseek_r1 output: reasoning up
 *     to the first `</think>`, content after it; no `</think>`: all
 *     reasoning (thinking cut short);
 *   - qwen3, prompt UNKNOWN, no `<think>` first: reasoning before the first
 *     `</think>` if there is one, else all content. A stream cannot tell
 *     which until `</think>` or the end, so it holds the text till then:
 *     the server avoids that by passing the prompt's state.
 * Bytes are kept as they are: nothing is trimmed around the tags. */
#include "server/reasoning.h"

#include <stdlib.h>
#include <string.h>

#include "server/sbuf.h"

static const char THINK_OPEN[] = "<think>";
static const char THINK_CLOSE[] = "</think>";
#define OPEN_LEN (sizeof THINK_OPEN - 1)
#define CLOSE_LEN (sizeof THINK_CLOSE - 1)

enum state {
    ST_START,     /* nothing decided yet: does the output open with <think>? */
    ST_REASONING, /* inside the thinking, up to </think> */
    ST_UNDECIDED, /* qwen3, unknown prompt, no <think>: held until </think> or the end */
    ST_CONTENT,   /* after </think>, or no thinking at all */
};

struct rp_reasoning_stream {
    rp_reasoning_kind kind;
    rp_think_prompt prompt;
    enum state state;
    rp_sbuf buf;      /* bytes not handed out yet, from buf.p + start */
    size_t start;
    size_t searched;  /* in ST_UNDECIDED: bytes after start already searched for </think> */
    int err;          /* once nonzero (emit's return, or -1: out of memory), the stream is stopped */
};

int rp_reasoning_from_name(const char *name, rp_reasoning_kind *out) {
    if (!strcmp(name, "qwen3")) *out = RP_REASONING_QWEN3;
    else if (!strcmp(name, "deepseek_r1")) *out = RP_REASONING_DEEPSEEK_R1;
    else return -1;
    return 0;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int ends_with(const char *s, size_t n, const char *tag, size_t tag_len) {
    return n >= tag_len && !memcmp(s + n - tag_len, tag, tag_len);
}

rp_think_prompt rp_reasoning_prompt_state(const char *prompt, size_t len) {
    while (len && is_space(prompt[len - 1])) len--;
    if (ends_with(prompt, len, THINK_OPEN, OPEN_LEN)) return RP_THINK_OPEN;
    if (ends_with(prompt, len, THINK_CLOSE, CLOSE_LEN)) return RP_THINK_CLOSED;
    return RP_THINK_UNKNOWN;
}

/* The longest end of s[0, n) that is a proper prefix of tag: bytes that
 * may yet become the tag. */
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
        if ((c & 0xC0) == 0x80) continue; /* continuation byte */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

rp_reasoning_stream *rp_reasoning_stream_new(rp_reasoning_kind kind, rp_think_prompt prompt) {
    rp_reasoning_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->kind = kind;
    s->prompt = prompt;
    s->state = prompt == RP_THINK_CLOSED ? ST_CONTENT : ST_START;
    return s;
}

void rp_reasoning_stream_free(rp_reasoning_stream *s) {
    if (!s) return;
    rp_sbuf_free(&s->buf);
    free(s);
}

static int emit_piece(rp_reasoning_stream *s, int is_reasoning, size_t n, rp_reasoning_emit emit, void *ctx) {
    if (!n) return 0;
    int rc = emit(ctx, is_reasoning, s->buf.p + s->start, n);
    s->start += n;
    return rc;
}

/* Hands out every piece the held bytes decide; final: no more bytes come. */
static int step(rp_reasoning_stream *s, int final, rp_reasoning_emit emit, void *ctx) {
    for (;;) {
        const char *p = s->buf.p ? s->buf.p + s->start : "";
        size_t n = s->buf.len - s->start;
        switch (s->state) {
        case ST_START:
            if (n >= OPEN_LEN && !memcmp(p, THINK_OPEN, OPEN_LEN)) {
                s->start += OPEN_LEN;
                s->state = ST_REASONING;
                continue;
            }
            if (!final && n < OPEN_LEN && !memcmp(p, THINK_OPEN, n)) return 0; /* may yet be <think> */
            if (s->prompt == RP_THINK_OPEN || s->kind == RP_REASONING_DEEPSEEK_R1) s->state = ST_REASONING;
            else s->state = ST_UNDECIDED;
            s->searched = 0;
            continue;
        case ST_REASONING: {
            const char *close = memmem(p, n, THINK_CLOSE, CLOSE_LEN);
            if (close) {
                int rc = emit_piece(s, 1, (size_t)(close - p), emit, ctx);
                if (rc) return rc;
                s->start += CLOSE_LEN;
                s->state = ST_CONTENT;
                continue;
            }
            size_t ready = final ? n : utf8_whole(p, n - partial_tag(p, n, THINK_CLOSE, CLOSE_LEN));
            return emit_piece(s, 1, ready, emit, ctx);
        }
        case ST_UNDECIDED: {
            size_t from = s->searched > CLOSE_LEN ? s->searched - CLOSE_LEN : 0;
            const char *close = memmem(p + from, n - from, THINK_CLOSE, CLOSE_LEN);
            if (close) {
                int rc = emit_piece(s, 1, (size_t)(close - p), emit, ctx);
                if (rc) return rc;
                s->start += CLOSE_LEN;
                s->state = ST_CONTENT;
                continue;
            }
            s->searched = n;
            if (!final) return 0;
            s->state = ST_CONTENT; /* never closed: thinking was off */
            continue;
        }
        case ST_CONTENT:
            return emit_piece(s, 0, final ? n : utf8_whole(p, n), emit, ctx);
        }
    }
}

/* Drops the bytes handed out, once they are the larger part of the buffer. */
static void compact(rp_reasoning_stream *s) {
    if (s->start && s->start >= s->buf.len - s->start) {
        memmove(s->buf.p, s->buf.p + s->start, s->buf.len - s->start);
        rp_sbuf_truncate(&s->buf, s->buf.len - s->start);
        s->start = 0;
    }
}

int rp_reasoning_stream_feed(rp_reasoning_stream *s, const char *delta, size_t len, rp_reasoning_emit emit, void *ctx) {
    if (s->err) return s->err;
    compact(s);
    if (rp_sbuf_add(&s->buf, delta, len)) return s->err = -1;
    return s->err = step(s, 0, emit, ctx);
}

int rp_reasoning_stream_finish(rp_reasoning_stream *s, rp_reasoning_emit emit, void *ctx) {
    if (s->err) return s->err;
    return s->err = step(s, 1, emit, ctx);
}

/* ---- whole output: the stream, fed once ---------------------------------- */

typedef struct {
    rp_sbuf part[2]; /* [0] content, [1] reasoning */
} collect;

static int collect_piece(void *ctx, int is_reasoning, const char *text, size_t len) {
    collect *c = ctx;
    return rp_sbuf_add(&c->part[is_reasoning ? 1 : 0], text, len);
}

int rp_reasoning_parse(rp_reasoning_kind kind, rp_think_prompt prompt, const char *text, size_t len,
                       rp_reasoning_split *out) {
    out->reasoning = out->content = NULL;
    rp_reasoning_stream *s = rp_reasoning_stream_new(kind, prompt);
    if (!s) return -1;
    collect c = {0};
    int rc = rp_reasoning_stream_feed(s, text, len, collect_piece, &c);
    if (!rc) rc = rp_reasoning_stream_finish(s, collect_piece, &c);
    rp_reasoning_stream_free(s);
    if (rc) {
        rp_sbuf_free(&c.part[0]);
        rp_sbuf_free(&c.part[1]);
        return -1;
    }
    /* an sbuf is NULL until something was added, and nothing empty is */
    out->content = c.part[0].p;
    out->reasoning = c.part[1].p;
    return 0;
}

void rp_reasoning_split_free(rp_reasoning_split *s) {
    free(s->reasoning);
    free(s->content);
    s->reasoning = s->content = NULL;
}
