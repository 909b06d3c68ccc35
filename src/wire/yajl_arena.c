/*
 * yajl_arena.c: the arena behind yajl_alloc_funcs (see yajl_arena.h for the contract).
 *
 * Layout: a chunk is a header (previous chunk, capacity, bytes used) followed by its payload;
 * a block is a size_t header (the size asked for) followed by the caller's bytes, both
 * rounded to max_align_t. A new chunk is at least ARENA_MIN_CHUNK and doubles the previous
 * one's capacity, so a large use needs O(log size) chunks.
 */
#include "wire/yajl_arena.h"

#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_ALIGN (alignof(max_align_t))
#define ARENA_MIN_CHUNK ((size_t)16 << 10)

typedef struct kvr_yajl_arena_chunk {
    struct kvr_yajl_arena_chunk *prev;
    size_t cap;   /* payload bytes after the header */
    size_t used;
} chunk_t;

static size_t align_up(size_t n)
{
    return (n + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1);
}

#define CHUNK_HDR align_up(sizeof(chunk_t))
#define BLOCK_HDR align_up(sizeof(size_t))

static unsigned char *chunk_data(chunk_t *c)
{
    return (unsigned char *)c + CHUNK_HDR;
}

static chunk_t *chunk_new(size_t cap, chunk_t *prev)
{
    if (cap > SIZE_MAX - CHUNK_HDR)
        return NULL;
    chunk_t *c = malloc(CHUNK_HDR + cap);
    if (c == NULL)
        return NULL;
    c->prev = prev;
    c->cap = cap;
    c->used = 0;
    return c;
}

static void chunks_free(chunk_t *c)
{
    while (c != NULL) {
        chunk_t *prev = c->prev;
        free(c);
        c = prev;
    }
}

static void *arena_malloc(void *ctx, size_t sz)
{
    kvr_yajl_arena_t *a = ctx;
    if (sz > SIZE_MAX / 2)
        return NULL;
    size_t need = BLOCK_HDR + align_up(sz);
    chunk_t *c = a->cur;
    if (c == NULL || c->cap - c->used < need) {
        size_t cap = ARENA_MIN_CHUNK;
        if (c != NULL && c->cap > cap / 2)
            cap = c->cap * 2;
        if (cap < need)
            cap = need;
        c = chunk_new(cap, a->cur);
        if (c == NULL)
            return NULL;
        a->cur = c;
    }
    unsigned char *p = chunk_data(c) + c->used;
    memcpy(p, &sz, sizeof sz);
    c->used += need;
    return p + BLOCK_HDR;
}

static void *arena_realloc(void *ctx, void *ptr, size_t sz)
{
    kvr_yajl_arena_t *a = ctx;
    if (ptr == NULL)
        return arena_malloc(ctx, sz);
    unsigned char *blk = (unsigned char *)ptr - BLOCK_HDR;
    size_t old;
    memcpy(&old, blk, sizeof old);
    if (sz <= old)
        return ptr;
    chunk_t *c = a->cur;
    if (sz <= SIZE_MAX / 2 && blk + BLOCK_HDR + align_up(old) == chunk_data(c) + c->used) {
        size_t grow = align_up(sz) - align_up(old);
        if (c->cap - c->used >= grow) {  /* the last block: grow in place */
            c->used += grow;
            memcpy(blk, &sz, sizeof sz);
            return ptr;
        }
    }
    void *p = arena_malloc(ctx, sz);
    if (p != NULL)
        memcpy(p, ptr, old);
    return p;
}

static void arena_free(void *ctx, void *ptr)
{
    (void)ctx;
    (void)ptr;
}

void kvr_yajl_arena_init(kvr_yajl_arena_t *a)
{
    a->cur = NULL;
}

void kvr_yajl_arena_deinit(kvr_yajl_arena_t *a)
{
    if (a == NULL)
        return;
    chunks_free(a->cur);
    a->cur = NULL;
}

void kvr_yajl_arena_reset(kvr_yajl_arena_t *a)
{
    chunk_t *c = a->cur;
    if (c == NULL)
        return;
    if (c->prev == NULL) {
        c->used = 0;
        return;
    }
    size_t total = 0;
    for (; c != NULL; c = c->prev)
        total += c->cap;
    chunks_free(a->cur);
    a->cur = chunk_new(total, NULL);  /* NULL is fine: the next malloc starts afresh */
}

yajl_alloc_funcs kvr_yajl_arena_funcs(kvr_yajl_arena_t *a)
{
    yajl_alloc_funcs f = {arena_malloc, arena_realloc, arena_free, a};
    return f;
}
