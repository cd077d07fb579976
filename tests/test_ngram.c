/* The n-gram drafter (src/engine/ngram.c) against the rule ngram.h states,
 * written here as a plain brute-force search over the tokens.
 *
 * Pinned down by hand: a repeated phrase proposes its continuation; the
 * longest match wins over a more recent shorter one; the most recent of
 * equal matches wins; no match proposes nothing; a continuation that
 * reaches the sequence's end, or runs into the suffix itself, goes on as
 * the text repeating; every k from 1 to 8;
 * min_n == max_n; truncation bringing back the occurrence before the one
 * forgotten; tokens whose hashes collide never matching; the capacity; bad
 * lengths. Then a fuzz run: small vocabularies (so that matches of every
 * length are frequent), random capacities and lengths, appends of random
 * tokens and of accepted drafts, truncations small (rejected drafts) and
 * large (preemption), resets, and a proposal with random k after every
 * operation, each identical to the brute force; every invariant checked
 * along the way. */
#include "engine/ngram.h"
#include "test_util.h"
#include "util/rng.h"

#include <time.h>

/* ---- the rule, by brute force ---- */

static int brute_propose(const int32_t *t, int n, int min_n, int max_n, int k, int32_t *out) {
    for (int m = max_n; m >= min_n; m--) {
        for (int e = n - 1; e >= m; e--) {
            int i = 1;
            while (i <= m && t[e - i] == t[n - i]) i++;
            if (i <= m) continue;
            for (int j = 0; j < k; j++) out[j] = e + j < n ? t[e + j] : out[e + j - n];
            return k;
        }
    }
    return 0;
}

static void expect_ok(const rp_ngram *g, const int32_t *t) {
    rp_err err;
    if (rp_ngram_check(g, t, &err)) fail_msg("%s", err.msg);
}

/* An index of t[0..n) with room for 64 tokens. */
static rp_ngram *index_of(int min_n, int max_n, const int32_t *t, int n) {
    rp_ngram *g = rp_ngram_new(min_n, max_n, 64);
    assert_non_null(g);
    assert_int_equal(rp_ngram_append(g, t, n, NULL), 0);
    expect_ok(g, t);
    return g;
}

/* Proposes k tokens after t[0..n) and expects exactly want[0..num_want),
 * which the brute force must agree with too. */
static void expect_proposal(const rp_ngram *g, const int32_t *t, int n, int min_n, int max_n, int k,
                            const int32_t *want, int num_want) {
    int32_t got[16], ref[16];
    assert_true(k <= 16);
    int num_ref = brute_propose(t, n, min_n, max_n, k, ref);
    assert_int_equal(num_ref, num_want);
    if (num_want) assert_memory_equal(ref, want, (size_t)num_want * sizeof *want);
    int num_got = rp_ngram_propose(g, t, n, k, got);
    assert_int_equal(num_got, num_want);
    if (num_want) assert_memory_equal(got, want, (size_t)num_want * sizeof *want);
}

#define LEN(a) ((int)(sizeof(a) / sizeof *(a)))

/* ---- by hand ---- */

static void test_repeated_phrase(void **state) {
    (void)state;
    static const int32_t t[] = {1, 2, 3, 4, 5, 9, 9, 1, 2, 3};
    rp_ngram *g = index_of(2, 4, t, LEN(t));
    static const int32_t want[] = {4, 5, 9, 9};
    expect_proposal(g, t, LEN(t), 2, 4, 4, want, 4);
    rp_ngram_free(g);
}

static void test_longest_wins(void **state) {
    (void)state;
    /* [1 2 3] occurred first, followed by 8; [2 3] more recently, followed by 6 */
    static const int32_t t[] = {7, 1, 2, 3, 8, 5, 2, 3, 6, 4, 1, 2, 3};
    rp_ngram *g = index_of(2, 4, t, LEN(t));
    static const int32_t want[] = {8, 5, 2};
    expect_proposal(g, t, LEN(t), 2, 4, 3, want, 3);
    rp_ngram_free(g);
    /* with max_n 2 only the shorter match counts: its most recent one */
    g = index_of(2, 2, t, LEN(t));
    static const int32_t want2[] = {6, 4, 1};
    expect_proposal(g, t, LEN(t), 2, 2, 3, want2, 3);
    rp_ngram_free(g);
}

