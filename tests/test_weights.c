/* Weight loading beyond the bf16 single-file case: f32 and f16 checkpoints
 * (converted to bf16 at load), and clear errors for a missing tensor, a
 * wrong shape and a missing weights file. The files are written by the test
 * from a committed bf16 fixture. Dummy weights: transformers' distribution
 * (normal, std initializer_range; norms 1), deterministic, and bit for bit
 * the values tools/gpu_compare.py computes (the golden table below). */
#include <jansson.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "util/dtype.h"
#include "util/rng.h"
#include "test_util.h"
#include "fp8_checkpoint.h"

static const char *fixture = "tests/fixtures/models/qwen3-tied";

/* IEEE half from float, round to nearest even (normal range suffices for
 * these weights; tiny values flush toward zero). */
static uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffffu;
    if (exp <= 0) return (uint16_t)sign;
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)h;
}

/* Rewrites the fixture's model.safetensors with every tensor in `dtype`
 * (optionally renaming one tensor or changing one shape) into dir. */
static void write_converted(const char *dir, rp_dtype dtype, const char *drop, const char *bad_shape) {
    char src[1024], dst[2400]; /* cp + two paths: -O3 checks the bound */
    test_path(src, sizeof src, fixture);
    mkdir(dir, 0755);
    snprintf(dst, sizeof dst, "cp %s/config.json %s/", src, dir);
    assert_int_equal(system(dst), 0);
    snprintf(src + strlen(src), sizeof src - strlen(src), "/model.safetensors");
    rp_err err;
    rp_safetensors *st = rp_safetensors_open(src, &err);
    assert_non_null(st);
    size_t esize = rp_dtype_size(dtype), data_bytes = 0;
    char *hdr = malloc(1 << 16);
    size_t hl = (size_t)snprintf(hdr, 1 << 16, "{");
    for (int i = 0; i < st->num_tensors; i++) {
        const rp_st_tensor *t = &st->tensors[i];
        size_t n = t->nbytes / 2;
        const char *name = drop && !strcmp(t->name, drop) ? "renamed.weight" : t->name;
        long long d0 = t->shape[0], d1 = t->ndim > 1 ? t->shape[1] : 0;
        if (bad_shape && !strcmp(t->name, bad_shape) && t->ndim == 2) {
            d0 = t->shape[1];
            d1 = t->shape[0];
        }
        const char *dn = dtype == RP_DTYPE_F32 ? "F32" : "F16";
        if (t->ndim == 2)
            hl += (size_t)snprintf(hdr + hl, (1 << 16) - hl, "%s\"%s\": {\"dtype\": \"%s\", \"shape\": [%lld, %lld], "
                                   "\"data_offsets\": [%zu, %zu]}", i ? ", " : "", name, dn, d0, d1, data_bytes,
                                   data_bytes + n * esize);
        else
            hl += (size_t)snprintf(hdr + hl, (1 << 16) - hl, "%s\"%s\": {\"dtype\": \"%s\", \"shape\": [%lld], "
                                   "\"data_offsets\": [%zu, %zu]}", i ? ", " : "", name, dn, d0, data_bytes,
                                   data_bytes + n * esize);
        data_bytes += n * esize;
    }
    hl += (size_t)snprintf(hdr + hl, (1 << 16) - hl, "}");
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    FILE *f = fopen(dst, "wb");
    assert_non_null(f);
    uint64_t len = hl;
    fwrite(&len, 8, 1, f);
    fwrite(hdr, 1, hl, f);
    for (int i = 0; i < st->num_tensors; i++) {
        const rp_st_tensor *t = &st->tensors[i];
        const uint16_t *src16 = t->data;
        for (size_t k = 0; k < t->nbytes / 2; k++) {
            float v = rp_bf16_to_f32(src16[k]);
            if (dtype == RP_DTYPE_F32) {
                fwrite(&v, 4, 1, f);
            } else {
                uint16_t h = f32_to_f16(v);
                fwrite(&h, 2, 1, f);
            }
        }
    }
    fclose(f);
    free(hdr);
    rp_safetensors_close(st);
}


/* ---- FP8 checkpoints (model/quant.c) ------------------------------------ */

/* e4m3 (float8_e4m3fn) from its bits, written apart from the library's:
 * (-1)^s 2^(e - 7) (1 + m / 8), subnormals 2^-6 m / 8. */
static double e4m3_value(uint8_t v) {
    const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    if (e == 15 && m == 7) return NAN;
    const double x = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -x : x;
}

/* The nearest e4m3 code (ties to the even code), clamped to +-448. */
static uint8_t e4m3_of(double x) {
    uint8_t best = 0;
    double bd = INFINITY;
    for (int c = 0; c < 256; c++) {
        const double v = e4m3_value((uint8_t)c);
        if (v != v || ((c & 0x7f) == 0 && c)) continue; /* NaN, -0 */
        const double d = fabs(v - x);
        if (d < bd || (d == bd && !(c & 1))) bd = d, best = (uint8_t)c;
    }
    return best;
}

/* How a test checkpoint stores its scales. */
typedef enum { Q_BLOCK, Q_TENSOR_FP8, Q_CHANNEL_CT, Q_TENSOR_CT } qlayout;

/* The fixture rewritten as an FP8 checkpoint of that layout into dir: every
 * *_proj.weight as F8_E4M3 with its scale (block 16 x 32 for Q_BLOCK: the
 * fixture's 176 and 64 wide matrices end in partial blocks), the rest bf16
 * (the embedding, lm_head and the norms, as the tools leave them).
 * bad: 0, 1 drops the first scale, 2 gives it a wrong shape, 3 leaves
 * quantization_config out. */
