/* Token masks as the backends take them (backend.h's rp_token_mask_words
 * and sample_masked), on the CPU:
 *  - the row layout: padded to 4 words, never short of the vocabulary, and
 *    a matcher's mask (rp_smatcher_fill_mask) fits it with the bits where
 *    the backend reads them;
 *  - rp_sampler_apply_mask (the CPU reference of the device's
 *    rp_k_apply_token_mask): disallowed logits -inf, the others untouched;
 *  - the CPU backend's deferred sampling: a forward with sample_deferred,
 *    then sample_masked, gives what the host path gives (the logits read
 *    back, masked, sampled by the host sampler), bit for bit, tokens,
 *    logprobs and top logprobs, greedy and sampled; unmasked rows and rows
 *    whose mask allows everything get the tokens of a forward that sampled
 *    (the same draws); the same seeds give the same tokens again; misuse
 *    (sampling what was not deferred, a forward before the deferred one was
 *    sampled, a mask index out of range, deferred without parameters) is an
 *    error. */
#include <math.h>

#include "backend/backend.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "structured/structured.h"
#include "test_util.h"
#include "masked_sampling.h"

static void test_mask_words(void **state) {
    (void)state;
    static const int vocabs[] = {1, 31, 32, 127, 128, 129, 1031, 128256, 151669, 151936, 152064};
    for (size_t i = 0; i < sizeof vocabs / sizeof vocabs[0]; i++) {
        const int v = vocabs[i], w = rp_token_mask_words(v);
        assert_int_equal(w % 4, 0);           /* rows 16-byte aligned */
        assert_true(w * 32 >= v);             /* every id has its bit */
        assert_true(w * 32 - v < 128);        /* no more than the padding */
    }
    assert_int_equal(rp_token_mask_words(151936), 4748);
    assert_int_equal(rp_token_mask_words(128), 4);
    assert_int_equal(rp_token_mask_words(129), 8);
}

/* A matcher's mask in a backend row: bit id % 32 of word id / 32, exactly
 * the tokens the grammar allows next. */
static void test_matcher_mask_layout(void **state) {
    (void)state;
    enum { V = 300 }; /* the 256 bytes, then multi-byte tokens, then ids past them */
    char bytes[256];
    const char *ptrs[V];
    size_t lens[V];
    static const char *multi[] = {"ab", "abc", "b", "zz"};
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, ptrs[i] = &bytes[i], lens[i] = 1;
    for (int i = 256; i < V; i++) ptrs[i] = NULL, lens[i] = 0;
    for (int i = 0; i < 4; i++) ptrs[256 + i] = multi[i], lens[256 + i] = strlen(multi[i]);
    const int32_t eos = 299;
    uint8_t special[V] = {0};
    special[eos] = 1;
    rp_err err;
    rp_svocab *v = rp_svocab_new(V, ptrs, lens, special, &eos, 1, &err);
    if (!v) fail_msg("%s", err.msg);
    assert_true(rp_svocab_mask_words(v) <= rp_token_mask_words(V));
    rp_sopts so = {0};
    const char *choice = "[\"abc\", \"b\"]";
    rp_sgrammar *g = rp_sgrammar_compile(v, RP_SKIND_CHOICE, choice, strlen(choice), &so, &err);
    if (!g) fail_msg("%s", err.msg);
    rp_smatcher *m = rp_smatcher_new(g, &err);
    assert_non_null(m);
    uint32_t row[16];
    memset(row, 0xa5, sizeof row); /* the matcher writes its words; the padding is never read */
    assert_true(rp_smatcher_fill_mask(m, row));
    for (int id = 0; id < V; id++) {
        const int want = id == 'a' || id == 'b' || id == 256 /* ab */ || id == 257 /* abc */ || id == 258 /* b */;
        if (ms_allows(row, id) != want) fail_msg("id %d: allowed %d, want %d", id, ms_allows(row, id), want);
    }
    /* after "b" only the end: EOS, where the output is complete */
    assert_int_equal(rp_smatcher_accept_token(m, 258), 0);
    assert_true(rp_smatcher_fill_mask(m, row));
    for (int id = 0; id < V; id++) assert_int_equal(ms_allows(row, id), id == eos);
    rp_smatcher_free(m);
    rp_sgrammar_release(g);
    rp_svocab_free(v);
}

/* rp_sampler_apply_mask: -inf exactly where the bit is 0, every other logit
 * bit for bit as it was (a vocabulary that ends inside a word, words all
 * ones and all zeros). */
static void test_apply_mask(void **state) {
    (void)state;
    enum { V = 1000 };
    float logits[V], orig[V];
    uint32_t mask[32];
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < V; i++) orig[i] = logits[i] = (float)rp_rand_normal(7, (uint64_t)k, (uint64_t)i);
        ms_random_mask(mask, V, k == 0 ? 1000 : k == 1 ? 0 : 300, 5, 11, (uint64_t)k);
        if (k == 3) mask[2] = 0xffffffffu, mask[3] = 0; /* a whole word each way */
        rp_sampler_apply_mask(logits, V, mask);
        int allowed = 0;
        for (int i = 0; i < V; i++) {
            if (ms_allows(mask, i)) {
                allowed++;
                assert_memory_equal(&logits[i], &orig[i], sizeof(float));
            } else if (!(isinf(logits[i]) && logits[i] < 0)) {
                fail_msg("mask %d: id %d is not allowed but has logit %g", k, i, logits[i]);
            }
        }
        if (k == 0) assert_int_equal(allowed, V);
        if (k == 1) assert_int_equal(allowed, 1);
    }
}

