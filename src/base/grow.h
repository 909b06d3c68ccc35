/*
 * grow.h: the one growable-array helper of the tree (every decoder's id and event buffers,
 * the index's scratch, the load tracker's slot arrays grow through it).
 *
 * Invariants: *cap only grows; on failure nothing changes (*buf and *cap as they were).
 * Growth doubles from 64 elements (amortised O(1) appends), is clamped to max elements, and
 * never overflows size_t. Ownership: *buf is the caller's (malloc'd or NULL), realloc'd here.
 * Threads: none; the caller's. Cost: O(1) when it fits, else one realloc.
 */
#ifndef KVR_CORE_GROW_H
#define KVR_CORE_GROW_H

#include <stddef.h>

/* Makes *buf (capacity *cap elements of elem bytes) hold at least need elements. KVR_OK, or
 * KVR_ENOMEM when need > max, the size overflows, or realloc fails. */
int kvr_grow(void **buf, size_t *cap, size_t need, size_t max, size_t elem);

#endif
