/* safetensors parsing: a valid file round-trips; every mutated or truncated
 * header is rejected with a message or parsed to in-bounds views, never a
 * crash (run under ASan in `make test`). */
#include "model/safetensors.h"
#include "util/rng.h"
#include "test_util.h"

/* Builds a file with two tensors: "a" bf16 [2, 3] and "b" f32 [4]. */
static size_t make_file(uint8_t *buf, size_t cap) {
    const char *hdr = "{\"__metadata__\": {\"format\": \"pt\"}, \"a\": {\"dtype\": \"BF16\", \"shape\": [2, 3], "
                      "\"data_offsets\": [0, 12]}, \"b\": {\"dtype\": \"F32\", \"shape\": [4], "
                      "\"data_offsets\": [12, 28]}}";
    uint64_t hlen = strlen(hdr);
    assert_true(8 + hlen + 28 <= cap);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, hdr, hlen);
    for (int i = 0; i < 28; i++) buf[8 + hlen + i] = (uint8_t)i;
    return 8 + hlen + 28;
}

static void test_valid(void **state) {
    (void)state;
    uint8_t buf[512];
    size_t len = make_file(buf, sizeof buf);
    rp_err err;
    rp_safetensors *st = rp_safetensors_parse(buf, len, &err);
    assert_non_null(st);
    assert_int_equal(st->num_tensors, 2);
    const rp_st_tensor *a = rp_safetensors_find(st, "a"), *b = rp_safetensors_find(st, "b");
    assert_non_null(a);
    assert_non_null(b);
    assert_null(rp_safetensors_find(st, "c"));
    assert_int_equal(a->dtype, RP_DTYPE_BF16);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->nbytes, 12);
    assert_int_equal(b->dtype, RP_DTYPE_F32);
    assert_int_equal(((const uint8_t *)b->data)[0], 12);
    rp_safetensors_close(st);
}

static void expect_reject(const char *hdr, const char *needle) {
    uint8_t buf[1024];
    uint64_t hlen = strlen(hdr);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, hdr, hlen);
    memset(buf + 8 + hlen, 0, 32);
    rp_err err = {0};
    rp_safetensors *st = rp_safetensors_parse(buf, 8 + hlen + 32, &err);
    if (st) fail_msg("accepted: %s", hdr);
    if (!strstr(err.msg, needle)) fail_msg("error \"%s\" lacks \"%s\"", err.msg, needle);
}

static void test_rejects(void **state) {
    (void)state;
    expect_reject("{\"a\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [0, 64]}}", "outside");
    expect_reject("{\"a\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 4]}}", "do not match");
    expect_reject("{\"a\": {\"dtype\": \"Q4\", \"shape\": [2], \"data_offsets\": [0, 4]}}", "unknown dtype");
    expect_reject("{\"a\": {\"dtype\": \"BF16\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", "shape");
    expect_reject("{\"a\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [4, 0]}}", "outside");
    expect_reject("{\"a\": {\"dtype\": \"BF16\", \"shape\": [1,1,1,1,1], \"data_offsets\": [0, 2]}}", "dimensions");
    expect_reject("{\"a\": {\"dtype\": \"BF16\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 2]}}",
                  "shape");
    expect_reject("{\"a\": 5}", "malformed");
    expect_reject("{\"a\": {\"dtype\": \"BF16\"", "JSON");
    expect_reject("[1, 2]", "object");
    rp_err err;
    uint8_t tiny[4] = {0};
    assert_null(rp_safetensors_parse(tiny, sizeof tiny, &err));
    uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_null(rp_safetensors_parse(huge, sizeof huge, &err));
    assert_non_null(strstr(err.msg, "header length"));
    assert_null(rp_safetensors_open("/nonexistent.safetensors", &err));
}

/* Random byte flips and truncations of a valid file: whatever parses must
 * have views inside the buffer. */
static void test_mutations(void **state) {
    (void)state;
    uint8_t orig[512], buf[512];
    size_t len = make_file(orig, sizeof orig);
    int accepted = 0;
    for (uint64_t it = 0; it < 20000; it++) {
        memcpy(buf, orig, len);
        size_t n = len;
        int flips = 1 + (int)(rp_rand_u64(7, it, 0) % 4);
        for (int f = 0; f < flips; f++) {
            size_t pos = rp_rand_u64(7, it, 1 + (uint64_t)f) % len;
            buf[pos] = (uint8_t)rp_rand_u64(7, it, 100 + (uint64_t)f);
        }
        if (rp_rand_u64(7, it, 999) % 4 == 0) n = rp_rand_u64(7, it, 1000) % len;
        /* copy to an exact-size heap block so ASan sees any over-read */
        uint8_t *heap = malloc(n ? n : 1);
        memcpy(heap, buf, n);
        rp_err err;
        rp_safetensors *st = rp_safetensors_parse(heap, n, &err);
        if (st) {
            accepted++;
            for (int i = 0; i < st->num_tensors; i++) {
                const uint8_t *d = st->tensors[i].data;
                assert_true(d == st->tensors[i].copy || (d >= heap && d + st->tensors[i].nbytes <= heap + n));
            }
            rp_safetensors_close(st);
        }
        free(heap);
    }
    assert_true(accepted > 0); /* flips inside the data section still parse */
}

/* A header of odd length (not padded to 8 bytes as safetensors pads it)
 * puts every tensor at an odd address: each multi-byte tensor is read from
 * an aligned copy with the file's bytes, a byte tensor in place. */
static void test_unaligned(void **state) {
    (void)state;
    const char *hdr = "{\"a\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 6]}, \"q\": {\"dtype\": "
                      "\"F8_E4M3\", \"shape\": [3], \"data_offsets\": [6, 9]}, \"b\": {\"dtype\": \"F32\", \"shape\": "
                      "[2], \"data_offsets\": [9, 17]}}";
    uint64_t hlen = strlen(hdr);
    uint8_t *buf = malloc(8 + hlen + 17);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, hdr, hlen);
    for (int i = 0; i < 17; i++) buf[8 + hlen + i] = (uint8_t)(100 + i);
    rp_err err;
    rp_safetensors *st = rp_safetensors_parse(buf, 8 + hlen + 17, &err);
    if (!st) fail_msg("%s", err.msg);
    const rp_st_tensor *a = rp_safetensors_find(st, "a"), *q = rp_safetensors_find(st, "q"),
                       *b = rp_safetensors_find(st, "b");
    assert_true((8 + hlen) % 2 == 1); /* the test's premise: a is at an odd offset in the buffer */
    assert_non_null(a->copy);
    assert_ptr_equal(a->data, a->copy);
    assert_int_equal((uintptr_t)a->data % 2, 0);
    assert_memory_equal(a->data, buf + 8 + hlen, 6);
    assert_null(q->copy);
    assert_ptr_equal(q->data, buf + 8 + hlen + 6);
    assert_int_equal((uintptr_t)b->data % 4, 0);
    assert_memory_equal(b->data, buf + 8 + hlen + 9, 8);
    rp_safetensors_close(st);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_unaligned),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