static void write_fp8(const char *dir, qlayout lay, int bad) {
    char src[1024], path[1300];
    test_path(src, sizeof src, fixture);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", src);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    assert_non_null(cfg);
    const char *qc[] = {
        "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": [16, 32]}",
        "{\"quant_method\": \"fp8\", \"activation_scheme\": \"static\"}",
        "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", \"ignore\": [\"lm_head\"], "
        "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 8, \"type\": "
        "\"float\", \"strategy\": \"channel\", \"symmetric\": true}, \"input_activations\": {\"num_bits\": 8, "
        "\"type\": \"float\", \"strategy\": \"token\", \"dynamic\": true}}}}",
        "{\"quant_method\": \"compressed-tensors\", \"format\": \"naive-quantized\", \"config_groups\": {\"g\": "
        "{\"weights\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\"}, \"input_activations\": "
        "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\", \"dynamic\": false}}}}"};
    if (bad != 3) json_object_set_new(cfg, "quantization_config", json_loads(qc[lay], 0, &je));
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(json_dump_file(cfg, path, JSON_INDENT(1)), 0);
    json_decref(cfg);
    snprintf(src + strlen(src), sizeof src - strlen(src), "/model.safetensors");
    rp_err err;
    rp_safetensors *st = rp_safetensors_open(src, &err);
    assert_non_null(st);
    /* two passes: the header, then the data in the same order */
    char *hdr = malloc(1 << 17);
    size_t hl = (size_t)snprintf(hdr, 1 << 17, "{"), off = 0;
    FILE *f = NULL;
    int first_scale = 1;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < st->num_tensors; i++) {
            const rp_st_tensor *t = &st->tensors[i];
            const uint16_t *w = t->data;
            const long long r = t->shape[0], c = t->ndim > 1 ? t->shape[1] : 0;
            const int q = t->ndim == 2 && strstr(t->name, "_proj.weight") != NULL;
            if (!q) {
                if (pass == 0) {
                    char shape[64];
                    if (t->ndim > 1) snprintf(shape, sizeof shape, "[%lld, %lld]", r, c);
                    else snprintf(shape, sizeof shape, "[%lld]", r);
                    hl += (size_t)snprintf(hdr + hl, (1 << 17) - hl, "%s\"%s\": {\"dtype\": \"BF16\", \"shape\": %s, "
                                           "\"data_offsets\": [%zu, %zu]}", hl > 1 ? ", " : "", t->name, shape, off,
                                           off + t->nbytes);
                    off += t->nbytes;
                } else {
                    fwrite(t->data, 1, t->nbytes, f);
                }
                continue;
            }
            /* scale grid: rows x cols of blocks b0 x b1 */
            const long long b0 = lay == Q_BLOCK ? 16 : lay == Q_CHANNEL_CT ? 1 : r, b1 = lay == Q_BLOCK ? 32 : c;
            const long long gr = (r + b0 - 1) / b0, gc = (c + b1 - 1) / b1;
            float *sc = calloc((size_t)(gr * gc), 4);
            for (long long i0 = 0; i0 < r; i0++)
                for (long long j = 0; j < c; j++) {
                    float *sv = &sc[(i0 / b0) * gc + j / b1];
                    const float a = fabsf(rp_bf16_to_f32(w[i0 * c + j])) / 448.0f;
                    if (a > *sv) *sv = a;
                }
            for (long long k = 0; k < gr * gc; k++)
                if (sc[k] == 0) sc[k] = 1;
            if (lay == Q_CHANNEL_CT) /* bf16 scales: rounded before they divide */
                for (long long k = 0; k < gr * gc; k++) sc[k] = rp_bf16_to_f32(rp_f32_to_bf16(sc[k]));
            const int sbytes = lay == Q_CHANNEL_CT ? 2 : 4, wrong = bad == 2 && first_scale, drop = bad == 1 && first_scale;
            const long long ns = gr * gc + wrong;
            char shape[64];
            if (wrong) snprintf(shape, sizeof shape, "[%lld]", ns);
            else if (lay == Q_BLOCK) snprintf(shape, sizeof shape, "[%lld, %lld]", gr, gc);
            else if (lay == Q_CHANNEL_CT) snprintf(shape, sizeof shape, "[%lld, 1]", r);
            else if (lay == Q_TENSOR_FP8) snprintf(shape, sizeof shape, "[]");
            else snprintf(shape, sizeof shape, "[1]");
            first_scale = 0;
            if (pass == 0) {
                hl += (size_t)snprintf(hdr + hl, (1 << 17) - hl, "%s\"%s\": {\"dtype\": \"F8_E4M3\", \"shape\": [%lld, %lld], "
                                       "\"data_offsets\": [%zu, %zu]}", hl > 1 ? ", " : "", t->name, r, c, off,
                                       off + (size_t)(r * c));
                off += (size_t)(r * c);
                if (!drop) {
                    const size_t nb = (size_t)ns * (size_t)sbytes;
                    hl += (size_t)snprintf(hdr + hl, (1 << 17) - hl, ", \"%s%s\": {\"dtype\": \"%s\", \"shape\": %s, "
                                           "\"data_offsets\": [%zu, %zu]}", t->name,
                                           lay == Q_BLOCK ? "_scale_inv" : "_scale", sbytes == 2 ? "BF16" : "F32",
                                           shape, off, off + nb);
                    off += nb;
                }
            } else {
                for (long long i0 = 0; i0 < r; i0++)
                    for (long long j = 0; j < c; j++) {
                        const uint8_t by = e4m3_of(rp_bf16_to_f32(w[i0 * c + j]) / sc[(i0 / b0) * gc + j / b1]);
                        fwrite(&by, 1, 1, f);
                    }
                for (long long k = 0; !drop && k < ns; k++) {
                    const float v = k < gr * gc ? sc[k] : 1.0f;
                    if (sbytes == 2) {
                        const uint16_t h = rp_f32_to_bf16(v);
                        fwrite(&h, 2, 1, f);
                    } else {
                        fwrite(&v, 4, 1, f);
                    }
                }
            }
            free(sc);
        }
        if (pass == 0) {
            hl += (size_t)snprintf(hdr + hl, (1 << 17) - hl, "}");
            snprintf(path, sizeof path, "%s/model.safetensors", dir);
            f = fopen(path, "wb");
            assert_non_null(f);
            const uint64_t len = hl;
            fwrite(&len, 8, 1, f);
            fwrite(hdr, 1, hl, f);
            first_scale = 1;
        }
    }
    fclose(f);
    free(hdr);
    rp_safetensors_close(st);
}

static void compare_bf16_exact(const rp_model *a, const rp_model *b, rp_weight_kind k) {
    const rp_weight *wa = rp_model_weight(a, k, 0), *wb = rp_model_weight(b, k, 0);
    assert_int_equal(wa->rows * wa->cols, wb->rows * wb->cols);
    assert_memory_equal(wa->data, wb->data, (size_t)(wa->rows * wa->cols) * 2);
}

static rp_model *load_fixture(void) {
    char dir[1024];
    test_path(dir, sizeof dir, fixture);
    rp_err err;
    rp_load_options lo = {0};
    rp_model *m = rp_model_load(dir, &lo, &err);
    if (!m) fail_msg("%s", err.msg);
    return m;
}

