/* The tensor-parallel step message (tp_step_msg.h): encoding on node 0,
 * decoding, checked field by field, on the others. */
#include "backend/tp_step_msg.h"

#include <stdlib.h>
#include <string.h>

static const uint8_t MAGIC[4] = {'r', 'p', 'S', 'T'};

typedef struct wbuf {
    uint8_t **buf;
    size_t *cap, len;
    int failed;
} wbuf;

static void put(wbuf *w, const void *p, size_t n) {
    if (w->failed) return;
    if (w->len + n > *w->cap) {
        size_t cap = *w->cap ? *w->cap : 4096;
        while (cap < w->len + n) cap *= 2;
        uint8_t *b = realloc(*w->buf, cap);
        if (!b) {
            w->failed = 1;
            return;
        }
        *w->buf = b, *w->cap = cap;
    }
    memcpy(*w->buf + w->len, p, n);
    w->len += n;
}

/* Integers as little-endian (every host replay runs on is; the message
 * says so by its layout, and a big-endian host would need a swap here). */
static void put_u32(wbuf *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(w, b, 4);
}

static void put_i32s(wbuf *w, const int32_t *v, int n) {
    for (int i = 0; i < n; i++) put_u32(w, (uint32_t)v[i]);
}

static void put_u64(wbuf *w, uint64_t v) {
    put_u32(w, (uint32_t)v);
    put_u32(w, (uint32_t)(v >> 32));
}

static void put_f32(wbuf *w, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(w, u);
}

int rp_step_msg_encode(rp_step_op op, int arg, const rp_batch *bt, int page_size, uint8_t **buf, size_t *cap,
                       size_t *len, rp_err *err) {
    wbuf w = {.buf = buf, .cap = cap};
    put(&w, MAGIC, 4);
    put_u32(&w, RP_STEP_MSG_VERSION);
    put_u32(&w, (uint32_t)op);
    put_u32(&w, (uint32_t)arg);
    if (op == RP_STEP_FORWARD) {
        const int S = bt->num_seqs, T = bt->num_tokens, L = bt->num_logits;
        const int32_t head[7] = {S, T, bt->page_table_stride, L, bt->spec_round, bt->sample != NULL,
                                 bt->sample_deferred != 0};
        put_i32s(&w, head, 7);
        put_i32s(&w, bt->tokens, T);
        put_i32s(&w, bt->positions, T);
        put_i32s(&w, bt->slot_mapping, T);
        put_i32s(&w, bt->seq_start, S + 1);
        put_i32s(&w, bt->seq_kv_len, S);
        for (int s = 0; s < S; s++) {
            int pages = (bt->seq_kv_len[s] + page_size - 1) / page_size;
            if (pages > bt->page_table_stride) pages = bt->page_table_stride;
            put_u32(&w, (uint32_t)pages);
            put_i32s(&w, bt->page_table + (int64_t)bt->seq_page_row[s] * bt->page_table_stride, pages);
        }
        put_i32s(&w, bt->logit_token, L);
        for (int i = 0; bt->sample && i < L; i++) {
            const rp_sampling_params *p = &bt->sample[i];
            put_f32(&w, p->temperature);
            put_f32(&w, p->top_p);
            put_u32(&w, (uint32_t)p->top_k);
            put_f32(&w, p->min_p);
            put_u64(&w, p->seed);
            put_u64(&w, p->step);
            put_u32(&w, (uint32_t)p->top_logprobs);
            put_u32(&w, (uint32_t)p->has_seed);
            put_f32(&w, p->repetition_penalty);
            put_f32(&w, p->presence_penalty);
            put_f32(&w, p->frequency_penalty);
        }
    }
    if (w.failed) return rp_errf(err, "out of memory encoding a step message");
    *len = w.len;
    return 0;
}

int rp_step_msg_encode_masks(const uint32_t *masks, int num_masks, int mask_words, const int32_t *mask_of_row,
                             int num_rows, uint8_t **buf, size_t *cap, size_t *len, rp_err *err) {
    wbuf w = {.buf = buf, .cap = cap};
    put(&w, MAGIC, 4);
    put_u32(&w, RP_STEP_MSG_VERSION);
    put_u32(&w, RP_STEP_SAMPLE_MASKED);
    put_u32(&w, (uint32_t)num_masks);
    put_u32(&w, mask_of_row ? (uint32_t)num_rows : 0);
    if (mask_of_row) put_i32s(&w, mask_of_row, num_rows);
    put_u32(&w, (uint32_t)mask_words);
    for (size_t i = 0; i < (size_t)num_masks * (size_t)mask_words; i++) put_u32(&w, masks[i]);
    if (w.failed) return rp_errf(err, "out of memory encoding a step message");
    *len = w.len;
    return 0;
}

