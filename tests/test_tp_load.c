/* Sliced weight loading (src/dist/tp_load.c): for every weight kind of a
 * small random model, at N = 1, 2, 4 (4: KV heads replicated), each rank's
 * slice equals the same rows or columns of the whole tensor converted as
 * model/weights.c converts it, and the ranks' slices put together are the
 * whole tensor; bf16, f16, f32, and FP8 e4m3 in its three scale layouts
 * (against rp_quant_dequant of the whole tensor), keeping the slice's e4m3
 * bytes with its rows' scales or its part of a 128 x 128 block grid; bf16
 * row slices are views of the mapping (a real file, mmap'd); FP8 slices
 * that cut a scale block are refused; --quantization fp8 of a slice
 * (rp_tp_slice_quantize) makes the whole matrix's bytes and scales. */
#include <unistd.h>

#include "dist/tp_load.h"
#include "model/quant.h"
#include "util/dtype.h"
#include "test_util.h"

/* ---- an in-memory safetensors file ---------------------------------------- */

#define MAX_T 32

typedef struct builder {
    int n;
    const char *names[MAX_T], *dtypes[MAX_T];
    int ndim[MAX_T];
    int64_t shape[MAX_T][2];
    void *data[MAX_T];
    size_t bytes[MAX_T];
} builder;

static void add(builder *b, const char *name, const char *dtype, int ndim, int64_t d0, int64_t d1, void *data,
                size_t bytes) {
    assert_true(b->n < MAX_T);
    b->names[b->n] = name, b->dtypes[b->n] = dtype, b->ndim[b->n] = ndim;
    b->shape[b->n][0] = d0, b->shape[b->n][1] = d1;
    b->data[b->n] = data, b->bytes[b->n] = bytes;
    b->n++;
}