/* ---- the CPU backend's deferred sampling ---------------------------------- */

enum { B = 5, CTX = 24 };

typedef struct fixture {
    rp_runner *run;
    rp_runner_seq seqs[B];
    rp_sampling_params params[B];
    uint32_t *masks; /* [B][words] */
    int32_t mask_of_row[B];
    int num_masks, vocab, words;
} fixture;

/* The decode batch of every sequence at its length, fed its last token: the
 * same positions each time, so each forward computes the same logits. */
static rp_batch *decode_batch(fixture *f) {
    rp_err err;
    rp_batch_begin(f->run->bb);
    for (int s = 0; s < B; s++) {
        if (rp_page_table_reserve(f->run->table, f->seqs[s].row, f->seqs[s].len + 1, &err)) fail_msg("%s", err.msg);
        assert_true(rp_batch_add(f->run->bb, f->seqs[s].row, &f->seqs[s].last, 1, f->seqs[s].len, 1) >= 0);
    }
    return rp_batch_finish(f->run->bb);
}

static void fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    rp_runner_config rc = {.dummy_name = "tiny-qwen3", .device = "cpu", .threads = 2, .page_size = 16,
                           .num_pages = 16, .max_seqs = B, .max_context = 64, .max_batched_tokens = 256,
                           .max_logit_rows = B};
    rp_err err;
    f->run = rp_runner_new(&rc, &err);
    if (!f->run) fail_msg("runner: %s", err.msg);
    f->vocab = f->run->model->cfg.vocab_size;
    f->words = rp_token_mask_words(f->vocab);
    assert_int_equal(rp_runner_seqs_begin(f->run, f->seqs, B, &err), 0);
    double secs;
    if (rp_runner_prefill_random(f->run, f->seqs, B, CTX, &secs, &err)) fail_msg("prefill: %s", err.msg);
    /* rows: greedy masked, sampled masked (sparse), sampled unmasked with
     * top-k, sampled with a mask that allows everything, greedy masked to
     * a handful of tokens; some ask for top logprobs */
    static const float temps[B] = {0.0f, 1.0f, 0.8f, 1.0f, 0.0f};
    static const int per_mille[B] = {500, 20, -1, 1000, 3};
    for (int s = 0; s < B; s++) {
        f->params[s] = (rp_sampling_params){.temperature = temps[s], .top_p = s == 3 ? 0.9f : 1.0f,
                                            .top_k = s == 2 ? 5 : 0, .seed = 100 + (uint64_t)s, .step = 7,
                                            .top_logprobs = s % 2 ? 4 : 0, .repetition_penalty = 1.0f};
    }
    f->masks = calloc((size_t)B * f->words, 4);
    for (int s = 0; s < B; s++) {
        f->mask_of_row[s] = -1;
        if (per_mille[s] < 0) continue;
        ms_random_mask(f->masks + (size_t)f->num_masks * f->words, f->vocab, per_mille[s], (s * 37) % f->vocab, 5,
                       (uint64_t)s);
        f->mask_of_row[s] = f->num_masks++;
    }
}

static void fixture_free(fixture *f) {
    rp_runner_seqs_end(f->run, f->seqs, B);
    rp_runner_free(f->run);
    free(f->masks);
}

/* A deferred forward sampled with the fixture's masks. */
static void run_deferred(fixture *f, int32_t *tok, float *lp, rp_top_logprobs *top) {
    rp_err err;
    rp_backend *be = f->run->backend;
    rp_batch *bt = decode_batch(f);
    bt->sample = f->params;
    bt->sample_deferred = 1;
    if (rp_backend_forward(be, bt, &err)) fail_msg("deferred forward: %s", err.msg);
    if (be->ops->sample_masked(be, f->masks, f->num_masks, f->mask_of_row, &err)) fail_msg("%s", err.msg);
    if (be->ops->read_tokens(be, tok, lp, top, &err)) fail_msg("read_tokens: %s", err.msg);
}

