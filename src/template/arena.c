/* The bump allocator that holds a compiled template and, separately, each
 * render's values: blocks of at least 64 KiB chained together, freed at once.
 * A limit on the bytes handed out turns a runaway template (a string doubled
 * in a loop) into an error instead of exhausting the machine. */
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

struct tpl_arena_block {
    tpl_arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

#define BLOCK_MIN_BYTES (64u << 10)

void *tpl_arena_alloc(tpl_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->limit_bytes && (n > a->limit_bytes || a->used_bytes > a->limit_bytes - n)) return NULL;
    tpl_arena_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > BLOCK_MIN_BYTES ? n : BLOCK_MIN_BYTES;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->used = 0;
        b->cap = cap;
        /* a big block goes behind the current one, so the current one's free
         * room stays in use for the small values that follow */
        if (a->head && n > BLOCK_MIN_BYTES / 2) {
            b->next = a->head->next;
            a->head->next = b;
        } else {
            b->next = a->head;
            a->head = b;
        }
    }
    void *p = b->data + b->used;
    b->used += n;
    a->used_bytes += n;
    memset(p, 0, n);
    return p;
}

void tpl_arena_free(tpl_arena *a) {
    for (tpl_arena_block *b = a->head, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    a->head = NULL;
    a->used_bytes = 0;
}