static void test_most_recent(void **state) {
    (void)state;
    static const int32_t t[] = {1, 2, 5, 1, 2, 6, 3, 1, 2};
    rp_ngram *g = index_of(2, 4, t, LEN(t));
    static const int32_t want[] = {6, 3, 1, 2};
    expect_proposal(g, t, LEN(t), 2, 4, 4, want, 4);
    rp_ngram_free(g);
}

static void test_no_match(void **state) {
    (void)state;
    static const int32_t t[] = {1, 2, 3, 1};
    rp_ngram *g = rp_ngram_new(2, 4, 64);
    assert_non_null(g);
    /* too short for any match, empty included */
    for (int n = 0; n <= 2; n++) {
        assert_int_equal(rp_ngram_append(g, t, n, NULL), 0);
        expect_proposal(g, t, n, 2, 4, 4, NULL, 0);
    }
    /* [3 1] never occurred before; [1] did, but min_n is 2 */
    assert_int_equal(rp_ngram_append(g, t, 4, NULL), 0);
    expect_proposal(g, t, 4, 2, 4, 4, NULL, 0);
    rp_ngram_free(g);
    g = index_of(1, 4, t, LEN(t));
    static const int32_t want[] = {2, 3, 1, 2};
    expect_proposal(g, t, LEN(t), 1, 4, 4, want, 4);
    /* k = 0 asks for nothing */
    expect_proposal(g, t, LEN(t), 1, 4, 0, NULL, 0);
    rp_ngram_free(g);
}

static void test_short_continuation(void **state) {
    (void)state;
    static const int32_t t[] = {1, 2, 3, 1, 2};
    rp_ngram *g = index_of(2, 4, t, LEN(t));
    /* what follows [1 2], then the proposal again: the text read as repeating */
    static const int32_t want[] = {3, 1, 2, 3, 1, 2, 3, 1};
    expect_proposal(g, t, LEN(t), 2, 4, 8, want, 8);
    rp_ngram_free(g);
}

static void test_every_k(void **state) {
    (void)state;
    int32_t t[24];
    for (int i = 0; i < 20; i++) t[i] = 10 + i;
    t[20] = 10, t[21] = 11, t[22] = 12;
    rp_ngram *g = index_of(2, 4, t, 23);
    for (int k = 1; k <= 8; k++) expect_proposal(g, t, 23, 2, 4, k, t + 3, k);
    rp_ngram_free(g);
}

static void test_min_equals_max(void **state) {
    (void)state;
    static const int32_t t[] = {1, 2, 9, 5, 1, 2};
    rp_ngram *g = index_of(3, 3, t, LEN(t));
    expect_proposal(g, t, LEN(t), 3, 3, 4, NULL, 0); /* [5 1 2] is new; [1 2] is too short */
    rp_ngram_free(g);
    g = index_of(2, 2, t, LEN(t));
    static const int32_t want[] = {9, 5, 1, 2};
    expect_proposal(g, t, LEN(t), 2, 2, 4, want, 4);
    rp_ngram_free(g);
    g = index_of(1, 1, t, LEN(t));
    expect_proposal(g, t, LEN(t), 1, 1, 4, want, 4); /* [2] at 1 */
    rp_ngram_free(g);
}