int rp_step_msg_encode_abort(const char *reason, uint8_t **buf, size_t *cap, size_t *len, rp_err *err) {
    wbuf w = {.buf = buf, .cap = cap};
    size_t n = strlen(reason);
    if (n > RP_STEP_REASON_BYTES - 1) n = RP_STEP_REASON_BYTES - 1;
    put(&w, MAGIC, 4);
    put_u32(&w, RP_STEP_MSG_VERSION);
    put_u32(&w, RP_STEP_ABORT);
    put_u32(&w, 0);
    put_u32(&w, (uint32_t)n);
    put(&w, reason, n);
    if (w.failed) return rp_errf(err, "out of memory encoding a step message");
    *len = w.len;
    return 0;
}

int rp_step_decoder_init(rp_step_decoder *d, int max_tokens, int max_seqs, int max_logits, int max_stride,
                         int vocab_size, rp_err *err) {
    memset(d, 0, sizeof *d);
    d->max_tokens = max_tokens, d->max_seqs = max_seqs, d->max_logits = max_logits, d->max_stride = max_stride;
    d->mask_words = rp_token_mask_words(vocab_size);
    d->tokens = malloc((size_t)max_tokens * 4);
    d->positions = malloc((size_t)max_tokens * 4);
    d->slot_mapping = malloc((size_t)max_tokens * 4);
    d->seq_start = malloc((size_t)(max_seqs + 1) * 4);
    d->seq_kv_len = malloc((size_t)max_seqs * 4);
    d->seq_page_row = malloc((size_t)max_seqs * 4);
    d->page_table = calloc((size_t)max_seqs * (size_t)max_stride, 4);
    d->logit_token = malloc((size_t)max_logits * 4);
    d->sample = malloc((size_t)max_logits * sizeof *d->sample);
    d->masks = malloc((size_t)max_logits * (size_t)d->mask_words * 4);
    d->mask_rows = malloc((size_t)max_logits * 4);
    if (!d->tokens || !d->positions || !d->slot_mapping || !d->seq_start || !d->seq_kv_len || !d->seq_page_row ||
        !d->page_table || !d->logit_token || !d->sample || !d->masks || !d->mask_rows) {
        rp_step_decoder_free(d);
        return rp_errf(err, "out of memory for the step decoder");
    }
    return 0;
}

void rp_step_decoder_free(rp_step_decoder *d) {
    free(d->tokens);
    free(d->positions);
    free(d->slot_mapping);
    free(d->seq_start);
    free(d->seq_kv_len);
    free(d->seq_page_row);
    free(d->page_table);
    free(d->logit_token);
    free(d->sample);
    free(d->masks);
    free(d->mask_rows);
    memset(d, 0, sizeof *d);
}

typedef struct rbuf {
    const uint8_t *p;
    size_t left;
    int short_read;
} rbuf;

static uint32_t get_u32(rbuf *r) {
    if (r->left < 4) {
        r->short_read = 1;
        return 0;
    }
    uint32_t v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
    r->p += 4, r->left -= 4;
    return v;
}

static int get_i32s(rbuf *r, int32_t *dst, int n) {
    if (n < 0 || r->left / 4 < (size_t)n) {
        r->short_read = 1;
        return RP_ERR;
    }
    for (int i = 0; i < n; i++) dst[i] = (int32_t)get_u32(r);
    return 0;
}

static uint64_t get_u64(rbuf *r) {
    uint64_t lo = get_u32(r);
    return lo | (uint64_t)get_u32(r) << 32;
}

