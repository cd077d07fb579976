/* The pushdown automaton over bytes that both the matcher and the mask
 * precomputation run (pda.c).
 *
 * A parse hypothesis is a stack of grammar positions; stacks are persistent
 * and hash-consed: a node is (position, parent node), so equal stacks are the
 * same node id and a set of hypotheses is a sorted set of node ids (an
 * "item set", itself interned as a state id). The top of every item is a
 * byte-set element; advancing by a byte moves each item whose set holds it
 * one element on and closes over rule references (push) and rule ends
 * (pop). A reference in tail position pushes nothing (the rule returns
 * straight to its caller's caller), so X* (right recursion) keeps the stack
 * flat. Transitions (state, byte) -> state are memoised per state.
 *
 * For precomputation the bottom of a stack may be a marker "the unknown
 * caller of rule r at level l" instead of the root: popping it continues at
 * every place r is referenced (level l+1) up to the maximum level, where the
 * walk "escapes" (what follows is unknown). Items above a level >= 1 marker
 * are tainted: they are guesses about the caller. */
#ifndef RP_STRUCTURED_PDA_H
#define RP_STRUCTURED_PDA_H

#include <stdint.h>

#include "structured/sgrammar.h"

enum {
    PDA_ACCEPT = 1,     /* the root rule can end here */
    PDA_POP0 = 2,       /* the level-0 marker was popped (the item's rule can end here) */
    PDA_ESCAPE = 4,     /* a hypothesis popped past the last level */
    PDA_TEND = 8,       /* a tainted hypothesis ended the root rule */
    PDA_UNTAINTED = 16, /* some item sits above a root or level-0 marker */
    PDA_TAINTED = 32,   /* some item sits above a level >= 1 marker */
};
#define PDA_DEAD (-1)
#define PDA_ROOT 0 /* node id of the empty stack */
/* Memoised transition tables kept (1 KiB each): a walk through a long
 * counted repetition makes a new state per byte, and memory stays bounded
 * by dropping the memo (not the states) when it is full. */
#define PDA_MAX_TRANS 65536
/* A state of more parse hypotheses than this is taken as dead: an ambiguous
 * grammar (s ::= "a" s "b" | "a" s "c" | "") can double them every byte,
 * and a generation then ends rather than the host's memory and time. */
#define PDA_MAX_ITEMS 10000

/* A counted repetition in progress is a stack node whose position is
 * n_elems + v: v names (repetition element q, iterations still needed,
 * iterations still allowed). For classification (clip > 0) the counts are
 * clipped to clip, with PDA_GE marking "at least": a walk reaching the end
 * of a clipped count does not know what follows and escapes. */
#define PDA_GE (1 << 24)

typedef struct pda {
    const sg_grammar *g;
    int max_level;
    int clip; /* 0: exact counts (matching); > 0: clipped (classification) */
    /* counted-repetition nodes */
    int32_t *vq, *vneed, *vroom; /* vroom -1: unbounded */
    int n_v, cap_v;
    int32_t *vtab;
    uint32_t vtab_mask;
    /* nodes */
    int32_t *npos, *npar;
    uint8_t *nlev;
    uint32_t *nvisit;
    int n_nodes, cap_nodes;
    int32_t *ntab; /* open addressing: node id + 1, 0 empty */
    uint32_t ntab_mask;
    uint32_t gen;
    /* states */
    int32_t *soff; /* items of state s: sitems[soff[s] .. soff[s+1]) */
    int32_t *sitems;
    uint8_t *sflags;
    int32_t **trans; /* per state, 256 entries, from its second byte stepped; -2 unknown */
    int16_t *t1_byte; /* per state: the one byte stepped so far (-1 none) ... */
    int32_t *t1_to;   /* ... and where it went */
    int n_trans;     /* tables allocated; past PDA_MAX_TRANS all are dropped */
    int n_states, cap_states;
    long n_sitems, cap_sitems;
    int32_t *stab;
    uint32_t stab_mask;
    /* scratch */
    int32_t *work;
    long n_work, cap_work;
    int32_t *items;
    int n_items, cap_items;
    int flags;
    int oom;
    int too_many; /* this closure passed PDA_MAX_ITEMS */
} pda;

int pda_init(pda *p, const sg_grammar *g, int max_level, int clip);
/* The node (pos, par), made if new. */
int32_t pda_node(pda *p, int32_t pos, int32_t par);
/* The node of a counted repetition (q, need, room) above parent par. */
int32_t pda_rep_node(pda *p, int32_t q, int32_t need, int32_t room, int32_t par);
/* The state {pos above the repetition node (q, need, room) above the level-0
 * marker of q's rule} (classification of a repetition's body). */
int32_t pda_start_in_rep(pda *p, int32_t pos, int32_t q, int32_t need, int32_t room);
void pda_free(pda *p);
/* The state of the whole grammar at its start. */
int32_t pda_start(pda *p);
/* The state {position pos, level-0 marker of its rule} (precomputation). */
int32_t pda_start_at(pda *p, int32_t pos);
/* The singleton state {node}. */
int32_t pda_single(pda *p, int32_t node);
/* Next state, or PDA_DEAD. Memoised. */
int32_t pda_step(pda *p, int32_t s, uint8_t byte);


#endif
