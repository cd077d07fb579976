/* A chat choice's text split by the reasoning and tool-call parsers
 * (chat_choice.h). The reasoning parser sees the text first; what it calls
 * content goes on to the tool-call parser, whose content is the message's.
 * Streaming wires the two parsers' callbacks together: a reasoning piece
 * becomes a chunk, a content piece is fed on to the tool stream. */
#include "server/chat_choice.h"

#include <stdlib.h>
#include <string.h>

/* ---- the whole text ----------------------------------------------------------------- */

static json_t *tool_calls_json(const rp_tool_parsed *t) {
    json_t *calls = json_array();
    for (int i = 0; calls && i < t->num_calls; i++) {
        const rp_tool_call *c = &t->calls[i];
        if (json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", c->id, "type", "function",
                                                   "function", "name", c->name, "arguments", c->arguments))) {
            json_decref(calls);
            return NULL;
        }
    }
    return calls;
}

/* A part of the message: the text, or null when there is none. */
static json_t *text_or_null(const char *s) { return s ? rp_oai_json_text(s, strlen(s)) : json_null(); }

/* The message from the parsers' results (NULL when memory runs out). */
static json_t *message_json(const rp_reasoning_split *rs, int have_split, const rp_tool_parsed *tp,
                            const char *ctext, size_t clen) {
    /* empty content is null where the parsers took something (as vLLM) */
    json_t *content = clen                           ? rp_oai_json_text(ctext, clen)
                      : rs->reasoning || tp->num_calls ? json_null()
                                                       : json_string("");
    json_t *message = json_pack("{s:s, s:o}", "role", "assistant", "content", content);
    if (message && ((have_split && json_object_set_new(message, "reasoning_content", text_or_null(rs->reasoning))) ||
                    (tp->num_calls && json_object_set_new(message, "tool_calls", tool_calls_json(tp))))) {
        json_decref(message);
        return NULL;
    }
    return message;
}

/* Forced calls from the text (chat_choice.h): into t as a parser would
 * leave them (calls, or, for "required", the text as content when it is
 * not the JSON expected). -1 when memory runs out. */
static int forced_calls(const rp_chat_parsing *p, const char *text, size_t len, rp_tool_parsed *t) {
    memset(t, 0, sizeof *t);
    /* a named call is the call whatever its arguments (the stream sent them
     * as they came, cut or not); "required" must be the array */
    json_t *root = p->forced == RP_FORCED_NAMED ? NULL : json_loadb(text, len, JSON_DECODE_ANY, NULL);
    size_t n = 0;
    if (p->forced == RP_FORCED_NAMED) n = len > 0;
    else if (json_is_array(root)) n = json_array_size(root);
    for (size_t i = 0; p->forced == RP_FORCED_REQUIRED && i < n; i++) {
        json_t *c = json_array_get(root, i);
        if (!json_is_string(json_object_get(c, "name")) || !json_object_get(c, "parameters")) n = 0;
    }
    if (n == 0) {
        json_decref(root);
        t->content = strndup(text, len);
        return t->content ? 0 : -1;
    }
    t->calls = calloc(n, sizeof *t->calls);
    int rc = t->calls ? 0 : -1;
    for (size_t i = 0; !rc && i < n; i++) {
        rp_tool_call *c = &t->calls[t->num_calls++];
        char id[32];
        rp_tool_call_id(p->id_style, p->id_seed, (int)i, id);
        c->id = strdup(id);
        if (p->forced == RP_FORCED_NAMED) {
            c->name = strdup(p->forced_name);
            c->arguments = strndup(text, len); /* as written, as the stream sent it */
        } else {
            json_t *call = json_array_get(root, i);
            c->name = strdup(json_string_value(json_object_get(call, "name")));
            c->arguments = json_dumps(json_object_get(call, "parameters"), JSON_COMPACT | JSON_ENCODE_ANY);
        }
        if (!c->id || !c->name || !c->arguments) rc = -1;
    }
    json_decref(root);
    return rc;
}