static float get_f32(rbuf *r) {
    uint32_t u = get_u32(r);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int decode_masks(rp_step_decoder *d, rbuf *r, int num_masks, rp_err *err) {
    if (num_masks < 0 || num_masks > d->max_logits)
        return rp_errf(err, "step message: %d token masks (at most %d)", num_masks, d->max_logits);
    const uint32_t rows = get_u32(r);
    if (r->short_read || rows > (uint32_t)d->max_logits)
        return rp_errf(err, "step message: %u masked rows (at most %d)", rows, d->max_logits);
    if (get_i32s(r, d->mask_rows, (int)rows)) return rp_errf(err, "step message: cut short in the masked rows");
    d->mask_of_row = rows ? d->mask_rows : NULL;
    const uint32_t words = get_u32(r);
    if (r->short_read || words != (uint32_t)d->mask_words)
        return rp_errf(err, "step message: masks of %u words, this node's vocabulary makes %d", words,
                       d->mask_words);
    const size_t n = (size_t)num_masks * words;
    if (r->left != n * 4) return rp_errf(err, "step message: %zu bytes for %zu mask words", r->left, n);
    for (size_t i = 0; i < n; i++) d->masks[i] = get_u32(r);
    return 0;
}

int rp_step_msg_decode(rp_step_decoder *d, const uint8_t *msg, size_t len, rp_step_op *op, int *arg, rp_batch *bt,
                       rp_err *err) {
    rbuf r = {.p = msg, .left = len};
    if (len < 16 || memcmp(msg, MAGIC, 4)) return rp_errf(err, "step message: not a replay step (%zu bytes)", len);
    r.p += 4, r.left -= 4;
    uint32_t version = get_u32(&r);
    if (version != RP_STEP_MSG_VERSION)
        return rp_errf(err, "step message version %u, this node speaks %d: run the same replay build on every node",
                       version, RP_STEP_MSG_VERSION);
    uint32_t o = get_u32(&r);
    *arg = (int)get_u32(&r);
    if (o < RP_STEP_FORWARD || o > RP_STEP_PING) return rp_errf(err, "step message: unknown op %u", o);
    *op = (rp_step_op)o;
    memset(bt, 0, sizeof *bt);
    if (o == RP_STEP_SAMPLE_MASKED) return decode_masks(d, &r, *arg, err);
    if (o == RP_STEP_ABORT) {
        uint32_t n = get_u32(&r);
        if (r.short_read || n >= RP_STEP_REASON_BYTES || n != r.left)
            return rp_errf(err, "step message: an abort's reason of %u bytes in %zu", n, r.left);
        memcpy(d->reason, r.p, n);
        d->reason[n] = 0;
        return 0;
    }
    if (o != RP_STEP_FORWARD) {
        if (r.left) return rp_errf(err, "step message: %zu bytes past its end", r.left);
        return 0;
    }
    int32_t head[7];
    if (get_i32s(&r, head, 7)) return rp_errf(err, "step message: cut short in its header");
    const int S = head[0], T = head[1], stride = head[2], L = head[3];
    if (S < 1 || S > d->max_seqs || T < 1 || T > d->max_tokens || stride < 1 || stride > d->max_stride || L < 0 ||
        L > d->max_logits || (head[4] != 0 && head[4] != 1) || (head[5] != 0 && head[5] != 1) ||
        (head[6] != 0 && head[6] != head[5]))
        return rp_errf(err,
                       "step message: %d sequences, %d tokens, page-table stride %d, %d logit rows out of this "
                       "node's limits (%d, %d, %d, %d)",
                       S, T, stride, L, d->max_seqs, d->max_tokens, d->max_stride, d->max_logits);
    if (get_i32s(&r, d->tokens, T) || get_i32s(&r, d->positions, T) || get_i32s(&r, d->slot_mapping, T) ||
        get_i32s(&r, d->seq_start, S + 1) || get_i32s(&r, d->seq_kv_len, S))
        return rp_errf(err, "step message: cut short in its token arrays");
    for (int s = 0; s < S; s++) {
        uint32_t pages = get_u32(&r);
        if (r.short_read || pages > (uint32_t)stride)
            return rp_errf(err, "step message: sequence %d has %u pages (stride %d)", s, pages, stride);
        int32_t *row = d->page_table + (int64_t)s * stride;
        if (get_i32s(&r, row, (int)pages)) return rp_errf(err, "step message: cut short in the page table");
        for (int p = (int)pages; p < stride; p++) row[p] = 0;
        d->seq_page_row[s] = s;
    }
    if (get_i32s(&r, d->logit_token, L)) return rp_errf(err, "step message: cut short in the logit rows");
    for (int i = 0; head[5] && i < L; i++) {
        rp_sampling_params *p = &d->sample[i];
        memset(p, 0, sizeof *p);
        p->temperature = get_f32(&r);
        p->top_p = get_f32(&r);
        p->top_k = (int32_t)get_u32(&r);
        p->min_p = get_f32(&r);
        p->seed = get_u64(&r);
        p->step = get_u64(&r);
        p->top_logprobs = (int32_t)get_u32(&r);
        p->has_seed = (int32_t)get_u32(&r);
        p->repetition_penalty = get_f32(&r);
        p->presence_penalty = get_f32(&r);
        p->frequency_penalty = get_f32(&r);
    }
    if (r.short_read) return rp_errf(err, "step message: cut short in the sampling parameters");
    if (r.left) return rp_errf(err, "step message: %zu bytes past its end", r.left);
    *bt = (rp_batch){.num_seqs = S,
                     .num_tokens = T,
                     .tokens = d->tokens,
                     .positions = d->positions,
                     .seq_start = d->seq_start,
                     .seq_kv_len = d->seq_kv_len,
                     .seq_page_row = d->seq_page_row,
                     .page_table = d->page_table,
                     .page_table_stride = stride,
                     .slot_mapping = d->slot_mapping,
                     .num_logits = L,
                     .logit_token = d->logit_token,
                     .sample = head[5] ? d->sample : NULL,
                     .spec_round = head[4],
                     .sample_deferred = head[6]};
    return 0;
}