/* The file's bytes: header length, JSON header, data. */
static char *build(const builder *b, size_t *len) {
    char *hdr = malloc(1 << 16);
    size_t hl = (size_t)snprintf(hdr, 1 << 16, "{"), off = 0;
    for (int i = 0; i < b->n; i++) {
        char shape[64];
        if (b->ndim[i] == 2) snprintf(shape, sizeof shape, "[%lld, %lld]", (long long)b->shape[i][0], (long long)b->shape[i][1]);
        else snprintf(shape, sizeof shape, "[%lld]", (long long)b->shape[i][0]);
        hl += (size_t)snprintf(hdr + hl, (1 << 16) - hl, "%s\"%s\": {\"dtype\": \"%s\", \"shape\": %s, \"data_offsets\": [%zu, %zu]}",
                               i ? ", " : "", b->names[i], b->dtypes[i], shape, off, off + b->bytes[i]);
        off += b->bytes[i];
    }
    hl += (size_t)snprintf(hdr + hl, (1 << 16) - hl, "}");
    *len = 8 + hl + off;
    char *buf = malloc(*len);
    uint64_t h = hl;
    memcpy(buf, &h, 8);
    memcpy(buf + 8, hdr, hl);
    off = 8 + hl;
    for (int i = 0; i < b->n; i++) {
        memcpy(buf + off, b->data[i], b->bytes[i]);
        off += b->bytes[i];
    }
    free(hdr);
    return buf;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float rnd_float(void) {
    return ((float)(rnd() % 20001) - 10000.0f) / 4096.0f;
}

/* A small model: hidden 32, 4 query heads and 2 KV heads of 8, MLP 48,
 * vocabulary 100 (N = 4 leaves two ranks without vocabulary rows). */
static rp_model_config small_config(void) {
    rp_model_config c;
    assert_int_equal(rp_config_preset(&c, "tiny-qwen2", NULL), 0);
    c.hidden_size = 32, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 8;
    c.intermediate_size = 48, c.vocab_size = 100, c.num_layers = 1;
    c.eos_token_ids[0] = 2, c.num_eos_token_ids = 1;
    return c;
}

/* The weight kinds the checks walk: every split (rows, columns, replicated,
 * vocabulary, KV). */
static const rp_weight_kind kinds[] = {RP_W_EMBED, RP_W_LM_HEAD, RP_W_FINAL_NORM, RP_W_Q, RP_W_K, RP_W_V,
                                       RP_W_O, RP_W_GATE, RP_W_UP, RP_W_DOWN, RP_W_Q_BIAS, RP_W_K_BIAS,
                                       RP_W_Q_NORM};
#define NUM_KINDS ((int)(sizeof kinds / sizeof kinds[0]))

/* Rank r's slice against `whole` (the tensor as bf16), element by element,
 * computing the source index here apart from the library; writes it into
 * `joined` at its place. */
static void check_slice(const rp_tp_slice *s, const rp_tp_weight *w, const uint16_t *whole, uint16_t *joined,
                        const char *what) {
    const int cols_split = s->split == RP_TP_SPLIT_COLS;
    assert_int_equal(w->rows, cols_split ? s->rows : s->count);
    assert_int_equal(w->cols, cols_split ? s->count : s->cols);
    for (int64_t r = 0; r < w->rows; r++)
        for (int64_t c = 0; c < w->cols; c++) {
            const int64_t gr = cols_split ? r : s->start + r, gc = cols_split ? s->start + c : c;
            const uint16_t want = whole[gr * s->cols + gc], got = w->data[r * w->cols + c];
            if (got != want) fail_msg("%s: element (%lld, %lld) is %04x, want %04x", what, (long long)r, (long long)c, got, want);
            joined[gr * s->cols + gc] = got;
        }
}

/* --quantization fp8 of rank r's slice w (rp_tp_slice_quantize) against
 * the whole matrix `whole` quantized per row: the slice's bytes, scales and
 * values are those rows or columns of the whole's, a column slice's scales
 * being its whole rows'. Per 128 x 128 block: the small shapes' slices
 * start inside a block except at N = 1, which is the whole's blocks. On a
 * copy of w (its data stays the bf16 slice). */
static void check_quantized(const rp_tp_slice *s, const rp_st_tensor *t, const rp_tp_weight *w,
                            const uint16_t *whole, const char *what) {
    const int64_t R = s->rows, C = s->cols, n = R * C;
    uint8_t *q = malloc((size_t)n);
    float *sc = malloc((size_t)(R > 1 ? R : 1) * sizeof(float));
    uint16_t *deq = malloc((size_t)n * 2);
    rp_quant_fp8_rows(whole, R, C, q, sc, deq);
    for (int blocks = 0; blocks < 2; blocks++) {
        rp_tp_weight c = *w; /* the quantized buffers replace this copy's */
        rp_err err;
        uint16_t *data = malloc((size_t)(w->rows * w->cols) * 2 + 2);
        memcpy(data, w->data, (size_t)(w->rows * w->cols) * 2);
        c.data = c.owned = data;
        if (blocks) {
            const int rc = rp_tp_slice_quantize(s, "m", t, RP_FP8_BLOCKS, &c, &err);
            if (!rp_tp_slice_whole_blocks(s, 128)) {
                assert_int_equal(rc, RP_ERR);
                if (!strstr(err.msg, "are not whole 128x128 fp8 blocks")) fail_msg("%s: %s", what, err.msg);
                free(data);
                continue;
            }
            assert_int_equal(rc, 0);
            if (s->start || s->count != (s->split == RP_TP_SPLIT_COLS ? C : R)) fail_msg("%s: blocks cut", what);
            uint8_t *qb = malloc((size_t)n);
            float grid[4];
            uint16_t *db = malloc((size_t)n * 2);
            assert_true(R <= 128 && C <= 128);
            rp_quant_fp8_blocks(whole, R, C, qb, grid, db);
            assert_memory_equal(c.fp8, qb, (size_t)n);
            assert_true(c.block_scale[0] == grid[0]);
            assert_memory_equal(c.data, db, (size_t)n * 2);
            assert_null(c.scale);
            free(qb), free(db);
        } else {
            if (rp_tp_slice_quantize(s, "m", t, RP_FP8_ROWS, &c, &err)) fail_msg("%s: %s", what, err.msg);
            assert_null(c.block_scale);
            for (int64_t i = 0; i < c.rows; i++) {
                const int64_t gr = s->split == RP_TP_SPLIT_COLS ? i : s->start + i;
                if (c.scale[i] != sc[gr]) fail_msg("%s: row %lld's scale %g, the whole row's %g", what, (long long)i,
                                                   (double)c.scale[i], (double)sc[gr]);
                for (int64_t j = 0; j < c.cols; j++) {
                    const int64_t g = gr * C + (s->split == RP_TP_SPLIT_COLS ? s->start + j : j);
                    if (c.fp8[i * c.cols + j] != q[g] || c.data[i * c.cols + j] != deq[g])
                        fail_msg("%s: quantized (%lld, %lld) is %02x/%04x, the whole's %02x/%04x", what, (long long)i,
                                 (long long)j, c.fp8[i * c.cols + j], c.data[i * c.cols + j], q[g], deq[g]);
                }
            }
        }
        /* a slice already e4m3 is not quantized again */
        assert_int_equal(rp_tp_slice_quantize(s, "m", t, RP_FP8_ROWS, &c, &err), RP_ERR);
        assert_non_null(strstr(err.msg, "already fp8"));
        c.data = NULL; /* w's, not the copy's */
        rp_tp_weight_release(&c);
    }
    free(q), free(sc), free(deq);
}

/* Builds each kind's tensor in `dtype`, loads every rank's slice at N =
 * 1, 2, 4, checks them and their union. */
static void run_dtype(const char *dtype) {
    rp_model_config c = small_config();
    builder b = {0};
    uint16_t *whole[NUM_KINDS];
    for (int k = 0; k < NUM_KINDS; k++) {
        int64_t shape[2];
        rp_weight_shape(&c, kinds[k], shape);
        const int64_t n = shape[0] * shape[1];
        whole[k] = malloc((size_t)n * 2);
        void *data;
        size_t bytes;
        if (!strcmp(dtype, "F32")) {
            float *f = malloc((size_t)n * 4);
            for (int64_t i = 0; i < n; i++) f[i] = rnd_float(), whole[k][i] = rp_f32_to_bf16(f[i]);
            data = f, bytes = (size_t)n * 4;
        } else if (!strcmp(dtype, "F16")) {
            uint16_t *h = malloc((size_t)n * 2);
            for (int64_t i = 0; i < n; i++) {
                h[i] = (uint16_t)(rnd() & 0xbfffu); /* exponent below 31: finite */
                whole[k][i] = rp_f32_to_bf16(rp_f16_to_f32(h[i]));
            }
            data = h, bytes = (size_t)n * 2;
        } else {
            uint16_t *h = malloc((size_t)n * 2);
            for (int64_t i = 0; i < n; i++) h[i] = whole[k][i] = rp_f32_to_bf16(rnd_float());
            data = h, bytes = (size_t)n * 2;
        }
        add(&b, rp_weight_kind_name(kinds[k]), dtype, shape[1] == 1 ? 1 : 2, shape[0], shape[1], data, bytes);
    }
    size_t len;
    char *file = build(&b, &len);
    rp_err err;
    rp_safetensors *st = rp_safetensors_parse(file, len, &err);
    if (!st) fail_msg("%s", err.msg);
    for (int n = 1; n <= 4; n *= 2) {
        rp_tp_plan p;
        if (rp_tp_plan_make(&p, &c, n, &err)) fail_msg("%s", err.msg);
        for (int k = 0; k < NUM_KINDS; k++) {
            const rp_st_tensor *t = rp_safetensors_find(st, rp_weight_kind_name(kinds[k]));
            assert_non_null(t);
            int64_t shape[2];
            rp_weight_shape(&c, kinds[k], shape);
            uint16_t *joined = calloc((size_t)(shape[0] * shape[1]), 2);
            int replicas = p.size;
            if (rp_tp_kind_split(kinds[k]) != RP_TP_REPLICATED) replicas = 1;
            if (kinds[k] == RP_W_K || kinds[k] == RP_W_V || kinds[k] == RP_W_K_BIAS) replicas = p.kv_replicas;
            for (int r = 0; r < n; r++) {
                rp_tp_slice s;
                rp_tp_weight_slice(&p, kinds[k], r, &s);
                rp_tp_weight w;
                if (rp_tp_slice_load(&s, rp_weight_kind_name(kinds[k]), t, NULL, NULL, &w, &err))
                    fail_msg("%s N=%d rank %d: %s", rp_weight_kind_name(kinds[k]), n, r, err.msg);
                char what[128];
                snprintf(what, sizeof what, "%s %s N=%d rank %d", dtype, rp_weight_kind_name(kinds[k]), n, r);
                check_slice(&s, &w, whole[k], joined, what);
                if (rp_weight_kind_is_layer_matrix(kinds[k])) check_quantized(&s, t, &w, whole[k], what);
                /* bf16 rows are views of the file's bytes, nothing copied */
                if (!strcmp(dtype, "BF16") && s.split != RP_TP_SPLIT_COLS) {
                    assert_null(w.owned);
                    assert_true((const char *)w.data >= file && (const char *)w.data <= file + len);
                } else if (w.rows > 0 && w.cols > 0) {
                    assert_non_null(w.owned);
                }
                if (r % replicas) { /* a replica holds the same rows as the first rank of its group */
                    rp_tp_slice first;
                    rp_tp_weight_slice(&p, kinds[k], r - r % replicas, &first);
                    assert_int_equal(s.start, first.start);
                    assert_int_equal(s.count, first.count);
                }
                rp_tp_weight_release(&w);
            }
            if (memcmp(joined, whole[k], (size_t)(shape[0] * shape[1]) * 2))
                fail_msg("%s %s N=%d: the slices together are not the whole tensor", dtype,
                         rp_weight_kind_name(kinds[k]), n);
            free(joined);
        }
    }
    rp_safetensors_close(st);
    free(file);
    for (int k = 0; k < NUM_KINDS; k++) free(whole[k]), free(b.data[k]);
}

static void test_bf16(void **state) {
    (void)state;
    run_dtype("BF16");
}
static void test_f32(void **state) {
    (void)state;
    run_dtype("F32");
}
static void test_f16(void **state) {
    (void)state;
    run_dtype("F16");
}

/* A real file through rp_safetensors_open: a row slice is a view into the
 * mapping; a column slice, a buffer of the slice's size. */
static void test_mmap_file(void **state) {
    (void)state;
    rp_model_config c = small_config();
    int64_t qs[2], ds[2];
    rp_weight_shape(&c, RP_W_Q, qs);
    rp_weight_shape(&c, RP_W_DOWN, ds);
    uint16_t *q = malloc((size_t)(qs[0] * qs[1]) * 2), *d = malloc((size_t)(ds[0] * ds[1]) * 2);
    for (int64_t i = 0; i < qs[0] * qs[1]; i++) q[i] = rp_f32_to_bf16(rnd_float());
    for (int64_t i = 0; i < ds[0] * ds[1]; i++) d[i] = rp_f32_to_bf16(rnd_float());
    builder b = {0};
    add(&b, "q", "BF16", 2, qs[0], qs[1], q, (size_t)(qs[0] * qs[1]) * 2);
    add(&b, "down", "BF16", 2, ds[0], ds[1], d, (size_t)(ds[0] * ds[1]) * 2);
    size_t len;
    char *bytes = build(&b, &len);
    char path[] = "/tmp/test_tp_load_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, bytes, len), (ssize_t)len);
    close(fd);
    rp_err err;
    rp_safetensors *st = rp_safetensors_open(path, &err);
    if (!st) fail_msg("%s", err.msg);
    rp_tp_plan p;
    assert_int_equal(rp_tp_plan_make(&p, &c, 2, &err), 0);
    for (int r = 0; r < 2; r++) {
        rp_tp_slice s;
        rp_tp_weight w;
        uint16_t *joined = malloc((size_t)(qs[0] * qs[1]) * 2);
        rp_tp_weight_slice(&p, RP_W_Q, r, &s);
        assert_int_equal(rp_tp_slice_load(&s, "q", rp_safetensors_find(st, "q"), NULL, NULL, &w, &err), 0);
        assert_null(w.owned);
        assert_true((const char *)w.data > (const char *)st->map &&
                    (const char *)w.data < (const char *)st->map + st->map_bytes);
        check_slice(&s, &w, q, joined, "mmap q");
        rp_tp_weight_release(&w);
        free(joined);
        joined = malloc((size_t)(ds[0] * ds[1]) * 2);
        rp_tp_weight_slice(&p, RP_W_DOWN, r, &s);
        assert_int_equal(rp_tp_slice_load(&s, "down", rp_safetensors_find(st, "down"), NULL, NULL, &w, &err), 0);
        assert_non_null(w.owned);
        check_slice(&s, &w, d, joined, "mmap down");
        rp_tp_weight_release(&w);
        free(joined);
    }
    rp_safetensors_close(st);
    unlink(path);
    free(bytes);
    free(q);
    free(d);
}

/* ---- FP8 ------------------------------------------------------------------ */

typedef enum { L_BLOCK, L_TENSOR, L_CHANNEL } layout;

/* The e4m3 bytes and scales a slice keeps (rp_tp_weight): where the
 * scales are per tensor, per channel or 128 x 128 blocks, the slice's bytes
 * of the file, each of its rows' scale (a column slice: every row's), or
 * its part of the grid; none for other block sizes. */
static void check_kept(const rp_quant_config *q, const rp_tp_slice *s, const rp_st_tensor *t,
                       const rp_st_tensor *sc, const rp_tp_weight *w, const char *what) {
    rp_err err;
    const int64_t R = s->rows, C = s->cols, B = 128;
    if (q->block[0] && q->block[0] != B) {
        assert_null(w->fp8);
        assert_null(w->scale);
        assert_null(w->block_scale);
        return;
    }
    if (!w->fp8) fail_msg("%s: no e4m3 bytes kept", what);
    uint8_t *bytes = malloc((size_t)(w->rows * w->cols) + 1);
    assert_int_equal(rp_tp_slice_copy(s, t, bytes, &err), 0);
    if (memcmp(bytes, w->fp8, (size_t)(w->rows * w->cols))) fail_msg("%s: kept bytes are not the slice's", what);
    free(bytes);
    const int64_t gc = (C + B - 1) / B, n = R > (R + B - 1) / B * gc ? R : (R + B - 1) / B * gc;
    float *whole = malloc((size_t)n * sizeof(float));
    if (q->block[0]) {
        assert_int_equal(rp_quant_block_scales(q, "m", R, C, sc, whole, &err), 1);
        assert_null(w->scale);
        const int rows_split = s->split == RP_TP_SPLIT_ROWS, wgc = (int)((w->cols + B - 1) / B);
        for (int64_t i = 0; i < (w->rows + B - 1) / B; i++)
            for (int64_t j = 0; j < wgc; j++) {
                const float want = whole[(i + (rows_split ? s->start / B : 0)) * gc + j + (rows_split ? 0 : s->start / B)];
                if (w->block_scale[i * wgc + j] != want)
                    fail_msg("%s: block (%lld, %lld) scale %g, want %g", what, (long long)i, (long long)j,
                             (double)w->block_scale[i * wgc + j], (double)want);
            }
    } else {
        assert_int_equal(rp_quant_row_scales(q, "m", R, C, sc, whole, &err), 1);
        assert_null(w->block_scale);
        for (int64_t i = 0; i < w->rows; i++)
            if (w->scale[i] != whole[s->split == RP_TP_SPLIT_COLS ? i : s->start + i])
                fail_msg("%s: row %lld's scale %g", what, (long long)i, (double)w->scale[i]);
    }
    free(whole);
}

/* Each matrix kind of config c (mats: the kinds) as e4m3 with a scale in
 * `lay`, every rank's slice against rp_quant_dequant of the whole tensor,
 * with the bytes and scales it keeps (check_kept), at N = 1, 2, 4. */
static void run_fp8_model(layout lay, int block, rp_model_config c, const rp_weight_kind *mats, int nm) {
    rp_quant_config q = {0};
    q.method = lay == L_CHANNEL ? RP_QUANT_FP8_CT : RP_QUANT_FP8;
    if (lay == L_BLOCK) q.block[0] = q.block[1] = block;
    snprintf(q.desc, sizeof q.desc, "test fp8");
    enum { NM = 8 };
    assert_true(nm <= NM);
    builder b = {0};
    char names[NM][2][32];
    for (int k = 0; k < nm; k++) {
        int64_t sh[2];
        rp_weight_shape(&c, mats[k], sh);
        uint8_t *w = malloc((size_t)(sh[0] * sh[1]));
        for (int64_t i = 0; i < sh[0] * sh[1]; i++) {
            w[i] = (uint8_t)(rnd() & 0xff);
            if ((w[i] & 0x7f) == 0x7f) w[i] ^= 1; /* not NaN */
        }
        int64_t s0 = 1, s1 = 1;
        int sdim = 1;
        if (lay == L_BLOCK) s0 = (sh[0] + block - 1) / block, s1 = (sh[1] + block - 1) / block, sdim = 2;
        if (lay == L_CHANNEL) s0 = sh[0], s1 = 1, sdim = 2;
        float *sc = malloc((size_t)(s0 * s1) * 4);
        for (int64_t i = 0; i < s0 * s1; i++) sc[i] = (float)(1 + rnd() % 64) / 256.0f;
        snprintf(names[k][0], 32, "%s", rp_weight_kind_name(mats[k]));
        rp_quant_scale_name(&q, names[k][0], names[k][1], 32);
        add(&b, names[k][0], "F8_E4M3", 2, sh[0], sh[1], w, (size_t)(sh[0] * sh[1]));
        add(&b, names[k][1], "F32", sdim, s0, s1, sc, (size_t)(s0 * s1) * 4);
    }
    size_t len;
    char *file = build(&b, &len);
    rp_err err;
    rp_safetensors *st = rp_safetensors_parse(file, len, &err);
    if (!st) fail_msg("%s", err.msg);
    for (int k = 0; k < nm; k++) {
        const rp_st_tensor *t = rp_safetensors_find(st, names[k][0]), *sc = rp_safetensors_find(st, names[k][1]);
        uint16_t *whole = malloc((size_t)(t->shape[0] * t->shape[1]) * 2);
        if (rp_quant_dequant(&q, names[k][0], t, t->shape[0], t->shape[1], sc, whole, &err)) fail_msg("%s", err.msg);
        for (int n = 1; n <= 4; n *= 2) {
            rp_tp_plan p;
            assert_int_equal(rp_tp_plan_make(&p, &c, n, &err), 0);
            uint16_t *joined = calloc((size_t)(t->shape[0] * t->shape[1]), 2);
            for (int r = 0; r < n; r++) {
                rp_tp_slice s;
                rp_tp_weight w;
                rp_tp_weight_slice(&p, mats[k], r, &s);
                if (rp_tp_slice_load(&s, names[k][0], t, sc, &q, &w, &err))
                    fail_msg("fp8 layout %d %s N=%d rank %d: %s", lay, names[k][0], n, r, err.msg);
                char what[512];
                snprintf(what, sizeof what, "fp8 layout %d %s N=%d rank %d", lay, names[k][0], n, r);
                check_slice(&s, &w, whole, joined, what);
                check_kept(&q, &s, t, sc, &w, what);
                rp_tp_weight_release(&w);
            }
            if (memcmp(joined, whole, (size_t)(t->shape[0] * t->shape[1]) * 2))
                fail_msg("fp8 %s N=%d: the slices together are not the whole tensor", names[k][0], n);
            free(joined);
        }
        free(whole);
    }
    rp_safetensors_close(st);
    free(file);
    for (int i = 0; i < b.n; i++) free(b.data[i]);
}

static void run_fp8(layout lay, int block) {
    static const rp_weight_kind mats[] = {RP_W_EMBED, RP_W_Q, RP_W_K, RP_W_O, RP_W_GATE, RP_W_DOWN};
    run_fp8_model(lay, block, small_config(), mats, (int)(sizeof mats / sizeof mats[0]));
}

/* 128 x 128 blocks (the official FP8 layout, the one whose bytes are
 * kept): heads of 128 and an MLP of 512, so every rank's share is whole
 * blocks at N = 1, 2, 4 (the KV heads replicated at 4). */
static void test_fp8_block128(void **state) {
    (void)state;
    rp_model_config c = small_config();
    c.head_dim = 128, c.hidden_size = 256, c.intermediate_size = 512;
    static const rp_weight_kind mats[] = {RP_W_Q, RP_W_K, RP_W_V, RP_W_O, RP_W_GATE, RP_W_UP, RP_W_DOWN};
    run_fp8_model(L_BLOCK, 128, c, mats, (int)(sizeof mats / sizeof mats[0]));
}

static void test_fp8_block(void **state) {
    (void)state;
    run_fp8(L_BLOCK, 4); /* every rank's share of these shapes is whole 4x4 blocks */
}
static void test_fp8_tensor(void **state) {
    (void)state;
    run_fp8(L_TENSOR, 0);
}
static void test_fp8_channel(void **state) {
    (void)state;
    run_fp8(L_CHANNEL, 0);
}

/* down_proj [32, 48] at N = 4: each rank's 12 columns start inside an 8x8
 * block (rank 1 at column 12); refused with the numbers. An F8_E4M3 tensor
 * without quantization_config or without its scale, likewise. */
static void test_fp8_refused(void **state) {
    (void)state;
    rp_model_config c = small_config();
    rp_quant_config q = {.method = RP_QUANT_FP8, .block = {8, 8}};
    snprintf(q.desc, sizeof q.desc, "fp8 e4m3, 8x8 blocks");
    static uint8_t w[32 * 48];
    static float sc[4 * 6];
    for (int i = 0; i < 4 * 6; i++) sc[i] = 1.0f;
    builder b = {0};
    add(&b, "down", "F8_E4M3", 2, 32, 48, w, sizeof w);
    add(&b, "down_scale_inv", "F32", 2, 4, 6, sc, sizeof sc);
    size_t len;
    char *file = build(&b, &len);
    rp_err err;
    rp_safetensors *st = rp_safetensors_parse(file, len, &err);
    assert_non_null(st);
    rp_tp_plan p;
    assert_int_equal(rp_tp_plan_make(&p, &c, 4, &err), 0);
    rp_tp_slice s;
    rp_tp_weight wt;
    const rp_st_tensor *t = rp_safetensors_find(st, "down"), *s_t = rp_safetensors_find(st, "down_scale_inv");
    rp_tp_weight_slice(&p, RP_W_DOWN, 1, &s);
    assert_int_equal(rp_tp_slice_load(&s, "down", t, s_t, &q, &wt, &err), RP_ERR);
    if (!strstr(err.msg, "columns start at 12, inside a 8x8 scale block")) fail_msg("message: %s", err.msg);
    assert_null(wt.owned);
    rp_tp_weight_slice(&p, RP_W_DOWN, 0, &s); /* rank 0 starts at 0: fine */
    assert_int_equal(rp_tp_slice_load(&s, "down", t, s_t, &q, &wt, &err), 0);
    rp_tp_weight_release(&wt);
    assert_int_equal(rp_tp_slice_load(&s, "down", t, NULL, &q, &wt, &err), RP_ERR);
    assert_non_null(strstr(err.msg, "its scale is not in the checkpoint"));
    rp_quant_config none = {0};
    assert_int_equal(rp_tp_slice_load(&s, "down", t, s_t, &none, &wt, &err), RP_ERR);
    assert_non_null(strstr(err.msg, "no quantization_config"));
    /* a scale of a shape no layout explains */
    q.block[0] = q.block[1] = 16;
    assert_int_equal(rp_tp_slice_load(&s, "down", t, s_t, &q, &wt, &err), RP_ERR);
    assert_non_null(strstr(err.msg, "does not explain"));
    rp_safetensors_close(st);
    free(file);
}

/* A tensor whose shape is not the plan's is an error, not a wrong slice. */
static void test_shape_mismatch(void **state) {
    (void)state;
    rp_model_config c = small_config();
    static uint16_t w[16 * 32];
    builder b = {0};
    add(&b, "q", "BF16", 2, 16, 32, w, sizeof w);
    size_t len;
    char *file = build(&b, &len);
    rp_err err;
    rp_safetensors *st = rp_safetensors_parse(file, len, &err);
    rp_tp_plan p;
    assert_int_equal(rp_tp_plan_make(&p, &c, 2, &err), 0);
    rp_tp_slice s;
    rp_tp_weight wt;
    rp_tp_weight_slice(&p, RP_W_Q, 0, &s);
    assert_int_equal(rp_tp_slice_load(&s, "q", rp_safetensors_find(st, "q"), NULL, NULL, &wt, &err), RP_ERR);
    if (!strstr(err.msg, "[16, 32], the tensor-parallel plan expects [32, 32]")) fail_msg("message: %s", err.msg);
    rp_safetensors_close(st);
    free(file);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16),        cmocka_unit_test(test_f32),         cmocka_unit_test(test_f16),
        cmocka_unit_test(test_mmap_file),   cmocka_unit_test(test_fp8_block),   cmocka_unit_test(test_fp8_tensor),
        cmocka_unit_test(test_fp8_channel), cmocka_unit_test(test_fp8_refused), cmocka_unit_test(test_shape_mismatch),
        cmocka_unit_test(test_fp8_block128),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
