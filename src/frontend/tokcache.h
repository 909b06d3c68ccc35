/*
 * tokcache.h: the tokenize cache. The OpenAI front end turns a text or chat prompt into token
 * ids by asking a worker (POST /tokenize); the answer is kept here under the XXH3-128 of the
 * content it was asked for, so a repeated prompt is routed without the round trip.
 * Invariants: tokens (the sum of max(1, n) over entries) <= cap_tokens; every entry is in
 * exactly one bucket chain and once in the LRU list (most recent first); a put of a key already
 * present replaces it; an entry larger than the whole budget is not kept. kvr_tokcache_verify
 * checks them.
 * Ownership: the cache owns copies of the ids; kvr_tokcache_get's pointer is valid until the
 * next put or deinit. Threads: one (the caller's). Cost: O(1) expected per get and put, plus
 * O(evicted) on a put; memory ~48 bytes + 4 per id per entry.
 * (Written by hand rather than with uthash: an LRU within a token budget needs the list next
 * to the table anyway, and the table is 40 lines.)
 */
#ifndef KVR_CORE_TOKCACHE_H
#define KVR_CORE_TOKCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

typedef struct kvr_tokcache_entry kvr_tokcache_entry_t;

typedef struct kvr_tokcache {
    /* private */
    kvr_tokcache_entry_t **buckets;
    size_t n_buckets; /* a power of two, or 0 */
    kvr_tokcache_entry_t *head, *tail;
    /* read-only for callers */
    size_t n_entries;
    uint64_t tokens, cap_tokens;
    uint64_t hits, misses, evictions, inserts;
} kvr_tokcache_t;

/* cap_tokens 0: nothing is kept. */
void kvr_tokcache_init(kvr_tokcache_t *c, uint64_t cap_tokens);
void kvr_tokcache_deinit(kvr_tokcache_t *c);
/* The ids cached under key (*n set), or NULL; counts a hit or a miss and refreshes the entry. */
const uint32_t *kvr_tokcache_get(kvr_tokcache_t *c, XXH128_hash_t key, size_t *n);
/* Keeps a copy of ids[0..n) under key, evicting least recently used entries to stay within the
 * budget. Out of memory: nothing is kept (the cache stays valid). */
void kvr_tokcache_put(kvr_tokcache_t *c, XXH128_hash_t key, const uint32_t *ids, size_t n);
/* KVR_OK, or KVR_EINVAL when an invariant above does not hold. */
int kvr_tokcache_verify(const kvr_tokcache_t *c);

#endif
