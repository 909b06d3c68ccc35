/*
 * yajl_arena.h: an arena behind yajl_alloc_funcs, shared by the JSON decoders.
 *
 * Invariants: blocks are bump-allocated from a chain of chunks, each block prefixed by its
 * size; free is a no-op; realloc grows the last block of the current chunk in place when it
 * fits and otherwise copies. kvr_yajl_arena_reset() empties the arena; when the previous use
 * needed several chunks it replaces them with one chunk as large as all of them together, so
 * a repeat of the same workload fits in one chunk and steady-state decoding allocates nothing.
 * Memory: the arena owns its chunks. Every pointer it handed out is invalid after reset or
 * deinit, so reset only once the yajl handle using it has been freed. What it keeps is set by
 * the largest single use (a small multiple of its peak, from chunk doubling), not by the number
 * of uses; it is kept until deinit.
 * Threads: none; an arena belongs to one thread at a time (yajl calls it synchronously).
 * Cost: O(1) per malloc/free, O(1) plus a copy of the old size per realloc that moves;
 * reset is O(1), or O(chunks) and one malloc after a use that overflowed the chunk.
 */
#ifndef KVR_WIRE_YAJL_ARENA_H
#define KVR_WIRE_YAJL_ARENA_H

#include <yajl/yajl_common.h>

struct kvr_yajl_arena_chunk;

typedef struct kvr_yajl_arena {
    struct kvr_yajl_arena_chunk *cur;  /* newest chunk (the one allocated from); NULL: none */
} kvr_yajl_arena_t;

/* An empty arena (allocates nothing until first used). */
void kvr_yajl_arena_init(kvr_yajl_arena_t *a);

/* Frees every chunk and leaves the arena empty and reusable; a NULL a is ignored. */
void kvr_yajl_arena_deinit(kvr_yajl_arena_t *a);

/* Makes all memory available again (invalidating every block); merges chunks into one. */
void kvr_yajl_arena_reset(kvr_yajl_arena_t *a);

/* The functions to pass to yajl_alloc(), with a as their context; a must outlive the handle. */
yajl_alloc_funcs kvr_yajl_arena_funcs(kvr_yajl_arena_t *a);

#endif