static void compare_weights(const rp_model *a, const rp_model *b, int exact) {
    for (int k = 0; k < RP_W_COUNT; k++) {
        for (int l = 0; l < (k < RP_W_FIRST_LAYER_KIND ? 1 : a->cfg.num_layers); l++) {
            const rp_weight *wa = rp_model_weight(a, (rp_weight_kind)k, l), *wb = rp_model_weight(b, (rp_weight_kind)k, l);
            assert_true((wa->data == NULL) == (wb->data == NULL));
            if (!wa->data) continue;
            assert_int_equal(wa->rows, wb->rows);
            assert_int_equal(wa->cols, wb->cols);
            for (int64_t i = 0; i < wa->rows * wa->cols; i++) {
                float x = rp_bf16_to_f32(wa->data[i]), y = rp_bf16_to_f32(wb->data[i]);
                if (exact) assert_true(x == y);
                else if (fabsf(x - y) > 1e-2f * fabsf(x) + 1e-4f) fail_msg("weight %d/%d[%lld]: %g vs %g", k, l, (long long)i, x, y);
            }
        }
    }
}

static void test_f32_and_f16(void **state) {
    (void)state;
    char dir[] = "/tmp/rp_test_weights_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[1200];
    rp_model *ref = load_fixture();
    rp_err err;
    rp_load_options lo = {0};
    snprintf(sub, sizeof sub, "%s/f32", dir);
    write_converted(sub, RP_DTYPE_F32, NULL, NULL);
    rp_model *m = rp_model_load(sub, &lo, &err);
    if (!m) fail_msg("f32: %s", err.msg);
    compare_weights(ref, m, 1); /* bf16 -> f32 -> bf16 is exact */
    rp_model_free(m);
    snprintf(sub, sizeof sub, "%s/f16", dir);
    write_converted(sub, RP_DTYPE_F16, NULL, NULL);
    m = rp_model_load(sub, &lo, &err);
    if (!m) fail_msg("f16: %s", err.msg);
    compare_weights(ref, m, 0);
    rp_model_free(m);
    rp_model_free(ref);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_errors(void **state) {
    (void)state;
    char dir[] = "/tmp/rp_test_weights_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[1200];
    rp_err err;
    rp_load_options lo = {0};
    snprintf(sub, sizeof sub, "%s/missing", dir);
    write_converted(sub, RP_DTYPE_F32, "model.layers.1.mlp.up_proj.weight", NULL);
    assert_null(rp_model_load(sub, &lo, &err));
    assert_non_null(strstr(err.msg, "model.layers.1.mlp.up_proj.weight"));
    assert_non_null(strstr(err.msg, "not found"));
    snprintf(sub, sizeof sub, "%s/shape", dir);
    write_converted(sub, RP_DTYPE_F32, NULL, "model.layers.0.self_attn.o_proj.weight");
    assert_null(rp_model_load(sub, &lo, &err));
    assert_non_null(strstr(err.msg, "o_proj"));
    assert_non_null(strstr(err.msg, "shape"));
    /* config only: a clear hint at --load-format dummy, and dummy works */
    snprintf(sub, sizeof sub, "%s/shape/model.safetensors", dir);
    assert_int_equal(unlink(sub), 0);
    snprintf(sub, sizeof sub, "%s/shape", dir);
    assert_null(rp_model_load(sub, &lo, &err));
    assert_non_null(strstr(err.msg, "--load-format dummy"));
    lo.format = RP_LOAD_DUMMY;
    rp_model *m = rp_model_load(sub, &lo, &err);
    assert_non_null(m);
    assert_true(m->dummy);
    rp_model_free(m);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* Dummy weights depend only on (seed, weight, index): a lazy model has no
 * data, and two eager ones with the same seed are identical. */
static void test_dummy(void **state) {
    (void)state;
    rp_err err;
    rp_load_options lo = {.seed = 7};
    rp_model *a = rp_model_dummy("tiny-llama3", &lo, &err), *b = rp_model_dummy("tiny-llama3", &lo, &err);
    assert_non_null(a);
    assert_non_null(b);
    compare_weights(a, b, 1);
    lo.lazy_dummy = 1;
    rp_model *c = rp_model_dummy("tiny-llama3", &lo, &err);
    assert_null(rp_model_weight(c, RP_W_Q, 0)->data);
    assert_int_equal(rp_model_weight(c, RP_W_Q, 0)->rows, 80);
    assert_int_equal(c->weight_bytes, a->weight_bytes);
    rp_model_free(a);
    rp_model_free(b);
    rp_model_free(c);
}

/* Norms exactly 1; every other weight normal(0, 0.02): mean ~0, std within
 * 2% (the sample std's own error is ~0.1% at this size), kurtosis ~3 and
 * 68.3% within one std (the old uniform init had 1.8 and 57.7%). */
static void test_dummy_distribution(void **state) {
    (void)state;
    rp_err err;
    rp_load_options lo = {.seed = 3};
    rp_model *m = rp_model_dummy("tiny-qwen3", &lo, &err);
    assert_non_null(m);
    assert_true(m->cfg.initializer_range == 0.02);
    double s1 = 0, s2 = 0, s4 = 0, n = 0, within = 0;
    for (int k = 0; k < RP_W_COUNT; k++) {
        for (int l = 0; l < (k < RP_W_FIRST_LAYER_KIND ? 1 : m->cfg.num_layers); l++) {
            const rp_weight *w = rp_model_weight(m, (rp_weight_kind)k, l);
            if (!w->data) continue;
            int64_t cnt = w->rows * w->cols;
            if (w->cols == 1) { /* a norm */
                for (int64_t i = 0; i < cnt; i++)
                    if (rp_bf16_to_f32(w->data[i]) != 1.0f) fail_msg("norm %d/%d[%lld] is not 1", k, l, (long long)i);
                continue;
            }
            if (k == RP_W_LM_HEAD) continue; /* tied: the embedding again */
            double t1 = 0, t2 = 0;
            for (int64_t i = 0; i < cnt; i++) {
                double x = rp_bf16_to_f32(w->data[i]);
                t1 += x, t2 += x * x, s4 += x * x * x * x, within += fabs(x) < 0.02;
            }
            /* each matrix on its own too: no weight keeps the old scale */
            double sd = sqrt(t2 / cnt - (t1 / cnt) * (t1 / cnt));
            if (cnt > 10000 && fabs(sd / 0.02 - 1) > 0.05) fail_msg("weight %d/%d: std %g", k, l, sd);
            s1 += t1, s2 += t2, n += (double)cnt;
        }
    }
    double mean = s1 / n, var = s2 / n - mean * mean, kurt = s4 / n / (var * var);
    printf("  dummy tiny-qwen3: %.0f values, mean %.2e, std %.5f, kurtosis %.3f, within 1 std %.4f\n", n, mean,
           sqrt(var), kurt, within / n);
    assert_true(fabs(mean) < 5 * 0.02 / sqrt(n));
    assert_true(fabs(sqrt(var) / 0.02 - 1) < 0.02);
    assert_true(fabs(kurt - 3) < 0.1);
    assert_true(fabs(within / n - 0.6827) < 0.01);
    /* another seed, another model; another layer, other values */
    lo.seed = 4;
    rp_model *o = rp_model_dummy("tiny-qwen3", &lo, &err);
    const rp_weight *a = rp_model_weight(m, RP_W_Q, 0), *b = rp_model_weight(o, RP_W_Q, 0),
                    *c = rp_model_weight(m, RP_W_Q, 1);
    int64_t same_seed = 0, same_layer = 0, cnt = a->rows * a->cols;
    for (int64_t i = 0; i < cnt; i++) same_seed += a->data[i] == b->data[i], same_layer += a->data[i] == c->data[i];
    assert_true(same_seed < cnt / 20); /* bf16 of two normals coincide ~1% of the time */
    assert_true(same_layer < cnt / 20);
    /* a config's initializer_range is the std */
    rp_model_config cfg = m->cfg;
    cfg.initializer_range = 0.5;
    rp_model *big = rp_model_dummy_from_config(&cfg, &lo, &err);
    const rp_weight *e = rp_model_weight(big, RP_W_EMBED, 0);
    double e2 = 0;
    for (int64_t i = 0; i < e->rows * e->cols; i++) e2 += (double)rp_bf16_to_f32(e->data[i]) * rp_bf16_to_f32(e->data[i]);
    assert_true(fabs(sqrt(e2 / (double)(e->rows * e->cols)) / 0.5 - 1) < 0.02);
    rp_model_free(big);
    rp_model_free(o);
    rp_model_free(m);
}

/* Values computed by tools/gpu_compare.py's pure-Python copy of the generator
 * (python3 tools/gpu_compare.py --self-check reads this table): the C
 * generator must give the same double z and bf16(z * 0.02), bit for bit. If
 * this fails after a change to util/rng.h, the C, CUDA and Python copies have
 * parted; if it fails on a new compiler or platform, something fused or
 * reordered the double arithmetic (see rng.h).
 * {seed, stream, element, bits of z, bf16 bits} */
static const uint64_t golden[][5] = {
    /* GOLDEN BEGIN */
    {0x0, 0x0, 0x0, 0x3fffc26ef695a435, 0x3d23},
    {0x0, 0x0, 0x1, 0xbfba69edb676a673, 0xbb07},
    {0x0, 0x61a8d, 0x2, 0xbfe4fef3bd4847fe, 0xbc57},
    {0x0, 0x61a8d, 0x3039, 0x3ff434eb64313c5a, 0x3ccf},
    {0x0, 0x13d66a, 0x200000007, 0x400330b2d4a7bf1a, 0x3d45},
    {0x0, 0x30d46, 0x63, 0xbff0d2c0f1a4b198, 0xbcac},
    {0x7, 0x61a8d, 0x2, 0x3fe1261a935ee409, 0x3c30},
    {0x7, 0x61a8d, 0x3039, 0xbfd28b78ce616a26, 0xbbbe},
    {0x7, 0x13d66a, 0x200000007, 0xbff93568c2c5755f, 0xbd01},
    {0x7, 0x30d46, 0x63, 0xbfdae8f9e947dbad, 0xbc0a},
    {0xdeadbeefcafef00d, 0x0, 0x0, 0xbfd635c811f162b9, 0xbbe3},
    {0xdeadbeefcafef00d, 0x0, 0x1, 0xbff2e1203565bfcd, 0xbcc1},
    {0xdeadbeefcafef00d, 0x61a8d, 0x2, 0xbfdd78746e73ac2c, 0xbc17},
    {0xdeadbeefcafef00d, 0x61a8d, 0x3039, 0xbfd355ef9dbcdcc8, 0xbbc6},
    {0xdeadbeefcafef00d, 0x13d66a, 0x200000007, 0xc00025846964c9d2, 0xbd25},
    {0xdeadbeefcafef00d, 0x30d46, 0x63, 0x3fde6bee4b0870d4, 0x3c1c},
    {0x5, 0xf4272, 0xe, 0xbff2c36ac5e0d365, 0xbcc0},
    {0x5, 0xf4272, 0x26, 0xbfeed0f64d003b84, 0xbc9e},
    /* GOLDEN END */
};

static void test_dummy_golden(void **state) {
    (void)state;
    for (size_t r = 0; r < sizeof golden / sizeof golden[0]; r++) {
        const uint64_t *g = golden[r];
        double z = rp_rand_normal(g[0], g[1], g[2]);
        uint64_t zb;
        memcpy(&zb, &z, 8);
        if (zb != g[3] || rp_dummy_bf16(z, 0.02) != g[4])
            fail_msg("row %zu: z %016llx bf16 %04x, want %016llx %04x", r, (unsigned long long)zb,
                     rp_dummy_bf16(z, 0.02), (unsigned long long)g[3], (unsigned)g[4]);
    }
    /* the generator's model weights are these values */
    rp_err err;
    rp_load_options lo = {.seed = 7};
    rp_model *m = rp_model_dummy("tiny-llama3", &lo, &err);
    const rp_weight *q = rp_model_weight(m, RP_W_Q, 1);
    for (int64_t i = 0; i < q->rows * q->cols; i += 37)
        assert_int_equal(q->data[i], rp_dummy_bf16(rp_rand_normal(7, RP_W_Q * 100003u + 1, (uint64_t)i), 0.02));
    rp_model_free(m);
}

/* The series stand in for libm's log, sin and cos: check they are as
 * accurate as rng.h says (~1e-12), so the distribution is the normal. */
static void test_normal_series(void **state) {
    (void)state;
    double worst_log = 0, worst_trig = 0;
    for (uint64_t k = 0; k < 200000; k++) {
        double u = (double)(int64_t)((rp_rand_u64(1, 2, k) >> 11) + 1) * 0x1p-53;
        if (k < 54) u = ldexp(1.0, -(int)k); /* every binade's edge */
        double want = log(u);
        if (want != 0) worst_log = fmax(worst_log, fabs(rp_normal_log(u) - want) / fabs(want));
        double phi = RP_NORMAL_PI_4 * (double)k / 200000.0, x = phi * phi;
        worst_trig = fmax(worst_trig, fabs(rp_normal_horner(rp_normal_cos_c, RP_NORMAL_COS_TERMS, x) - cos(phi)));
        worst_trig = fmax(worst_trig, fabs(phi * rp_normal_horner(rp_normal_sin_c, RP_NORMAL_SIN_TERMS, x) - sin(phi)));
    }
    printf("  series vs libm: log %.2e relative, sin/cos %.2e absolute\n", worst_log, worst_trig);
    assert_true(worst_log < 1e-11);
    assert_true(worst_trig < 1e-12);
    assert_true(rp_normal_log(1.0) == 0.0);
    /* pair and element agree */
    for (uint64_t p = 0; p < 1000; p++) {
        double z[2];
        rp_rand_normal_pair(9, 10, p, z);
        assert_true(z[0] == rp_rand_normal(9, 10, 2 * p) && z[1] == rp_rand_normal(9, 10, 2 * p + 1));
    }
}


/* The expected weight, computed here: bf16(value(q) * scale) with the
 * scale this layout assigns to (i, j). */
static void check_fp8_model(const rp_model *ref, const rp_model *m, qlayout lay) {
    /* blocks along the row stay dequantized; row scales run as e4m3 on the GPU */
    assert_int_equal(m->fp8, lay != Q_BLOCK);
    if (lay == Q_BLOCK) assert_null(rp_model_weight(m, RP_W_Q, 0)->fp8);
    for (int l = 0; l < ref->cfg.num_layers; l++)
        for (int k = RP_W_FIRST_LAYER_KIND; k < RP_W_COUNT; k++) {
            const rp_weight *wr = rp_model_weight(ref, (rp_weight_kind)k, l), *wm = rp_model_weight(m, (rp_weight_kind)k, l);
            if (!wr->data || wr->cols <= 1) continue; /* norms stay bf16 */
            const long long r = wr->rows, c = wr->cols;
            const long long b0 = lay == Q_BLOCK ? 16 : lay == Q_CHANNEL_CT ? 1 : r, b1 = lay == Q_BLOCK ? 32 : c;
            const long long gc = (c + b1 - 1) / b1;
            double num = 0, den = 0;
            for (long long bi = 0; bi < (r + b0 - 1) / b0; bi++)
                for (long long bj = 0; bj < gc; bj++) {
                    float s = 0;
                    for (long long i = bi * b0; i < (bi + 1) * b0 && i < r; i++)
                        for (long long j = bj * b1; j < (bj + 1) * b1 && j < c; j++)
                            s = fmaxf(s, fabsf(rp_bf16_to_f32(wr->data[i * c + j])) / 448.0f);
                    if (s == 0) s = 1;
                    if (lay == Q_CHANNEL_CT) s = rp_bf16_to_f32(rp_f32_to_bf16(s));
                    for (long long i = bi * b0; i < (bi + 1) * b0 && i < r; i++)
                        for (long long j = bj * b1; j < (bj + 1) * b1 && j < c; j++) {
                            const float x = rp_bf16_to_f32(wr->data[i * c + j]);
                            const float want = rp_bf16_to_f32(rp_f32_to_bf16((float)(e4m3_value(e4m3_of(x / s)) * s)));
                            const float got = rp_bf16_to_f32(wm->data[i * c + j]);
                            if (got != want)
                                fail_msg("layout %d, weight %d/%d [%lld, %lld]: %g, want %g (from %g)", lay, k, l, i, j, got,
                                         want, x);
                            /* per-tensor and per-channel: the file's byte and the row's scale kept for the GPU */
                            if (lay != Q_BLOCK && (wm->fp8[i * c + j] != e4m3_of(x / s) || wm->scale[i] != s))
                                fail_msg("layout %d, weight %d/%d [%lld, %lld]: byte 0x%02x scale %g, want 0x%02x %g", lay, k,
                                         l, i, j, wm->fp8[i * c + j], wm->scale[i], e4m3_of(x / s), s);
                            num += (double)(got - x) * (got - x), den += (double)x * x;
                        }
                }
            /* and fp8's error, about 2^-4 relative at worst */
            if (!(sqrt(num / den) < 0.05)) fail_msg("layout %d weight %d/%d: rel L2 %.3g from bf16", lay, k, l, sqrt(num / den));
        }
}

static void test_fp8(void **state) {
    (void)state;
    /* the e4m3 table at its landmarks */
    assert_true(rp_f8e4m3_to_f32(0x00) == 0.0f && rp_f8e4m3_to_f32(0x38) == 1.0f && rp_f8e4m3_to_f32(0xb8) == -1.0f);
    assert_true(rp_f8e4m3_to_f32(0x7e) == 448.0f && rp_f8e4m3_to_f32(0x01) == ldexpf(1, -9));
    assert_true(rp_f8e4m3_to_f32(0x08) == ldexpf(1, -6) && rp_f8e4m3_to_f32(0x07) == 7 * ldexpf(1, -9));
    assert_true(isnan(rp_f8e4m3_to_f32(0x7f)) && isnan(rp_f8e4m3_to_f32(0xff)));
    for (int v = 0; v < 256; v++)
        if (!isnan(e4m3_value((uint8_t)v))) assert_true(rp_f8e4m3_to_f32((uint8_t)v) == (float)e4m3_value((uint8_t)v));
    char dir[] = "/tmp/rp_test_weights_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[1200];
    rp_model *ref = load_fixture();
    rp_err err;
    rp_load_options lo = {0};
    static const char *names[] = {"block", "tensor-fp8", "channel-ct", "tensor-ct"};
    for (int lay = Q_BLOCK; lay <= Q_TENSOR_CT; lay++) {
        snprintf(sub, sizeof sub, "%s/%s", dir, names[lay]);
        write_fp8(sub, (qlayout)lay, 0);
        rp_model *m = rp_model_load(sub, &lo, &err);
        if (!m) fail_msg("%s: %s", names[lay], err.msg);
        assert_int_equal(m->cfg.quant.method, lay <= Q_TENSOR_FP8 ? RP_QUANT_FP8 : RP_QUANT_FP8_CT);
        check_fp8_model(ref, m, (qlayout)lay);
        /* held as e4m3: a byte an element and a scale a row for each layer matrix */
        uint64_t held = ref->weight_bytes;
        for (int l = 0; lay != Q_BLOCK && l < ref->cfg.num_layers; l++)
            for (int k = RP_W_FIRST_LAYER_KIND; k < RP_W_COUNT; k++) {
                const rp_weight *w = rp_model_weight(ref, (rp_weight_kind)k, l);
                if (w->data && rp_weight_kind_is_layer_matrix((rp_weight_kind)k))
                    held -= (uint64_t)(w->rows * w->cols) - (uint64_t)w->rows * sizeof(float);
            }
        assert_int_equal(m->weight_bytes, held);
        /* the embedding (and the tied lm_head) stay as they were */
        compare_bf16_exact(ref, m, RP_W_EMBED);
        rp_model_free(m);
    }
    /* a missing scale, a scale of the wrong shape, no quantization_config */
    const char *want[] = {"", "not in the checkpoint", "does not explain", "no quantization_config"};
    for (int bad = 1; bad <= 3; bad++) {
        snprintf(sub, sizeof sub, "%s/bad%d", dir, bad);
        write_fp8(sub, bad == 2 ? Q_CHANNEL_CT : Q_BLOCK, bad);
        assert_null(rp_model_load(sub, &lo, &err));
        if (!strstr(err.msg, want[bad]) || !strstr(err.msg, "proj.weight")) fail_msg("bad %d: %s", bad, err.msg);
    }
    rp_model_free(ref);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* The nearest e4m3 code to x >= 0 by search over the table (ties to the
 * even code), saturating at 448: the reference for rp_f32_to_f8e4m3. */
static uint8_t e4m3_nearest(double x) {
    if (x >= 448.0) return 0x7e;
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        const double d = fabs(e4m3_value((uint8_t)c) - x), db = fabs(e4m3_value((uint8_t)best) - x);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return (uint8_t)best;
}

/* fp32 -> e4m3: every code round-trips; halfway points go to the even
 * code, points beside them to the nearer; saturation; random values agree
 * with the search. */
static void test_f8_encode(void **state) {
    (void)state;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue;
        assert_int_equal(rp_f32_to_f8e4m3(rp_f8e4m3_to_f32((uint8_t)c)), c);
    }
    for (int c = 0; c < 0x7e; c++) {
        const float lo = rp_f8e4m3_to_f32((uint8_t)c), hi = rp_f8e4m3_to_f32((uint8_t)(c + 1));
        const float mid = (lo + hi) / 2; /* exact in fp32 */
        assert_int_equal(rp_f32_to_f8e4m3(mid), (c & 1) ? c + 1 : c);
        assert_int_equal(rp_f32_to_f8e4m3(nextafterf(mid, 0.0f)), c);
        assert_int_equal(rp_f32_to_f8e4m3(nextafterf(mid, 1000.0f)), c + 1);
        assert_int_equal(rp_f32_to_f8e4m3(-mid), 0x80 | ((c & 1) ? c + 1 : c));
    }
    assert_int_equal(rp_f32_to_f8e4m3(449.0f), 0x7e);
    assert_int_equal(rp_f32_to_f8e4m3(1e30f), 0x7e);
    assert_int_equal(rp_f32_to_f8e4m3(-INFINITY), 0xfe);
    assert_int_equal(rp_f32_to_f8e4m3(NAN) & 0x7f, 0x7f);
    uint64_t r = 88172645463325252ull;
    for (int i = 0; i < 20000; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const float x = ldexpf((float)(r >> 40) / (float)(1u << 24), (int)(r % 28) - 18); /* 2^-18 .. 2^10 */
        assert_int_equal(rp_f32_to_f8e4m3(x), e4m3_nearest(x));
    }
}

/* --quantization fp8's rows: the scale is max|w| / 448, every byte the
 * nearest code to w / scale, the largest element at +-448, deq their
 * product in bf16; a zero row has scale 1 and zero bytes. */
static void test_quant_rows(void **state) {
    (void)state;
    enum { ROWS = 6, COLS = 200 };
    uint16_t w[ROWS * COLS], deq[ROWS * COLS];
    uint8_t q[ROWS * COLS];
    float scale[ROWS];
    uint64_t r = 1234567;
    for (int i = 0; i < ROWS * COLS; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const double z = ((double)(r >> 11) / 9007199254740992.0 - 0.5) * ldexp(1, (int)(i / COLS) * 3 - 8);
        w[i] = i / COLS == 2 ? 0 : rp_f32_to_bf16((float)z);
    }
    rp_quant_fp8_rows(w, ROWS, COLS, q, scale, deq);
    for (int row = 0; row < ROWS; row++) {
        float amax = 0;
        for (int c = 0; c < COLS; c++) amax = fmaxf(amax, fabsf(rp_bf16_to_f32(w[row * COLS + c])));
        assert_true(scale[row] == (amax > 0 ? amax / 448.0f : 1.0f));
        int saw_max = 0;
        for (int c = 0; c < COLS; c++) {
            const int i = row * COLS + c;
            const float x = rp_bf16_to_f32(w[i]) / scale[row];
            const uint8_t want = (uint8_t)((x < 0 ? 0x80 : 0) | e4m3_nearest(fabs((double)x)));
            if (q[i] != want && !(x == 0 && (q[i] & 0x7f) == 0)) fail_msg("row %d col %d: %02x, want %02x", row, c, q[i], want);
            saw_max |= (q[i] & 0x7f) == 0x7e;
            assert_int_equal(deq[i], rp_f32_to_bf16(rp_f8e4m3_to_f32(q[i]) * scale[row]));
        }
        assert_int_equal(saw_max, amax > 0);
    }
}

/* A model loaded with --quantization fp8: each layer matrix has its bytes,
 * scales and dequantized values, the rest is untouched, weight_bytes
 * counts a byte an element; lazy dummy weights only carry the flag; an FP8
 * checkpoint is refused. */
static void test_quantize_model(void **state) {
    (void)state;
    rp_err err;
    rp_load_options lo = {.seed = 3};
    rp_model *a = rp_model_dummy("tiny-llama3", &lo, &err);
    lo.quantize_fp8 = 1;
    rp_model *b = rp_model_dummy("tiny-llama3", &lo, &err);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(b->fp8, 1);
    uint64_t saved = 0;
    for (int l = 0; l < a->cfg.num_layers; l++)
        for (int k = RP_W_FIRST_LAYER_KIND; k < RP_W_COUNT; k++) {
            const rp_weight *wa = rp_model_weight(a, (rp_weight_kind)k, l), *wb = rp_model_weight(b, (rp_weight_kind)k, l);
            if (!wa->data) continue;
            const size_t n = (size_t)(wa->rows * wa->cols);
            if (!rp_weight_kind_is_layer_matrix((rp_weight_kind)k)) {
                assert_null(wb->fp8);
                assert_memory_equal(wa->data, wb->data, n * 2);
                continue;
            }
            assert_non_null(wb->fp8);
            assert_non_null(wb->scale);
            saved += n - (uint64_t)wa->rows * 4;
            uint8_t *q = malloc(n);
            uint16_t *deq = malloc(n * 2);
            float *sc = malloc((size_t)wa->rows * sizeof(float));
            rp_quant_fp8_rows(wa->data, wa->rows, wa->cols, q, sc, deq);
            assert_memory_equal(q, wb->fp8, n);
            assert_memory_equal(sc, wb->scale, (size_t)wa->rows * sizeof(float));
            assert_memory_equal(deq, wb->data, n * 2);
            free(q);
            free(deq);
            free(sc);
        }
    assert_int_equal(b->weight_bytes, a->weight_bytes - saved);
    assert_null(rp_model_weight(b, RP_W_EMBED, 0)->fp8);
    lo.lazy_dummy = 1;
    rp_model *c = rp_model_dummy("tiny-llama3", &lo, &err);
    assert_non_null(c);
    assert_true(c->fp8 && !rp_model_weight(c, RP_W_Q, 0)->data && !rp_model_weight(c, RP_W_Q, 0)->fp8);
    assert_int_equal(c->weight_bytes, b->weight_bytes);
    rp_model_free(a);
    rp_model_free(b);
    rp_model_free(c);
    /* an FP8 checkpoint */
    char dir[] = "/tmp/rp_test_weights_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/block", dir);
    write_fp8(sub, Q_BLOCK, 0);
    rp_load_options q8 = {.quantize_fp8 = 1};
    assert_null(rp_model_load(sub, &q8, &err));
    if (!strstr(err.msg, "already quantized")) fail_msg("%s", err.msg);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* A shape whose q, k, v, gate and up rows are whole 128-row blocks (the
 * GPU stacks their grids) and whose hidden size (320) ends in a partial
 * 128-column block. */
static rp_model_config block_config(void) {
    rp_model_config c;
    rp_err err;
    if (rp_config_preset(&c, "tiny-qwen3", &err)) fail_msg("%s", err.msg);
    c.head_dim = 128, c.hidden_size = 320, c.num_heads = 2, c.num_kv_heads = 1, c.intermediate_size = 384;
    c.num_layers = 2, c.vocab_size = 300;
    return c;
}

/* Per 128 x 128 block, computed here: the scale is the block's max|w| /
 * 448 (1 for zeros), each byte the nearest code to w / scale, deq their
 * product in bf16; partial blocks at the right and bottom edges. */
static void test_quant_blocks(void **state) {
    (void)state;
    enum { ROWS = 200, COLS = 300, GR = 2, GC = 3 };
    uint16_t *w = malloc(ROWS * COLS * 2), *deq = malloc(ROWS * COLS * 2);
    uint8_t *q = malloc(ROWS * COLS);
    float grid[GR * GC];
    uint64_t r = 7654321;
    for (int i = 0; i < ROWS * COLS; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        const int row = i / COLS, col = i % COLS;
        const double z = ((double)(r >> 11) / 9007199254740992.0 - 0.5) * ldexp(1, (row / 128 + col / 128) * 3 - 6);
        w[i] = row >= 128 && col >= 256 ? 0 : rp_f32_to_bf16((float)z); /* one block of zeros */
    }
    rp_quant_fp8_blocks(w, ROWS, COLS, q, grid, deq);
    for (int bi = 0; bi < GR; bi++)
        for (int bj = 0; bj < GC; bj++) {
            float amax = 0;
            for (int i = bi * 128; i < ROWS && i < (bi + 1) * 128; i++)
                for (int j = bj * 128; j < COLS && j < (bj + 1) * 128; j++)
                    amax = fmaxf(amax, fabsf(rp_bf16_to_f32(w[i * COLS + j])));
            const float s = amax > 0 ? amax / 448.0f : 1.0f;
            if (grid[bi * GC + bj] != s) fail_msg("block (%d, %d): scale %g, want %g", bi, bj, grid[bi * GC + bj], s);
            for (int i = bi * 128; i < ROWS && i < (bi + 1) * 128; i++)
                for (int j = bj * 128; j < COLS && j < (bj + 1) * 128; j++) {
                    const int k = i * COLS + j;
                    const float x = rp_bf16_to_f32(w[k]) / s;
                    const uint8_t want = (uint8_t)((x < 0 ? 0x80 : 0) | e4m3_nearest(fabs((double)x)));
                    if (q[k] != want && !(x == 0 && (q[k] & 0x7f) == 0)) fail_msg("[%d, %d]: %02x, want %02x", i, j, q[k], want);
                    assert_int_equal(deq[k], rp_f32_to_bf16((float)e4m3_value(q[k]) * s));
                }
        }
    free(w);
    free(deq);
    free(q);
}

/* RP_FP8_BLOCKS: dummy weights quantized per block hold the bytes, the
 * grid and the dequantized values rp_quant_fp8_blocks makes; a shape whose
 * stacked parts are not whole blocks is refused; an official-style
 * checkpoint of the same model loads as the same bytes, grids and CPU
 * values (weight_bytes a byte an element and a float a block); its grids of
 * the wrong shape, with NaN or a negative scale are refused naming the
 * tensor; a checkpoint whose k rows are not a whole block stays
 * dequantized. */
static void test_fp8_blocks(void **state) {
    (void)state;
    rp_err err;
    rp_load_options lo = {.seed = 5, .quantize_fp8 = RP_FP8_BLOCKS};
    assert_null(rp_model_dummy("tiny-qwen3", &lo, &err));
    if (!strstr(err.msg, "128-row blocks")) fail_msg("%s", err.msg);
    const rp_model_config cfg = block_config();
    rp_model *q = rp_model_dummy_from_config(&cfg, &lo, &err);
    lo.quantize_fp8 = RP_FP8_NONE;
    rp_model *a = rp_model_dummy_from_config(&cfg, &lo, &err);
    assert_non_null(q);
    assert_non_null(a);
    assert_int_equal(q->fp8, RP_FP8_BLOCKS);
    uint64_t held = a->weight_bytes;
    for (int l = 0; l < cfg.num_layers; l++)
        for (int k = RP_W_FIRST_LAYER_KIND; k < RP_W_COUNT; k++) {
            const rp_weight *wa = rp_model_weight(a, (rp_weight_kind)k, l), *wq = rp_model_weight(q, (rp_weight_kind)k, l);
            if (!wa->data || !rp_weight_kind_is_layer_matrix((rp_weight_kind)k)) continue;
            const size_t n = (size_t)(wa->rows * wa->cols), ng = (size_t)((wa->rows + 127) / 128 * ((wa->cols + 127) / 128));
            assert_non_null(wq->fp8);
            assert_non_null(wq->block_scale);
            assert_null(wq->scale);
            uint8_t *b = malloc(n);
            uint16_t *deq = malloc(n * 2);
            float *grid = malloc(ng * 4);
            rp_quant_fp8_blocks(wa->data, wa->rows, wa->cols, b, grid, deq);
            assert_memory_equal(b, wq->fp8, n);
            assert_memory_equal(grid, wq->block_scale, ng * 4);
            assert_memory_equal(deq, wq->data, n * 2);
            held -= n - ng * 4;
            free(b);
            free(deq);
            free(grid);
        }
    assert_int_equal(q->weight_bytes, held);
    char dir[] = "/tmp/rp_test_weights_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/good", dir);
    write_fp8_checkpoint_bad(sub, q, 0);
    rp_load_options plain = {0};
    rp_model *m = rp_model_load(sub, &plain, &err);
    if (!m) fail_msg("%s", err.msg);
    assert_int_equal(m->fp8, RP_FP8_BLOCKS);
    assert_int_equal(m->weight_bytes, q->weight_bytes);
    for (int k = 0; k < RP_W_COUNT; k++)
        for (int l = 0; l < (k < RP_W_FIRST_LAYER_KIND ? 1 : cfg.num_layers); l++) {
            const rp_weight *wq = rp_model_weight(q, (rp_weight_kind)k, l), *wm = rp_model_weight(m, (rp_weight_kind)k, l);
            if (!wq->data) continue;
            const size_t n = (size_t)(wq->rows * wq->cols);
            assert_memory_equal(wq->data, wm->data, n * 2); /* the CPU's values: the quantizer's dequantized ones */
            assert_true((wq->fp8 == NULL) == (wm->fp8 == NULL));
            if (!wq->fp8) continue;
            assert_memory_equal(wq->fp8, wm->fp8, n);
            assert_memory_equal(wq->block_scale, wm->block_scale, (size_t)((wq->rows + 127) / 128 * ((wq->cols + 127) / 128)) * 4);
            assert_null(wm->scale);
        }
    rp_model_free(m);
    const char *want[] = {"", "does not explain", "negative, infinite or NaN", "negative, infinite or NaN"};
    for (int bad = 1; bad <= 3; bad++) {
        snprintf(sub, sizeof sub, "%s/bad%d", dir, bad);
        write_fp8_checkpoint_bad(sub, q, bad);
        assert_null(rp_model_load(sub, &plain, &err));
        if (!strstr(err.msg, want[bad]) || !strstr(err.msg, "proj.weight"))
            fail_msg("bad %d: %s", bad, err.msg);
    }
    rp_model_free(q);
    rp_model_free(a);
    /* k's 64 rows: quantized here (the loader's option refuses the shape),
     * written, and loaded dequantized */
    rp_model_config odd = block_config();
    odd.head_dim = 64, odd.num_heads = 4;
    a = rp_model_dummy_from_config(&odd, &lo, &err);
    assert_non_null(a);
    void *keep[3 * 7 * 2];
    int nkeep = 0;
    for (int l = 0; l < odd.num_layers; l++)
        for (int k = RP_W_FIRST_LAYER_KIND; k < RP_W_COUNT; k++) {
            rp_weight *w = (rp_weight *)rp_model_weight(a, (rp_weight_kind)k, l);
            if (!w->data || !rp_weight_kind_is_layer_matrix((rp_weight_kind)k)) continue;
            const size_t n = (size_t)(w->rows * w->cols), ng = (size_t)((w->rows + 127) / 128 * ((w->cols + 127) / 128));
            uint8_t *b = malloc(n);
            float *grid = malloc(ng * 4);
            uint16_t *deq = malloc(n * 2);
            rp_quant_fp8_blocks(w->data, w->rows, w->cols, b, grid, deq);
            free(deq);
            w->fp8 = b, w->block_scale = grid;
            keep[nkeep++] = b, keep[nkeep++] = grid;
        }
    snprintf(sub, sizeof sub, "%s/odd", dir);
    write_fp8_checkpoint_bad(sub, a, 0);
    m = rp_model_load(sub, &plain, &err);
    if (!m) fail_msg("%s", err.msg);
    assert_int_equal(m->fp8, RP_FP8_NONE);
    assert_null(rp_model_weight(m, RP_W_Q, 0)->fp8);
    assert_null(rp_model_weight(m, RP_W_Q, 0)->block_scale);
    rp_model_free(m);
    for (int i = 0; i < nkeep; i++) free(keep[i]);
    rp_model_free(a);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* quantization_config that replay refuses, each with the reason named */
static void test_quant_config_errors(void **state) {
    (void)state;
    static const struct {
        const char *q, *want;
    } cases[] = {
        {"{\"quant_method\": \"awq\", \"bits\": 4}", "quant_method \"awq\""},
        {"{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}", "e5m2"},
        {"{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}", "weight_block_size"},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", \"config_groups\": {}}",
         "pack-quantized"},
        {"{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"g\": {\"weights\": {\"num_bits\": 4, "
         "\"type\": \"int\", \"strategy\": \"group\"}}}}", "4-bit int"},
        {"{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"g\": {\"weights\": {\"num_bits\": 8, "
         "\"type\": \"float\", \"strategy\": \"group\"}}}}", "strategy \"group\""},
    };
    char base[1024], path[1300];
    test_path(base, sizeof base, fixture);
    snprintf(path, sizeof path, "%s/config.json", base);
    json_error_t je;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *cfg = json_load_file(path, 0, &je);
        assert_non_null(cfg);
        json_object_set_new(cfg, "quantization_config", json_loads(cases[i].q, 0, &je));
        char *text = json_dumps(cfg, 0);
        rp_model_config c;
        rp_err err;
        assert_int_not_equal(rp_config_parse(&c, text, NULL, &err), 0);
        if (!strstr(err.msg, cases[i].want)) fail_msg("case %zu: \"%s\" does not name %s", i, err.msg, cases[i].want);
        free(text);
        json_decref(cfg);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_and_f16),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_quant_config_errors),
        cmocka_unit_test(test_f8_encode),
        cmocka_unit_test(test_quant_rows),
        cmocka_unit_test(test_quantize_model),
        cmocka_unit_test(test_quant_blocks),
        cmocka_unit_test(test_fp8_blocks),
        cmocka_unit_test(test_dummy),
        cmocka_unit_test(test_dummy_distribution),
        cmocka_unit_test(test_dummy_golden),
        cmocka_unit_test(test_normal_series),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
