/* Masked sampling for the tests (test_token_mask.c on the CPU,
 * test_cuda_sample.c and test_cuda_backend.c on the GPU): random token
 * masks in backend.h's layout, and the reference every backend is held to,
 * the mask applied by the host sampler's rp_sampler_apply_mask and then the
 * host sampler, on the row as a backend reads it (no penalties). Include
 * after cmocka (test_util.h). */
#ifndef RP_TEST_MASKED_SAMPLING_H
#define RP_TEST_MASKED_SAMPLING_H

#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "structured/structured.h"
#include "util/rng.h"

/* Whether mask allows token id. */
static inline int ms_allows(const uint32_t *mask, int id) { return (int)(mask[id >> 5] >> (id & 31) & 1u); }

/* A random mask over vocab ids (rp_token_mask_words(vocab) words; the bits
 * past vocab stay 0): each id allowed with probability per_mille / 1000,
 * and id keep always, so that a row never has nothing allowed. Drawn from
 * (seed, stream): the same arguments give the same mask. */
static inline void ms_random_mask(uint32_t *mask, int vocab, int per_mille, int keep, uint64_t seed, uint64_t stream) {
    memset(mask, 0, (size_t)rp_token_mask_words(vocab) * 4);
    for (int id = 0; id < vocab; id++)
        if (rp_rand_u64(seed, stream, (uint64_t)id) % 1000 < (uint64_t)per_mille) mask[id >> 5] |= 1u << (id & 31);
    mask[keep >> 5] |= 1u << (keep & 31);
}

/* The reference draw of one row (mask NULL: unmasked), on a copy in tmp
 * ([vocab]): token, logprob and (top non-NULL) top logprobs, with p as a
 * backend reads it (an unset top_p is 1; no penalties: no history). */
static inline int ms_host_sample(rp_sampler *smp, const float *row, int vocab, const uint32_t *mask,
                                 const rp_sampling_params *p, float *tmp, float *lp, rp_top_logprobs *top) {
    rp_sampling_params hp = *p;
    hp.top_p = p->top_p > 0 && p->top_p <= 1 ? p->top_p : 1.0f;
    hp.repetition_penalty = 1.0f;
    hp.presence_penalty = hp.frequency_penalty = 0.0f;
    memcpy(tmp, row, (size_t)vocab * sizeof *tmp);
    if (mask) rp_sampler_apply_mask(tmp, vocab, mask);
    return rp_sampler_sample_top(smp, &hp, tmp, NULL, 0, NULL, 0, p->step, lp, top);
}

/* Whether text is in the language of the constraint (kind, text,
 * allow_whitespace; complete: a whole output, else a prefix of one), by a
 * fresh matcher over the 256 single bytes: independent of any model's
 * vocabulary. */
static inline int ms_text_matches(rp_skind kind, const char *constraint, int allow_whitespace, const char *text,
                                  size_t len, int complete) {
    char bytes[256];
    const char *ptrs[256];
    size_t lens[256];
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, ptrs[i] = &bytes[i], lens[i] = 1;
    rp_err err;
    rp_svocab *v = rp_svocab_new(256, ptrs, lens, NULL, NULL, 0, &err);
    assert_non_null(v);
    rp_sopts so = {.allow_whitespace = allow_whitespace};
    rp_sgrammar *g = rp_sgrammar_compile(v, kind, constraint, strlen(constraint), &so, &err);
    if (!g) fail_msg("%s", err.msg);
    rp_smatcher *m = rp_smatcher_new(g, &err);
    assert_non_null(m);
    int ok = len == 0 || rp_smatcher_accept_bytes(m, text, len) == 0;
    if (ok && complete) ok = rp_smatcher_is_accepting(m);
    rp_smatcher_free(m);
    rp_sgrammar_release(g);
    rp_svocab_free(v);
    return ok;
}

#endif