json_t *rp_chat_choice_json(const rp_chat_parsing *p, int index, const char *text, size_t len, json_t *logprobs,
                            rp_finish finish) {
    rp_reasoning_split rs = {0};
    rp_tool_parsed tp = {0};
    int failed = 0;
    if (p->reasoning) {
        failed = rp_reasoning_parse(p->reasoning_kind, p->prompt_state, text, len, &rs) != 0;
        text = rs.content ? rs.content : "";
        len = strlen(text);
    }
    if (!failed && p->forced) {
        failed = forced_calls(p, text, len, &tp) != 0;
        text = tp.content ? tp.content : "";
        len = strlen(text);
    } else if (!failed && p->tools) {
        failed = rp_tool_parse(p->tool_parser, text, len, p->id_seed, &tp) != 0;
        text = tp.content ? tp.content : "";
        len = strlen(text);
        for (; !failed && p->single_call && tp.num_calls > 1; tp.num_calls--) { /* parallel_tool_calls false */
            rp_tool_call *c = &tp.calls[tp.num_calls - 1];
            free(c->id);
            free(c->name);
            free(c->arguments);
        }
    }
    json_t *message = failed ? NULL : message_json(&rs, p->reasoning, &tp, text, len);
    const char *fin = tp.num_calls ? "tool_calls" : rp_oai_finish_reason(finish);
    rp_tool_parsed_free(&tp);
    rp_reasoning_split_free(&rs);
    if (!message) {
        json_decref(logprobs);
        return NULL;
    }
    return rp_oai_message_choice(index, message, logprobs, fin);
}

/* ---- streaming ---------------------------------------------------------------------- */

struct rp_chat_stream {
    const rp_oai_response *r;
    rp_chat_parsing p;
    int index;
    rp_reasoning_stream *reasoning; /* NULL: no reasoning parser */
    rp_tool_stream *tools;          /* NULL: no tool parser */
    rp_sbuf forced_text;            /* forced calls: the text so far */
    int forced_sent;                /* a named call's first chunk went out */
    /* during one feed or finish */
    rp_sbuf *out;
    json_t *logprobs; /* the token's, for the first chunk */
};

rp_chat_stream *rp_chat_stream_new(const rp_oai_response *r, const rp_chat_parsing *p, int index) {
    rp_chat_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    *s = (rp_chat_stream){.r = r, .p = *p, .index = index};
    if ((p->reasoning && !(s->reasoning = rp_reasoning_stream_new(p->reasoning_kind, p->prompt_state))) ||
        (p->tools && !(s->tools = rp_tool_stream_new(p->tool_parser, p->id_seed)))) {
        rp_chat_stream_free(s);
        return NULL;
    }
    return s;
}

void rp_chat_stream_free(rp_chat_stream *s) {
    if (!s) return;
    rp_reasoning_stream_free(s->reasoning);
    rp_tool_stream_free(s->tools);
    rp_sbuf_free(&s->forced_text);
    free(s);
}

/* One chunk with delta (taken) and, on the first chunk of a token, its
 * logprobs. Nonzero when memory runs out. */
static int send_delta(rp_chat_stream *s, json_t *delta) {
    json_t *lp = s->logprobs;
    s->logprobs = NULL;
    return rp_oai_sse_add(s->out, rp_oai_delta_chunk(s->r, s->index, delta, lp, NULL));
}

static json_t *text_delta(const char *key, const char *text, size_t len) {
    return json_pack("{s:o}", key, rp_oai_json_text(text, len));
}

static int on_tool_event(void *ctx, const rp_tool_event *ev) {
    rp_chat_stream *s = ctx;
    if (s->p.single_call && ev->kind != RP_TOOL_EVENT_CONTENT && ev->index > 0) return 0; /* parallel_tool_calls false */
    json_t *delta;
    switch (ev->kind) {
    case RP_TOOL_EVENT_CONTENT: delta = text_delta("content", ev->text, ev->len); break;
    case RP_TOOL_EVENT_CALL:
        delta = json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", ev->index, "id", ev->id,
                          "type", "function", "function", "name", ev->name, "arguments", "");
        break;
    default:
        delta = json_pack("{s:[{s:i, s:{s:o}}]}", "tool_calls", "index", ev->index, "function", "arguments",
                          rp_oai_json_text(ev->text, ev->len));
        break;
    }
    return send_delta(s, delta);
}

/* Forced calls' text: a named call's arguments go out as they come (its
 * id and name first); "required" keeps the text for finish. */