static void test_overlap(void **state) {
    (void)state;
    /* [2 1] ends at 3; what follows it is the suffix itself */
    static const int32_t t[] = {1, 2, 1, 2, 1};
    rp_ngram *g = index_of(2, 2, t, LEN(t));
    static const int32_t want[] = {2, 1, 2, 1};
    expect_proposal(g, t, LEN(t), 2, 2, 4, want, 4);
    rp_ngram_free(g);
    /* a run: the most recent [5 5 5] ends one token before the end */
    static const int32_t run[] = {5, 5, 5, 5};
    g = index_of(1, 3, run, LEN(run));
    expect_proposal(g, run, LEN(run), 1, 3, 4, run, 4); /* the run goes on */
    rp_ngram_free(g);
}

static void test_truncate(void **state) {
    (void)state;
    int32_t t[16] = {1, 2, 7, 3, 1, 2, 8, 3, 1, 2};
    rp_ngram *g = index_of(2, 4, t, 10);
    static const int32_t want[] = {8, 3, 1, 2};
    expect_proposal(g, t, 10, 2, 4, 4, want, 4);
    /* back to [1 2 7 3 1 2]: the [3 1 2] at 6 is forgotten, the [1 2] at 2 back */
    rp_ngram_truncate(g, 6);
    assert_int_equal(rp_ngram_len(g), 6);
    expect_ok(g, t);
    static const int32_t want2[] = {7, 3, 1, 2};
    expect_proposal(g, t, 6, 2, 4, 4, want2, 4);
    /* the sequence goes on differently: [1 2 7 3 1 2 9 1 2] */
    t[6] = 9, t[7] = 1, t[8] = 2, t[9] = -1;
    assert_int_equal(rp_ngram_append(g, t, 9, NULL), 0);
    expect_ok(g, t);
    static const int32_t want3[] = {9, 1, 2, 9};
    expect_proposal(g, t, 9, 2, 4, 4, want3, 4);
    /* a truncation past the end changes nothing */
    rp_ngram_truncate(g, 12);
    assert_int_equal(rp_ngram_len(g), 9);
    expect_proposal(g, t, 9, 2, 4, 4, want3, 4);
    /* reset: a new sequence from nothing */
    rp_ngram_reset(g);
    assert_int_equal(rp_ngram_len(g), 0);
    expect_ok(g, t);
    static const int32_t u[] = {4, 4, 6, 4, 4};
    assert_int_equal(rp_ngram_append(g, u, LEN(u), NULL), 0);
    expect_ok(g, u);
    static const int32_t want4[] = {6, 4, 4, 6};
    expect_proposal(g, u, LEN(u), 2, 4, 4, want4, 4);
    rp_ngram_free(g);
}

/* Two different n-grams with the same hash (found by a birthday search over
 * random ones) share a bucket and a hash; the suffix equal to one must
 * never match the other. */
typedef struct hashed {
    uint32_t hash;
    int32_t t[3];
} hashed;

static int by_hash(const void *a, const void *b) {
    uint32_t x = ((const hashed *)a)->hash, y = ((const hashed *)b)->hash;
    return (x > y) - (x < y);
}

static void find_collision(int n, int32_t *a, int32_t *b) {
    enum { COUNT = 1 << 18 }; /* about 8 colliding pairs expected among 2^32 hashes */
    hashed *h = malloc(COUNT * sizeof *h);
    assert_non_null(h);
    for (int i = 0; i < COUNT; i++) {
        for (int j = 0; j < n; j++) h[i].t[j] = (int32_t)(rp_rand_u64(38, (uint64_t)n, (uint64_t)i * 4 + j) >> 44);
        h[i].hash = rp_ngram_hash(h[i].t, n);
    }
    qsort(h, COUNT, sizeof *h, by_hash);
    for (int i = 0; i + 1 < COUNT; i++) {
        if (h[i].hash == h[i + 1].hash && memcmp(h[i].t, h[i + 1].t, (size_t)n * sizeof *a) != 0) {
            memcpy(a, h[i].t, (size_t)n * sizeof *a);
            memcpy(b, h[i + 1].t, (size_t)n * sizeof *b);
            free(h);
            return;
        }
    }
    free(h);
    fail_msg("no colliding %d-grams found", n);
}

