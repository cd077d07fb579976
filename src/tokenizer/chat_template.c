/* Chat templates: the conversation -> prompt text step, written out in C for
 * the template families replay knows, instead of a Jinja engine.
 *
 * Each renderer follows its Jinja source line by line (quoted in the
 * comments) and is checked against transformers' apply_chat_template output
 * in tests/test_chat_template.c. A template is recognised by a hash of its
 * exact text, because a look-alike (Llama 3.1's, Qwen2.5's) renders
 * differently; anything else is reported with a pointer to --chat-template. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* FNV-1a 64 of the tokenizer_config.json chat_template strings we render. */
static const struct {
    uint64_t hash;
    rp_chat_template_kind kind;
    const char *what;
} KNOWN[] = {
    {0x2bfdb7aa9754484eULL, RP_CHAT_TEMPLATE_QWEN3, "Qwen3"},
    {0x74891e390e614ae2ULL, RP_CHAT_TEMPLATE_LLAMA3, "Llama 3 Instruct"},
};

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

rp_chat_template_kind tok_chat_detect(const char *tmpl, char *hint, size_t hint_size) {
    if (!tmpl) {
        snprintf(hint, hint_size, "tokenizer_config.json has no chat_template");
        return RP_CHAT_TEMPLATE_UNKNOWN;
    }
    uint64_t h = fnv1a(tmpl);
    for (size_t i = 0; i < sizeof KNOWN / sizeof KNOWN[0]; i++)
        if (KNOWN[i].hash == h) return KNOWN[i].kind;
    const char *like = strstr(tmpl, "<|im_start|>")        ? "ChatML/Qwen-like"
                       : strstr(tmpl, "<|start_header_id|>") ? "Llama-3-like"
                                                             : "unfamiliar";
    snprintf(hint, hint_size, "the chat_template in tokenizer_config.json is %s but not one replay renders exactly",
             like);
    return RP_CHAT_TEMPLATE_UNKNOWN;
}

rp_chat_template_kind rp_tokenizer_chat_template(const rp_tokenizer *t) { return t->chat_kind; }

void rp_tokenizer_set_chat_template(rp_tokenizer *t, rp_chat_template_kind kind) { t->chat_kind = kind; }

const char *rp_chat_template_name(rp_chat_template_kind kind) {
    switch (kind) {
    case RP_CHAT_TEMPLATE_QWEN3: return "qwen3";
    case RP_CHAT_TEMPLATE_LLAMA3: return "llama3";
    default: return "unknown";
    }
}

int rp_chat_template_from_name(const char *name, rp_chat_template_kind *out, rp_err *err) {
    if (strcmp(name, "qwen3") == 0) *out = RP_CHAT_TEMPLATE_QWEN3;
    else if (strcmp(name, "llama3") == 0) *out = RP_CHAT_TEMPLATE_LLAMA3;
    else return rp_errf(err, "unknown chat template '%s' (known: qwen3, llama3)", name);
    return 0;
}

/* ---- a string builder ------------------------------------------------------ */

typedef struct sb {
    char *p;
    size_t n, cap;
    int oom;
} sb;

