/* The n-gram drafter for speculative decoding ("prompt lookup decoding",
 * `--speculative-method ngram`): it proposes a sequence's next tokens by
 * finding an earlier place where the sequence's last n tokens occurred and
 * copying what followed them there. No model, no GPU: it pays off where the
 * output repeats its context (code being edited, extraction, answers quoting
 * the document, chat history) and costs a few hash lookups a step where it
 * does not.
 *
 * What it proposes, for the tokens t[0..N) so far (prompt and output), match
 * lengths min_n..max_n and k tokens wanted:
 *   for n = max_n down to min_n (the longest match wins): an occurrence of
 *   the suffix t[N-n..N) is an equal t[e-n..e) with e < N, i.e. one that
 *   ends before the suffix does and so is followed by at least t[e]; the
 *   most recent one (largest e) is taken, and the proposal is the k tokens
 *   that follow it: t[e], t[e + 1], ..., and past the sequence's end the
 *   proposal's own first tokens again (out[i] = out[i - (N - e)]: the text
 *   is taken to go on repeating with period N - e, as an overlapping copy
 *   does). No occurrence at any n: nothing is proposed.
 * The results are exactly those of that brute-force search over t[0..N),
 * whatever the history of appends and truncations (tests/test_ngram.c
 * checks it).
 *
 * The options, as vLLM names them: min_n and max_n are prompt_lookup_min and
 * prompt_lookup_max, 1 <= min_n <= max_n <= RP_NGRAM_MAX_N; k is
 * num_speculative_tokens (issue 38's 1..8; any k >= 0 works here).
 * Differences from vLLM a user could see: vLLM defaults both lengths to 5
 * ("arbitrarily chosen", says its source) where replay uses 2 and 4 (below);
 * and among occurrences of the longest match vLLM's v1 proposer takes the
 * EARLIEST, replay the most recent (issue 38: "the longest recent n-gram
 * match"), on the guess that what the text did last says most about what it
 * does next (the latest version of an edited line). Not yet measured
 * against vLLM's choice. In text repeating with a period p < k the most
 * recent occurrence is p tokens back; the overlapping copy still proposes
 * k tokens (a model stuck in a loop of p tokens: a one-token loop gave 1
 * draft a round before, k now).
 *
 * How: one hash table per match length n, keyed by the n tokens, holding each
 * distinct n-gram's most recent end position, and for every end position the
 * previous occurrence of the same n-gram. The sequence only grows at its end
 * and shrinks from it (rp_ngram_truncate: rejected drafts, preemption), so
 * the occurrences form stacks: forgetting a position restores exactly what
 * the table held before it was learned, and "most recent" stays exact after
 * any truncation. Keys are compared token by token on every hash hit, so a
 * hash collision costs a compare, never a wrong proposal.
 *
 * Costs, independent of the sequence's length: learning one token is
 * max_n hash rounds and one expected-O(1) lookup per length (plus, where the
 * n-gram occurred before, a compare of its n tokens); proposing is the same
 * rounds, a lookup per length down to the first match, one compare, and the
 * copy (test_ngram's long sequence prints the time a step). Forgetting a
 * token is O(1) per length and reads no tokens. Nothing is allocated after
 * rp_ngram_new. Memory: 24 to 28 bytes x max_tokens x (max_n - min_n + 1),
 * e.g. 2.4 MB for a 32k context at the default lengths. Not thread-safe:
 * one index per sequence, used by one thread. */
#ifndef RP_ENGINE_NGRAM_H
#define RP_ENGINE_NGRAM_H

#include <stdint.h>

#include "util/err.h"

/* The longest match length: a match of 16 tokens already pins the place in
 * any text, and the cost of a step grows with max_n. */
#define RP_NGRAM_MAX_N 16

/* replay's defaults (vLLM's are 5 and 5). A 1-token match is found almost
 * everywhere and mostly drafts noise, which the verify step then pays to
 * compute; 2 tokens are already specific in a 100k+ vocabulary. Beyond 4, a
 * longer match mostly finds the place the 4-token one finds, and requiring 5
 * (vLLM) gives up the shorter repeats. Chosen by that reasoning, not yet by
 * measured acceptance (bench/RESULTS.md will say). */
#define RP_NGRAM_DEFAULT_MIN 2
#define RP_NGRAM_DEFAULT_MAX 4

typedef struct rp_ngram rp_ngram;

/* Checks the match lengths, in vLLM's words ("prompt_lookup_min=0 must be
 * > 0"), naming the parameter at fault (err->param). Returns 0 or RP_ERR. */
int rp_ngram_validate(int min_n, int max_n, rp_err *err);

/* An empty index for one sequence of at most max_tokens tokens (its
 * capacity: the context length, or the request's prompt + max_tokens);
 * everything is allocated here. Returns NULL when the lengths fail
 * rp_ngram_validate, when max_tokens < 1, or when memory is short. */
rp_ngram *rp_ngram_new(int min_n, int max_n, int max_tokens);
void rp_ngram_free(rp_ngram *g);

/* Empties the index for another sequence: O(tokens it held). */
void rp_ngram_reset(rp_ngram *g);

/* The index learns the sequence up to n tokens: tokens[0..n) is the whole
 * sequence so far, n >= rp_ngram_len(g) (asserted), and tokens[0..len) must
 * be the tokens it was given before (they are not stored, only read when
 * appending and proposing). Returns 0, or RP_ERR when n is more than the
 * index was made for (learning nothing): the caller sized it wrongly and may
 * stop drafting for this sequence. */
int rp_ngram_append(rp_ngram *g, const int32_t *tokens, int n, rp_err *err);

/* The sequence shrank to n tokens (rejected drafts, preemption): the index
 * forgets every position from n on, exactly. A no-op when n >= len. */
void rp_ngram_truncate(rp_ngram *g, int n);

/* Tokens learned: the n that the next propose must pass. */
int rp_ngram_len(const rp_ngram *g);

/* Proposes up to k tokens to follow tokens[0..n) (see the top of this file)
 * into out[0..k); returns how many, 0..k. n must be rp_ngram_len(g)
 * (asserted): the index holds the sequence's earlier positions and reads
 * tokens only to compare and copy. */
int rp_ngram_propose(const rp_ngram *g, const int32_t *tokens, int n, int k, int32_t *out);

/* The 32-bit hash the index files t[0..n) under (1 <= n <= RP_NGRAM_MAX_N).
 * For tests: they look for colliding n-grams with it, which must cost a
 * token compare and never change a proposal. */
uint32_t rp_ngram_hash(const int32_t *tokens, int n);

/* Checks every invariant of the index against tokens[0..len): each position
 * learned once, under the right key, in order. O(len x lengths + table
 * size); returns 0, or RP_ERR with the first broken one. For tests. */
int rp_ngram_check(const rp_ngram *g, const int32_t *tokens, rp_err *err);

#endif