static void test_hash_collision(void **state) {
    (void)state;
    for (int n = 2; n <= 3; n++) {
        int32_t a[3], b[3], t[16];
        find_collision(n, a, b);
        /* a 7 b: b's suffix must not match a */
        int len = 0;
        memcpy(t + len, a, (size_t)n * sizeof *t), len += n;
        t[len++] = 7;
        memcpy(t + len, b, (size_t)n * sizeof *t), len += n;
        rp_ngram *g = index_of(n, n, t, len);
        expect_proposal(g, t, len, n, n, 4, NULL, 0);
        /* a 7 b 8 a: a's suffix matches a, not b */
        t[len++] = 8;
        memcpy(t + len, a, (size_t)n * sizeof *t), len += n;
        assert_int_equal(rp_ngram_append(g, t, len, NULL), 0);
        expect_ok(g, t);
        int32_t want[4] = {7};
        memcpy(want + 1, b, (size_t)n * sizeof *t);
        expect_proposal(g, t, len, n, n, 1 + n, want, 1 + n);
        /* a 7 b 8 a 9 b: b's suffix matches b, not the more recent a */
        t[len++] = 9;
        memcpy(t + len, b, (size_t)n * sizeof *t), len += n;
        assert_int_equal(rp_ngram_append(g, t, len, NULL), 0);
        expect_ok(g, t);
        int32_t want2[1] = {8};
        expect_proposal(g, t, len, n, n, 1, want2, 1);
        /* forgetting the keys again, newest first */
        rp_ngram_truncate(g, n);
        expect_ok(g, t);
        rp_ngram_free(g);
    }
}

static void test_capacity(void **state) {
    (void)state;
    static const int32_t t[] = {1, 2, 3, 1, 2, 3, 1, 2, 3};
    rp_ngram *g = rp_ngram_new(2, 4, 8);
    assert_non_null(g);
    assert_int_equal(rp_ngram_append(g, t, 8, NULL), 0);
    rp_err err = {0};
    assert_int_equal(rp_ngram_append(g, t, 9, &err), RP_ERR);
    assert_non_null(strstr(err.msg, "9 tokens"));
    assert_int_equal(rp_ngram_len(g), 8); /* nothing learned */
    expect_ok(g, t);
    static const int32_t want[] = {3, 1, 2, 3};
    expect_proposal(g, t, 8, 2, 4, 4, want, 4);
    rp_ngram_free(g);
    /* the smallest index: one token, never a match */
    g = rp_ngram_new(1, 16, 1);
    assert_non_null(g);
    assert_int_equal(rp_ngram_append(g, t, 1, NULL), 0);
    expect_proposal(g, t, 1, 1, 16, 8, NULL, 0);
    expect_ok(g, t);
    rp_ngram_free(g);
}

static void test_bad_params(void **state) {
    (void)state;
    assert_null(rp_ngram_new(0, 4, 64));
    assert_null(rp_ngram_new(3, 2, 64));
    assert_null(rp_ngram_new(1, 17, 64));
    assert_null(rp_ngram_new(2, 4, 0));
    assert_null(rp_ngram_new(2, 4, -5));
    rp_ngram *g = rp_ngram_new(16, 16, 64);
    assert_non_null(g);
    rp_ngram_free(g);
    rp_ngram_free(NULL);

    rp_err err;
    assert_int_equal(rp_ngram_validate(RP_NGRAM_DEFAULT_MIN, RP_NGRAM_DEFAULT_MAX, &err), 0);
    assert_int_equal(rp_ngram_validate(0, 4, &err), RP_ERR);
    assert_string_equal(err.param, "prompt_lookup_min");
    assert_string_equal(err.msg, "prompt_lookup_min=0 must be > 0");
    assert_int_equal(rp_ngram_validate(5, 3, &err), RP_ERR);
    assert_string_equal(err.msg, "prompt_lookup_min=5 must be <= prompt_lookup_max=3");
    assert_int_equal(rp_ngram_validate(2, 17, &err), RP_ERR);
    assert_string_equal(err.param, "prompt_lookup_max");
    assert_string_equal(err.msg, "prompt_lookup_max=17 must be <= 16");
}