static void sb_addn(sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 1024;
        while (c < b->n + n + 1) c *= 2;
        char *np = realloc(b->p, c);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_add(sb *b, const char *s) { sb_addn(b, s, strlen(s)); }

/* A view into a string: Python slicing without copies. */
typedef struct view {
    const char *s;
    size_t n;
} view;

static view v_of(const char *s) { return (view){s, strlen(s)}; }

static void sb_addv(sb *b, view v) { sb_addn(b, v.s, v.n); }

/* s.lstrip('\n') / s.rstrip('\n') */
static view v_lstrip_nl(view v) {
    while (v.n && v.s[0] == '\n') v.s++, v.n--;
    return v;
}
static view v_rstrip_nl(view v) {
    while (v.n && v.s[v.n - 1] == '\n') v.n--;
    return v;
}

static const char *v_find(view v, const char *needle) {
    size_t k = strlen(needle);
    if (k > v.n) return NULL;
    for (size_t i = 0; i + k <= v.n; i++)
        if (memcmp(v.s + i, needle, k) == 0) return v.s + i;
    return NULL;
}

static const char *v_rfind(view v, const char *needle) {
    size_t k = strlen(needle);
    if (k > v.n) return NULL;
    for (size_t i = v.n - k + 1; i-- > 0;)
        if (memcmp(v.s + i, needle, k) == 0) return v.s + i;
    return NULL;
}

/* s.split(sep)[0] and s.split(sep)[-1] */
static view v_split_first(view v, const char *sep) {
    const char *p = v_find(v, sep);
    return p ? (view){v.s, (size_t)(p - v.s)} : v;
}
static view v_split_last(view v, const char *sep) {
    const char *p = v_rfind(v, sep);
    if (!p) return v;
    size_t off = (size_t)(p - v.s) + strlen(sep);
    return (view){v.s + off, v.n - off};
}

static int v_starts(view v, const char *p) {
    size_t k = strlen(p);
    return v.n >= k && memcmp(v.s, p, k) == 0;
}
static int v_ends(view v, const char *p) {
    size_t k = strlen(p);
    return v.n >= k && memcmp(v.s + v.n - k, p, k) == 0;
}

/* Python str.strip() with no argument (Jinja's trim filter): Unicode
 * whitespace as str.isspace() defines it, at both ends. */
static view v_py_strip(view v) {
    while (v.n) {
        uint32_t cp;
        int l = tok_utf8_seq_len((const unsigned char *)v.s, v.n);
        if (!l) break;
        tok_utf8_decode((const unsigned char *)v.s, &cp);
        if (!tok_py_isspace(cp)) break;
        v.s += l, v.n -= (size_t)l;
    }
    while (v.n) {
        size_t i = v.n - 1;
        while (i > 0 && ((unsigned char)v.s[i] & 0xC0) == 0x80 && v.n - i < 4) i--;
        uint32_t cp;
        if (tok_utf8_seq_len((const unsigned char *)v.s + i, v.n - i) != (int)(v.n - i)) break;
        tok_utf8_decode((const unsigned char *)v.s + i, &cp);
        if (!tok_py_isspace(cp)) break;
        v.n = i;
    }
    return v;
}

static int role_is(const rp_chat_message *m, const char *r) { return m->role && strcmp(m->role, r) == 0; }

/* ---- Qwen3 ------------------------------------------------------------------
 * The tools branch of the template is not reachable (messages carry no tool
 * definitions), nor are reasoning_content and tool_calls fields. */
static void render_qwen3(sb *b, const rp_chat_message *m, int n, int add_gen, int enable_thinking) {
    /* {%- if messages[0].role == 'system' %} '<|im_start|>system\n' + content + '<|im_end|>\n' */
    if (n > 0 && role_is(&m[0], "system")) {
        sb_add(b, "<|im_start|>system\n");
        sb_add(b, m[0].content);
        sb_add(b, "<|im_end|>\n");
    }
    /* ns.last_query_index: the last user message that is not a wrapped tool response */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        view c = v_of(m[i].content);
        if (role_is(&m[i], "user") && !(v_starts(c, "<tool_response>") && v_ends(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        view content = v_of(m[i].content);
        if (role_is(&m[i], "user") || (role_is(&m[i], "system") && i != 0)) {
            sb_add(b, "<|im_start|>");
            sb_add(b, m[i].role);
            sb_add(b, "\n");
            sb_addv(b, content);
            sb_add(b, "<|im_end|>\n");
        } else if (role_is(&m[i], "assistant")) {
            view reasoning = {"", 0};
            if (v_find(content, "</think>")) {
                /* content.split('</think>')[-1].lstrip('\n');
                 * content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                view full = content;
                content = v_lstrip_nl(v_split_last(full, "</think>"));
                reasoning = v_lstrip_nl(v_split_last(v_rstrip_nl(v_split_first(full, "</think>")), "<think>"));
            }
            sb_add(b, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || reasoning.n)) {
                /* '<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') */
                sb_add(b, "<think>\n");
                sb_addv(b, v_rstrip_nl(v_lstrip_nl(reasoning)));
                sb_add(b, "\n</think>\n\n");
                sb_addv(b, v_lstrip_nl(content));
            } else {
                sb_addv(b, content);
            }
            sb_add(b, "<|im_end|>\n");
        } else if (role_is(&m[i], "tool")) {
            if (i == 0 || !role_is(&m[i - 1], "tool")) sb_add(b, "<|im_start|>user");
            sb_add(b, "\n<tool_response>\n");
            sb_addv(b, content);
            sb_add(b, "\n</tool_response>");
            if (i == n - 1 || !role_is(&m[i + 1], "tool")) sb_add(b, "<|im_end|>\n");
        }
        /* any other role renders nothing */
    }
    if (add_gen) {
        sb_add(b, "<|im_start|>assistant\n");
        if (enable_thinking == 0) sb_add(b, "<think>\n\n</think>\n\n");
    }
}

/* ---- Llama 3 Instruct -------------------------------------------------------
 * {% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'
 *    + message['content'] | trim + '<|eot_id|>' %}
 * {% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}
 * ... then '<|start_header_id|>assistant<|end_header_id|>\n\n' always: this
 * template ignores add_generation_prompt. */
static void render_llama3(sb *b, const rp_tokenizer *t, const rp_chat_message *m, int n) {
    for (int i = 0; i < n; i++) {
        if (i == 0 && t->bos_token) sb_add(b, t->bos_token);
        sb_add(b, "<|start_header_id|>");
        sb_add(b, m[i].role);
        sb_add(b, "<|end_header_id|>\n\n");
        sb_addv(b, v_py_strip(v_of(m[i].content)));
        sb_add(b, "<|eot_id|>");
    }
    sb_add(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

int rp_chat_render(const rp_tokenizer *t, const rp_chat_message *msgs, int n, int add_generation_prompt,
                   int enable_thinking, char **out, rp_err *err) {
    *out = NULL;
    if (n < 0) return rp_errf(err, "negative message count");
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return rp_errf(err, "chat message %d lacks a role or content", i);
    sb b = {0};
    switch (t->chat_kind) {
    case RP_CHAT_TEMPLATE_QWEN3: render_qwen3(&b, msgs, n, add_generation_prompt, enable_thinking); break;
    case RP_CHAT_TEMPLATE_LLAMA3: render_llama3(&b, t, msgs, n); break;
    default:
        return rp_errf(err, "%s; pass --chat-template qwen3 or --chat-template llama3 to choose one",
                       t->chat_hint[0] ? t->chat_hint : "unknown chat template");
    }
    sb_add(&b, "");
    if (b.oom) {
        free(b.p);
        return rp_errf(err, "out of memory rendering the chat template");
    }
    *out = b.p;
    return 0;
}

int rp_chat_stop_ids(const rp_tokenizer *t, int32_t *out, int max) {
    int32_t cand[3] = {t->eos_id, -1, -1};
    if (t->chat_kind == RP_CHAT_TEMPLATE_QWEN3) {
        cand[1] = rp_tokenizer_token_id(t, "<|im_end|>");
        cand[2] = rp_tokenizer_token_id(t, "<|endoftext|>");
    } else if (t->chat_kind == RP_CHAT_TEMPLATE_LLAMA3) {
        cand[1] = rp_tokenizer_token_id(t, "<|eot_id|>");
        cand[2] = rp_tokenizer_token_id(t, "<|end_of_text|>");
    }
    int k = 0;
    for (int i = 0; i < 3; i++) {
        if (cand[i] < 0) continue;
        int dup = 0;
        for (int j = 0; j < k; j++) dup |= out[j] == cand[i];
        if (!dup && k < max) out[k++] = cand[i];
    }
    return k;
}
