/* Weight loading beyond the bf16 single-file case: f32 and f16 checkpoints
 * (converted to bf16 at load), and clear errors for a missing tensor, a
 * wrong shape and a missing weights file. The files are written by the test
 * from a committed bf16 fixture. */
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "model/safetensors.h"
#include "util/dtype.h"
#include "test_util.h"

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_and_f16),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_dummy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