/* ---- fuzz against the brute force ---- */

typedef struct fuzz {
    uint64_t seed, counter;
    int min_n, max_n, vocab, capacity;
    int32_t *t; /* [capacity] */
    int n;
    rp_ngram *g;
    long proposals, hits, proposed, appends, truncates, resets, refused;
    long sum_len, longest;
} fuzz;

static uint64_t draw(fuzz *f, uint64_t bound) { return rp_rand_u64(f->seed, 1, f->counter++) % bound; }

/* Proposes with a random k (0..8) into out, compares with the brute force,
 * and returns the proposal's length. */
static int fuzz_propose(fuzz *f, int32_t *out) {
    int k = (int)draw(f, 9);
    int32_t ref[8];
    int got = rp_ngram_propose(f->g, f->t, f->n, k, out);
    int want = brute_propose(f->t, f->n, f->min_n, f->max_n, k, ref);
    if (got != want || memcmp(out, ref, (size_t)got * sizeof *out) != 0)
        fail_msg("seed %llu, lengths %d..%d, n %d, k %d: proposed %d tokens, the brute force %d (or others)",
                 (unsigned long long)f->seed, f->min_n, f->max_n, f->n, k, got, want);
    f->proposals++;
    f->sum_len += f->n;
    if (f->n > f->longest) f->longest = f->n;
    if (got) f->hits++, f->proposed += got;
    return got;
}

/* Appends count tokens, or shows that an append past the capacity is
 * refused and learns nothing. */
static void fuzz_append(fuzz *f, const int32_t *tokens, int count) {
    if (f->n + count > f->capacity) {
        rp_err err;
        assert_int_equal(rp_ngram_append(f->g, f->t, f->n + count, &err), RP_ERR);
        assert_int_equal(rp_ngram_len(f->g), f->n);
        f->refused++;
        return;
    }
    memcpy(f->t + f->n, tokens, (size_t)count * sizeof *tokens);
    f->n += count;
    assert_int_equal(rp_ngram_append(f->g, f->t, f->n, NULL), 0);
    f->appends++;
}

static void fuzz_one(uint64_t seed, int ops, fuzz *total) {
    fuzz f = {.seed = seed};
    f.vocab = 2 + (int)draw(&f, 4);
    f.min_n = 1 + (int)draw(&f, draw(&f, 4) ? 3 : 16);
    f.max_n = f.min_n + (int)draw(&f, draw(&f, 4) ? 4 : RP_NGRAM_MAX_N + 1 - f.min_n);
    if (f.max_n > RP_NGRAM_MAX_N) f.max_n = RP_NGRAM_MAX_N;
    f.capacity = 1 + (int)draw(&f, draw(&f, 4) ? 4000 : 64);
    f.t = calloc((size_t)f.capacity, sizeof *f.t);
    assert_non_null(f.t);
    f.g = rp_ngram_new(f.min_n, f.max_n, f.capacity);
    assert_non_null(f.g);
    int32_t draft[8 + 1], tokens[8]; /* a draft of up to 8, then the target's token */
    for (int op = 0; op < ops; op++) {
        /* per mille; rollbacks and resets rare, so that sequences grow to thousands of tokens */
        int what = (int)draw(&f, 1000);
        if (what < 400) {
            /* new tokens */
            int count = 1 + (int)draw(&f, 6);
            for (int i = 0; i < count; i++) tokens[i] = (int32_t)draw(&f, (uint64_t)f.vocab);
            fuzz_append(&f, tokens, count);
        } else if (what < 750) {
            /* a speculative round: some of the draft accepted, then the target's own token */
            int got = fuzz_propose(&f, draft);
            int accepted = got ? (int)draw(&f, (uint64_t)got + 1) : 0;
            draft[accepted] = (int32_t)draw(&f, (uint64_t)f.vocab);
            fuzz_append(&f, draft, accepted + 1);
        } else if (what < 997) {
            /* rejected drafts that had been appended */
            int back = (int)draw(&f, 9);
            rp_ngram_truncate(f.g, f.n > back ? f.n - back : 0);
            f.n = rp_ngram_len(f.g);
            f.truncates++;
        } else if (what < 999) {
            /* preemption, or a long rollback */
            rp_ngram_truncate(f.g, (int)draw(&f, (uint64_t)f.n + 1));
            f.n = rp_ngram_len(f.g);
            f.truncates++;
        } else {
            rp_ngram_reset(f.g);
            f.n = 0;
            f.resets++;
        }
        /* stale tokens past the end must not matter */
        for (int i = f.n; i < f.n + 8 && i < f.capacity; i++) f.t[i] = (int32_t)draw(&f, (uint64_t)f.vocab);
        assert_int_equal(rp_ngram_len(f.g), f.n);
        fuzz_propose(&f, draft);
        if (op % 256 == 0) expect_ok(f.g, f.t);
    }
    expect_ok(f.g, f.t);
    rp_ngram_free(f.g);
    free(f.t);
    total->proposals += f.proposals, total->hits += f.hits, total->proposed += f.proposed;
    total->appends += f.appends, total->truncates += f.truncates, total->resets += f.resets;
    total->refused += f.refused;
    total->sum_len += f.sum_len;
    if (f.longest > total->longest) total->longest = f.longest;
}

