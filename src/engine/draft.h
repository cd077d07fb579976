/* The engine's side of speculative decoding (docs/speculative.md): before a
 * step, the drafts of each decoding request; after it, the verification of
 * each round. The drafters are modules of their own (ngram.h); what a round
 * keeps is decided here. */
#ifndef RP_ENGINE_DRAFT_H
#define RP_ENGINE_DRAFT_H

/* The most drafts a round carries (issue 38: k in 1..8), and the default. */
#define RP_SPEC_MAX_K 8
#define RP_SPEC_DEFAULT_K 4
/* Speculation runs while at most this many requests decode: verifying k + 1
 * positions costs the products k + 1 rows a sequence, which a large decode
 * batch, compute-bound already, pays in full (a verify-shaped step of 5
 * tokens: 1.43x a decode step at batch 1, 1.53x at batch 32, llama3-8b on an
 * H100: bench/RESULTS.md). Above it, rounds stop until the batch shrinks.
 * Also what the logits rows are sized for. */
#define RP_SPEC_MAX_SEQS 32

struct rp_engine;
struct rp_step;

/* Proposes each decoding request's drafts for the next step into its tokens
 * after its length (request.h's num_draft), or none: speculation off, more
 * than RP_SPEC_MAX_SEQS decoding, the last token not yet read, no room
 * before max_tokens, its rounds not paying off (spec_policy.h), or no
 * proposal. */
void rp_engine_propose_drafts(struct rp_engine *e);

/* Verifies item i of a completed step, a round with drafts: samples the
 * target at each position as decoding without drafts would (the request's
 * seed, counter = output index; on the device where no request of the step
 * has penalties, since then no row depends on the drafts kept before it;
 * else the host sampler, penalties over the kept drafts), keeps a draft while
 * it equals that token, and hands the kept drafts and the token after them
 * to the request (rp_engine_on_sampled: a stop inside the run ends it
 * there). For drafts proposed without a distribution (n-gram) this is
 * Leviathan et al.'s rule with q a point mass: a draft is kept with
 * probability p(d), and for a given seed the output is token for token that
 * of decoding without drafts. The rejected drafts' K/V stay in the pages, to
 * be overwritten: cached drops to the kept ones. */
void rp_engine_verify_round(struct rp_engine *e, const struct rp_step *st, int i);

#endif
