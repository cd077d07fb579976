/* Helpers shared by the tests: fixture paths and whole-file reads. */
#ifndef RP_TEST_UTIL_H
#define RP_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* REPLAY_SOURCE_DIR is set by CTest; running a test binary from the repo
 * root also works. */
static inline const char *test_source_dir(void) {
    const char *d = getenv("REPLAY_SOURCE_DIR");
    return d ? d : ".";
}

static inline void test_path(char *buf, size_t n, const char *rel) {
    snprintf(buf, n, "%s/%s", test_source_dir(), rel);
}

/* REPLAY_TEST_ONLY=PATTERN runs only the tests whose names match it (cmocka's
 * glob: * and ?): one device call can run the one GPU test a change needs. */
static inline void test_filter_from_env(void) {
    const char *f = getenv("REPLAY_TEST_ONLY");
    if (f && *f) cmocka_set_test_filter(f);
}

/* Reads a whole file; fails the test if it cannot. */
static inline void *test_read_file(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    if (len_out) *len_out = (size_t)n;
    return buf;
}

/* ||a - ref|| / ||ref|| in double. */
static inline double test_rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return __builtin_sqrt(num / den);
}

#endif