static void test_fuzz(void **state) {
    (void)state;
    fuzz total = {0};
    int runs = 0;
    for (uint64_t seed = 1; seed <= 48; seed++, runs++) fuzz_one(seed, 6000, &total);
    print_message("ngram fuzz: %d runs, %ld appends (%ld refused at capacity), %ld truncations, %ld resets; "
                  "%ld proposals (at %.0f tokens on average, %ld at most) equal to the brute force, %ld non-empty, "
                  "%ld tokens\n",
                  runs, total.appends, total.refused, total.truncates, total.resets, total.proposals,
                  (double)total.sum_len / (double)total.proposals, total.longest, total.hits, total.proposed);
    assert_true(total.hits > total.proposals / 4 && total.refused > 0);
}

/* A long decode, one token a step: the cost of a step must not grow with
 * the sequence. Printed, not asserted (timings vary); the fuzz proves the
 * results. */
static void test_long_sequence(void **state) {
    (void)state;
    enum { N = 200000 };
    int32_t *t = malloc(N * sizeof *t);
    assert_non_null(t);
    rp_ngram *g = rp_ngram_new(RP_NGRAM_DEFAULT_MIN, RP_NGRAM_DEFAULT_MAX, N);
    assert_non_null(g);
    int32_t draft[4];
    long hits = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int n = 0; n < N; n++) {
        /* mostly copies of what came before, as in code or quoted text */
        uint64_t r = rp_rand_u64(38, 2, (uint64_t)n);
        t[n] = (r % 4 == 0 || n < 100) ? (int32_t)(r >> 32) % 1000 : t[n - 100];
        assert_int_equal(rp_ngram_append(g, t, n + 1, NULL), 0);
        hits += rp_ngram_propose(g, t, n + 1, 4, draft) > 0;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / N;
    print_message("ngram: %d tokens one at a time, %.0f ns per append + propose, %ld proposals\n", N, ns, hits);
    expect_ok(g, t);
    rp_ngram_free(g);
    free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repeated_phrase), cmocka_unit_test(test_longest_wins),
        cmocka_unit_test(test_most_recent),     cmocka_unit_test(test_no_match),
        cmocka_unit_test(test_short_continuation), cmocka_unit_test(test_every_k),
        cmocka_unit_test(test_min_equals_max),  cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_truncate),        cmocka_unit_test(test_hash_collision),
        cmocka_unit_test(test_capacity),        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_fuzz),            cmocka_unit_test(test_long_sequence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
