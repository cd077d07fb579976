/* The prompts `bench offline` and `bench serve` send, shared so that both
 * run the same workloads: random token ids (vLLM's and SGLang's random
 * dataset), prompts that share a prefix by group (SGLang's
 * generated-shared-prefix dataset, vLLM's prefix_repetition), and chat
 * conversations of several turns, each resending the whole history. The
 * last two exercise the prefix cache; `--disable-prefix-caching` on the
 * engine (bench offline, serve) is the A/B.
 *
 * A request's own lengths are uniform around --input-len and --output-len
 * (--random-range-ratio, vLLM's meaning) or, with --length-distribution
 * lognormal, long-tailed as real traffic is: lognormal with those means.
 *
 * Requests are numbered: turn t of conversation c is request t x N + c (N
 * = --num-prompts), so turn 0 of every conversation is the single-turn
 * workload. Everything is drawn from the seed with counter-based random
 * numbers (util/rng.h): the same options give the same prompts, whatever
 * order the requests finish in. */
#ifndef RP_CLI_BENCH_WORKLOAD_H
#define RP_CLI_BENCH_WORKLOAD_H

#include <stdint.h>
#include <stdio.h>

/* --length-distribution lognormal: a length is exp(mu + sigma z), z a
 * standard normal, mu = ln(len) - sigma^2 / 2 so that its mean is len;
 * rounded and clamped to [1, RP_BENCH_LOGNORMAL_CAP x len]. A fixed multiple
 * of the mean keeps the buffers and the context a run needs predictable
 * whatever sigma is: at the default sigma 1, 1 request in 200 reaches the cap
 * and the mean comes out 2% short of len (at 1.5, 13%; at 2, 32%).
 * RP_BENCH_LOGNORMAL_SIGMA, the default, gives a median of 0.61 x the mean
 * and a standard deviation of 1.3 x it, about the spread of chat traffic such
 * as ShareGPT's answers: a guess, not a fit (a trace's own sigma is the
 * standard deviation of ln(length)). */
typedef enum { RP_BENCH_LEN_UNIFORM, RP_BENCH_LEN_LOGNORMAL } rp_bench_len_dist;
#define RP_BENCH_LOGNORMAL_CAP 8          /* RP_BENCH_WORKLOAD_HELP says these three: */
#define RP_BENCH_LOGNORMAL_SIGMA 1.0      /*   change them together */
#define RP_BENCH_LOGNORMAL_SIGMA_MAX 2.0

typedef struct rp_bench_workload {
    long num_prompts;       /* single-turn: requests; multi-turn: conversations */
    long input_len;         /* a request's own new tokens (after the shared prefix; a turn's user tokens); */
    long output_len;        /*   lognormal: their means */
    double range;           /* --random-range-ratio, on input_len and output_len (uniform only) */
    rp_bench_len_dist length_dist;
    double sigma;           /* --length-sigma; 0: not given (lognormal: RP_BENCH_LOGNORMAL_SIGMA) */
    long shared_prefix_len; /* 0: no shared prefix */
    long num_groups;        /* prompts (conversations) c with the same c % num_groups share a prefix */
    long turns;             /* 1: single-turn */
    uint64_t seed;
    /* the command's random streams (its random workload's, unchanged by
     * this module): lengths of request i from (seed, in_stream, i) and
     * (seed, out_stream, i), its tokens from (seed, token_stream + i, k) */
    uint64_t in_stream, out_stream, token_stream;
} rp_bench_workload;

/* The options (codes 0x160-0x164), the help lines and their parsing: 1 if
 * opt was one, 0 if not, -1 on a bad value (message printed). */
#define RP_BENCH_WORKLOAD_LONG_OPTIONS                                                             \
    {"shared-prefix-len", required_argument, 0, 0x160}, {"num-groups", required_argument, 0, 0x161}, \
        {"multi-turn", required_argument, 0, 0x162}, {"length-distribution", required_argument, 0, 0x163}, \
        {"length-sigma", required_argument, 0, 0x164}
#define RP_BENCH_WORKLOAD_HELP                                                                          \
    "  --length-distribution D  uniform (as --random-range-ratio says) or lognormal: long-tailed\n"      \
    "                           lengths with means --input-len and --output-len, each at most 8x its\n"  \
    "                           mean (default uniform)\n"                                                 \
    "  --length-sigma S         lognormal: the standard deviation of ln(length), in (0, 2] (default 1:\n" \
    "                           median 0.61x the mean, 1 request in 200 at the cap; a guess at chat\n"   \
    "                           traffic such as ShareGPT's, not a fit)\n"                                 \
    "  --shared-prefix-len P    every prompt starts with its group's P random tokens, then its own\n"    \
    "                           --input-len (SGLang's generated-shared-prefix) (default 0: none)\n"       \
    "  --num-groups G           groups of prompts sharing a prefix: prompt i is in group i mod G, so\n"   \
    "                           the groups' requests interleave (default 1)\n"                            \
    "  --multi-turn T           each of --num-prompts conversations sends T requests, turn k+1 when\n"     \
    "                           turn k has finished: its prompt is turn k's, its answer, and\n"           \
    "                           --input-len new tokens (default 1: single requests)\n"
int rp_bench_workload_parse(rp_bench_workload *w, int opt, const char *arg, const char *cmd);
/* After parsing: options that need another (--num-groups without
 * --shared-prefix-len, more groups than prompts, --length-sigma without
 * lognormal) or exclude one (--random-range-ratio with lognormal). 0 or
 * RP_EXIT_USAGE. */
int rp_bench_workload_check(const rp_bench_workload *w, const char *cmd);

/* Requests in all: num_prompts x turns. */
long rp_bench_workload_requests(const rp_bench_workload *w);
/* The longest prompt a request can send: the prefix, every turn's new
 * tokens and every earlier answer, at their longest. */
long rp_bench_workload_max_prompt(const rp_bench_workload *w);
/* The longest output (--output-len stretched by --random-range-ratio, or
 * the lognormal's cap). */
long rp_bench_workload_max_output(const rp_bench_workload *w);
/* Prompt tokens all requests send together, at the lengths' means (for a
 * run-time estimate). */
double rp_bench_workload_prompt_tokens(const rp_bench_workload *w);

/* Request (conversation c, turn t): the tokens its prompt adds to the
 * conversation so far (turn 0: the group's prefix, then its own tokens;
 * later turns: the new user tokens, after the previous answer), written to
 * out (room for rp_bench_workload_max_prompt), and the count; ids below
 * vocab. */
int rp_bench_workload_new_tokens(const rp_bench_workload *w, long c, long t, int vocab, int32_t *out);
/* Its max_tokens. */
int rp_bench_workload_output(const rp_bench_workload *w, long c, long t);
/* A stand-in for the answer of request (c, t), n tokens, for a client that
 * does not see the ids the server generated (bench serve: the OpenAI API
 * returns text): the next turn resends these instead, so the server finds
 * the earlier prompt cached but not the answer. */
void rp_bench_workload_answer_stand_in(const rp_bench_workload *w, long c, long t, int n, int vocab, int32_t *out);

/* "random", "shared prefix 2048 x 64 groups", "4-turn chat", each followed
 * by ", lognormal lengths (sigma 1.00, at most 8x the mean)" when they are:
 * for the commands' first line. */
void rp_bench_workload_describe(const rp_bench_workload *w, char *buf, size_t n);

#endif
