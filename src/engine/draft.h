/* The engine's side of speculative decoding (docs/speculative.md): before a
 * step, the drafts of each decoding request; after it, the verification of
 * each round. The drafters are modules of their own (ngram.h); what a round
 * keeps is decided here. */
#ifndef RP_ENGINE_DRAFT_H
#define RP_ENGINE_DRAFT_H

/* The most drafts a round carries (issue 38: k in 1..8), and the default. */
#define RP_SPEC_MAX_K 8
#define RP_SPEC_DEFAULT_K 4
/* Speculation runs while the decoding requests' rounds would carry at
 * most this many rows (decoding x (k + 1)); above it every request decodes
 * plainly until the batch shrinks. A round's products cost k + 1 rows a
 * sequence, which a large batch, compute-bound already, pays in full:
 * llama3-8b on an H100 with half the drafts right (A = 0.5) gains 1.30x at
 * 16 x 5 rows, 1.13x at 32 x 5, 1.37x at 32 x 3, 1.12x at 64 x 3, and loses
 * from 64 x 5 (0.85x) and 128 x 3 (0.89x) on; at A = 0.7 it gains to 64 x
 * 5 (1.23x) and 128 x 3 (1.12x) (bench/RESULTS.md, "when to stop
 * speculating"). 192 keeps every measured gain at A = 0.5. Also what the
 * engine's logits rows and the draft model's batch are sized for. */
#define RP_SPEC_MAX_ROWS 192
/* The most requests that draft together with k drafts each. */
static inline int rp_spec_max_seqs(int k) { return RP_SPEC_MAX_ROWS / (k + 1); }

struct rp_engine;
struct rp_step;

/* Proposes each decoding request's drafts for the next step into its tokens
 * after its length (request.h's num_draft), or none: speculation off, more
 * than rp_spec_max_seqs(k) decoding, the last token not yet read, no room
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