static int forced_feed(rp_chat_stream *s, const char *text, size_t len) {
    if (rp_sbuf_add(&s->forced_text, text, len)) return -1;
    if (s->p.forced != RP_FORCED_NAMED) return 0;
    if (!s->forced_sent) {
        char id[32];
        rp_tool_call_id(s->p.id_style, s->p.id_seed, 0, id);
        rp_tool_event ev = {.kind = RP_TOOL_EVENT_CALL, .index = 0, .id = id, .name = s->p.forced_name};
        if (on_tool_event(s, &ev)) return -1;
        s->forced_sent = 1;
    }
    rp_tool_event ev = {.kind = RP_TOOL_EVENT_ARGUMENTS, .index = 0, .text = text, .len = len};
    return on_tool_event(s, &ev);
}

/* Forced calls at the end: "required"'s calls, one chunk each; text that
 * is not the JSON expected (cut by max_tokens) as content. The number of
 * calls sent, or -1 when memory runs out. */
static int forced_finish(rp_chat_stream *s) {
    if (s->p.forced == RP_FORCED_NAMED) return s->forced_sent;
    rp_tool_parsed t;
    if (forced_calls(&s->p, s->forced_text.p ? s->forced_text.p : "", s->forced_text.len, &t)) {
        rp_tool_parsed_free(&t);
        return -1;
    }
    int rc = 0;
    if (t.content && *t.content) rc = send_delta(s, text_delta("content", t.content, strlen(t.content)));
    for (int i = 0; !rc && i < t.num_calls; i++) {
        const rp_tool_call *c = &t.calls[i];
        rc = send_delta(s, json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", i, "id", c->id,
                                     "type", "function", "function", "name", c->name, "arguments", c->arguments));
    }
    const int n = t.num_calls;
    rp_tool_parsed_free(&t);
    return rc ? -1 : n;
}

static int on_reasoning(void *ctx, int is_reasoning, const char *text, size_t len) {
    rp_chat_stream *s = ctx;
    if (is_reasoning) return send_delta(s, text_delta("reasoning_content", text, len));
    if (s->p.forced) return forced_feed(s, text, len);
    if (s->tools) return rp_tool_stream_feed(s->tools, text, len, on_tool_event, s);
    return send_delta(s, text_delta("content", text, len));
}

/* Ends a feed or finish: the logprobs no chunk took go on an empty delta. */
static int end_call(rp_chat_stream *s, int rc, size_t mark) {
    if (!rc && s->logprobs) rc = send_delta(s, json_object());
    json_decref(s->logprobs);
    s->logprobs = NULL;
    if (rc) rp_sbuf_truncate(s->out, mark);
    s->out = NULL;
    return rc ? -1 : 0;
}

int rp_chat_stream_feed(rp_chat_stream *s, const char *text, size_t len, json_t *logprobs, rp_sbuf *out) {
    size_t mark = out->len;
    s->out = out;
    s->logprobs = logprobs;
    int rc = 0;
    if (len && s->reasoning) rc = rp_reasoning_stream_feed(s->reasoning, text, len, on_reasoning, s);
    else if (len && s->p.forced) rc = forced_feed(s, text, len);
    else if (len && s->tools) rc = rp_tool_stream_feed(s->tools, text, len, on_tool_event, s);
    else if (len) rc = send_delta(s, text_delta("content", text, len));
    return end_call(s, rc, mark);
}

int rp_chat_stream_finish(rp_chat_stream *s, rp_finish finish, rp_sbuf *out) {
    size_t mark = out->len;
    s->out = out;
    s->logprobs = NULL;
    int rc = 0;
    if (s->reasoning) rc = rp_reasoning_stream_finish(s->reasoning, on_reasoning, s);
    if (!rc && s->tools) rc = rp_tool_stream_finish(s->tools, on_tool_event, s);
    int forced_n = 0;
    if (!rc && s->p.forced && (forced_n = forced_finish(s)) < 0) rc = -1;
    const char *fin = forced_n > 0 || (s->tools && rp_tool_stream_num_calls(s->tools) > 0)
                          ? "tool_calls"
                          : rp_oai_finish_reason(finish);
    if (!rc) rc = rp_oai_sse_add(out, rp_oai_delta_chunk(s->r, s->index, json_object(), NULL, fin));
    return end_call(s, rc, mark);
}
