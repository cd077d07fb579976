/* Tests for the benchmark workloads' lengths (src/cli/bench_workload.c):
 * uniform draws exactly as before the lognormal was added (the values below
 * were printed by the code before it), and the lognormal's shape over many
 * draws: its mean the requested one, its median below it (the long tail),
 * the spread of ln(length) the requested sigma, every length in [1, cap],
 * and the same lengths from the same seed. */
#include "test_util.h"

#include <math.h>

#include "cli/bench_workload.h"
#include "cli/cli.h"

#define DRAWS 20000

/* bench offline's random workload: streams 1, 2, 3 */
static rp_bench_workload offline_workload(void) {
    return (rp_bench_workload){.num_prompts = DRAWS, .input_len = 512, .output_len = 512, .num_groups = 1,
                               .turns = 1, .seed = 7, .in_stream = 1, .out_stream = 2, .token_stream = 3};
}

static void test_uniform_unchanged(void **state) {
    (void)state;
    rp_bench_workload w = offline_workload();
    w.num_prompts = 200;
    w.range = 0.5;
    static const int in[] = {263, 452, 294, 711, 483, 339}, out[] = {532, 457, 408, 653, 511, 502},
                     first[] = {577, 197, 905, 434, 343, 384};
    int32_t ids[768];
    for (long c = 0; c < 6; c++) {
        assert_int_equal(rp_bench_workload_new_tokens(&w, c, 0, 1000, ids), in[c]);
        assert_int_equal(ids[0], first[c]);
        assert_int_equal(rp_bench_workload_output(&w, c, 0), out[c]);
    }
    assert_int_equal(rp_bench_workload_max_prompt(&w), 768);
    assert_int_equal(rp_bench_workload_max_output(&w), 768);
    char d[128];
    rp_bench_workload_describe(&w, d, sizeof d);
    assert_string_equal(d, "random");
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

typedef struct len_stats {
    double mean, median, sd_log;
    int min, max;
} len_stats;

static len_stats stats_of(int *v, int n) {
    len_stats s = {.min = v[0], .max = v[0]};
    double sum = 0, sum_log = 0, sum_log2 = 0;
    for (int i = 0; i < n; i++) {
        sum += v[i], sum_log += log(v[i]), sum_log2 += log(v[i]) * log(v[i]);
        s.min = v[i] < s.min ? v[i] : s.min;
        s.max = v[i] > s.max ? v[i] : s.max;
    }
    s.mean = sum / n;
    s.sd_log = sqrt(sum_log2 / n - (sum_log / n) * (sum_log / n));
    qsort(v, (size_t)n, sizeof *v, cmp_int);
    s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return s;
}

/* 20000 draws of input and output lengths with mean 512 and the sigma given
 * (0: the default): the mean within 4% (the sample's own error is about
 * 1.3 x 512 / sqrt(20000) = 0.9% at sigma 1, and the cap takes 1.8% off),
 * the median near the lognormal's exp(mu) = 512 exp(-sigma^2 / 2), the
 * spread of ln(length) within 0.05 of sigma. */
static void check_lognormal(double sigma_given, double sigma) {
    rp_bench_workload w = offline_workload();
    w.length_dist = RP_BENCH_LEN_LOGNORMAL;
    w.sigma = sigma_given;
    const long cap = RP_BENCH_LOGNORMAL_CAP * 512;
    assert_int_equal(rp_bench_workload_max_output(&w), cap);
    assert_int_equal(rp_bench_workload_max_prompt(&w), cap);
    int *in = malloc(DRAWS * sizeof *in), *out = malloc(DRAWS * sizeof *out);
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    assert_non_null(in), assert_non_null(out), assert_non_null(ids);
    for (long i = 0; i < DRAWS; i++) {
        in[i] = rp_bench_workload_new_tokens(&w, i, 0, 1000, ids);
        out[i] = rp_bench_workload_output(&w, i, 0);
    }
    const char *names[] = {"input", "output"};
    int *lens[] = {in, out};
    for (int k = 0; k < 2; k++) {
        len_stats s = stats_of(lens[k], DRAWS);
        print_message("lognormal sigma %.2f, %s lengths of mean 512: sample mean %.1f, median %.1f, min %d, max %d, "
                      "sd of ln %.3f\n",
                      sigma, names[k], s.mean, s.median, s.min, s.max, s.sd_log);
        assert_true(fabs(s.mean / 512 - 1) < 0.04);
        assert_true(s.median < s.mean);
        assert_true(fabs(s.median / (512 * exp(-0.5 * sigma * sigma)) - 1) < 0.05);
        assert_true(fabs(s.sd_log - sigma) < 0.05);
        assert_true(s.min >= 1);
        assert_true(s.max <= cap);
        assert_true(s.max > 2 * 512); /* a tail */
    }
    /* the same seed, the same lengths; another seed, others */
    rp_bench_workload again = w, other = w;
    other.seed = 8;
    int differ = 0;
    for (long i = 0; i < 100; i++) {
        assert_int_equal(rp_bench_workload_output(&again, i, 0), rp_bench_workload_output(&w, i, 0));
        assert_int_equal(rp_bench_workload_new_tokens(&again, i, 0, 1000, ids),
                         rp_bench_workload_new_tokens(&w, i, 0, 1000, ids));
        differ += rp_bench_workload_output(&other, i, 0) != rp_bench_workload_output(&w, i, 0);
    }
    assert_true(differ > 50);
    free(in), free(out), free(ids);
}

static void test_lognormal_default_sigma(void **state) {
    (void)state;
    check_lognormal(0, RP_BENCH_LOGNORMAL_SIGMA);
}

static void test_lognormal_sigma_half(void **state) {
    (void)state;
    check_lognormal(0.5, 0.5);
}

/* A mean of 1 still gives lengths of at least 1, at most the cap. */
static void test_lognormal_tiny_mean(void **state) {
    (void)state;
    rp_bench_workload w = offline_workload();
    w.length_dist = RP_BENCH_LEN_LOGNORMAL;
    w.output_len = 1;
    w.sigma = 2;
    for (long i = 0; i < 2000; i++) {
        const int n = rp_bench_workload_output(&w, i, 0);
        assert_true(n >= 1 && n <= RP_BENCH_LOGNORMAL_CAP);
    }
}

/* The longest prompt of a multi-turn chat: every turn's input and every
 * earlier answer at the cap; and the name on the first line. */
static void test_lognormal_sizes_and_name(void **state) {
    (void)state;
    rp_bench_workload w = offline_workload();
    w.length_dist = RP_BENCH_LEN_LOGNORMAL;
    w.input_len = 100, w.output_len = 10, w.turns = 3, w.shared_prefix_len = 5, w.num_groups = 2, w.sigma = 0.75;
    assert_int_equal(rp_bench_workload_max_output(&w), 80);
    assert_int_equal(rp_bench_workload_max_prompt(&w), 5 + 3 * 800 + 2 * 80);
    char d[128];
    rp_bench_workload_describe(&w, d, sizeof d);
    assert_string_equal(d,
                        "shared prefix 5 x 2 groups, 3-turn chat, lognormal lengths (sigma 0.75, at most 8x the mean)");
    w.turns = 1, w.shared_prefix_len = 0, w.num_groups = 1, w.sigma = 0;
    rp_bench_workload_describe(&w, d, sizeof d);
    assert_string_equal(d, "random, lognormal lengths (sigma 1.00, at most 8x the mean)");
}

/* The options, and what they exclude: usage errors (exit 2). */
static void test_options(void **state) {
    (void)state;
    rp_bench_workload w = offline_workload();
    assert_int_equal(rp_bench_workload_parse(&w, 0x163, "lognormal", "test"), 1);
    assert_int_equal(w.length_dist, RP_BENCH_LEN_LOGNORMAL);
    assert_int_equal(rp_bench_workload_parse(&w, 0x163, "pareto", "test"), -1);
    assert_int_equal(rp_bench_workload_parse(&w, 0x164, "0", "test"), -1);
    assert_int_equal(rp_bench_workload_parse(&w, 0x164, "-1", "test"), -1);
    assert_int_equal(rp_bench_workload_parse(&w, 0x164, "2.5", "test"), -1);
    assert_int_equal(rp_bench_workload_check(&w, "test"), 0);
    assert_int_equal(rp_bench_workload_parse(&w, 0x164, "1.5", "test"), 1);
    assert_true(w.sigma == 1.5);
    assert_int_equal(rp_bench_workload_check(&w, "test"), 0);
    w.range = 0.2; /* --random-range-ratio with lognormal */
    assert_int_equal(rp_bench_workload_check(&w, "test"), RP_EXIT_USAGE);
    w.range = 0;
    assert_int_equal(rp_bench_workload_parse(&w, 0x163, "uniform", "test"), 1);
    assert_int_equal(rp_bench_workload_check(&w, "test"), RP_EXIT_USAGE); /* a sigma with uniform */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform_unchanged),       cmocka_unit_test(test_lognormal_default_sigma),
        cmocka_unit_test(test_lognormal_sigma_half),    cmocka_unit_test(test_lognormal_tiny_mean),
        cmocka_unit_test(test_lognormal_sizes_and_name), cmocka_unit_test(test_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