static void test_backend_sample_masked(void **state) {
    (void)state;
    static fixture f;
    fixture_init(&f);
    rp_backend *be = f.run->backend;
    assert_non_null(be->ops->sample_masked);
    rp_err err;
    const int V = f.vocab;
    /* the host path: logits read back, masked and sampled by the host sampler */
    rp_batch *bt = decode_batch(&f);
    if (rp_backend_forward(be, bt, &err) || rp_backend_read_logits(be, f.run->logits, &err)) fail_msg("%s", err.msg);
    rp_sampler *smp = rp_sampler_new(V);
    float *tmp = malloc((size_t)V * 4);
    int32_t want[B];
    float want_lp[B];
    rp_top_logprobs want_top[B];
    for (int s = 0; s < B; s++) {
        const uint32_t *mask = f.mask_of_row[s] >= 0 ? f.masks + (size_t)f.mask_of_row[s] * f.words : NULL;
        want[s] = ms_host_sample(smp, f.run->logits + (size_t)s * V, V, mask, &f.params[s], tmp, &want_lp[s],
                                 &want_top[s]);
        if (mask) assert_true(ms_allows(mask, want[s]));
    }
    /* the deferred path, twice: the same as the host path, and again */
    int32_t tok[B], tok2[B];
    float lp[B], lp2[B];
    rp_top_logprobs top[B], top2[B];
    run_deferred(&f, tok, lp, top);
    assert_memory_equal(tok, want, sizeof tok);
    assert_memory_equal(lp, want_lp, sizeof lp);
    for (int s = 0; s < B; s++) {
        assert_int_equal(top[s].n, want_top[s].n);
        assert_memory_equal(top[s].ids, want_top[s].ids, sizeof(int32_t) * (size_t)top[s].n);
        assert_memory_equal(top[s].logprobs, want_top[s].logprobs, sizeof(float) * (size_t)top[s].n);
        /* a token the mask forbids is never listed with a finite logprob */
        for (int j = 0; f.mask_of_row[s] >= 0 && j < top[s].n; j++)
            if (!ms_allows(f.masks + (size_t)f.mask_of_row[s] * f.words, top[s].ids[j]))
                assert_true(isinf(top[s].logprobs[j]));
    }
    run_deferred(&f, tok2, lp2, top2);
    assert_memory_equal(tok2, tok, sizeof tok);
    assert_memory_equal(lp2, lp, sizeof lp);
    /* a forward that samples: the unmasked row and the row whose mask allows
     * everything get the same draws */
    bt = decode_batch(&f);
    bt->sample = f.params;
    int32_t plain[B];
    if (rp_backend_forward(be, bt, &err) || be->ops->read_tokens(be, plain, NULL, NULL, &err)) fail_msg("%s", err.msg);
    assert_int_equal(plain[2], tok[2]);
    assert_int_equal(plain[3], tok[3]);
    /* no mask at all (mask_of_row NULL): every row as the sampling forward */
    bt = decode_batch(&f);
    bt->sample = f.params;
    bt->sample_deferred = 1;
    if (rp_backend_forward(be, bt, &err) || be->ops->sample_masked(be, NULL, 0, NULL, &err) ||
        be->ops->read_tokens(be, tok2, NULL, NULL, &err))
        fail_msg("%s", err.msg);
    assert_memory_equal(tok2, plain, sizeof plain);
    rp_sampler_free(smp);
    free(tmp);
    fixture_free(&f);
}

static void test_backend_sample_masked_misuse(void **state) {
    (void)state;
    static fixture f;
    fixture_init(&f);
    rp_backend *be = f.run->backend;
    rp_err err;
    int32_t tok[B];
    /* nothing deferred */
    assert_int_not_equal(be->ops->sample_masked(be, f.masks, f.num_masks, f.mask_of_row, &err), 0);
    /* deferred without parameters */
    rp_batch *bt = decode_batch(&f);
    bt->sample_deferred = 1;
    assert_int_not_equal(rp_backend_forward(be, bt, &err), 0);
    assert_non_null(strstr(err.msg, "deferred"));
    /* a deferred forward: its tokens are not there before sample_masked, no
     * forward may follow it, and a mask index past the masks is refused */
    bt = decode_batch(&f);
    bt->sample = f.params;
    bt->sample_deferred = 1;
    if (rp_backend_forward(be, bt, &err)) fail_msg("%s", err.msg);
    assert_int_not_equal(be->ops->read_tokens(be, tok, NULL, NULL, &err), 0);
    bt = decode_batch(&f);
    bt->sample = f.params;
    assert_int_not_equal(rp_backend_forward(be, bt, &err), 0);
    assert_non_null(strstr(err.msg, "sample_masked"));
    int32_t bad[B];
    memcpy(bad, f.mask_of_row, sizeof bad);
    bad[1] = f.num_masks;
    assert_int_not_equal(be->ops->sample_masked(be, f.masks, f.num_masks, bad, &err), 0);
    /* and it still samples once asked properly */
    if (be->ops->sample_masked(be, f.masks, f.num_masks, f.mask_of_row, &err) ||
        be->ops->read_tokens(be, tok, NULL, NULL, &err))
        fail_msg("%s", err.msg);
    for (int s = 0; s < B; s++)
        if (f.mask_of_row[s] >= 0) assert_true(ms_allows(f.masks + (size_t)f.mask_of_row[s] * f.words, tok[s]));
    fixture_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mask_words),
        cmocka_unit_test(test_matcher_mask_layout),
        cmocka_unit_test(test_apply_mask),
        cmocka_unit_test(test_backend_sample_masked),
        cmocka_unit_test(test_backend_sample_masked_misuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
