/*
 * approx.h (private to the tree; not installed): approximate mode (core/approx.c). No KV
 * events: the router records its own routing decisions as if the chosen worker had cached the
 * prompt, with a TTL and a size bound.
 *
 * Invariants: core/approx.c states them; kvr_approx_verify checks them.
 * Ownership: borrows the index (which must outlive it) and is its writer while it records.
 * Threads: the index's writer thread. Time is passed in (milliseconds, any monotonic origin).
 * Cost: record O(blocks log size); expire O(log size) per expired entry.
 */
#ifndef KVR_CORE_APPROX_H
#define KVR_CORE_APPROX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/index.h"

typedef struct kvr_approx_config {
    /* public */
    uint64_t ttl_ms;            /* 0 = 120000 */
    size_t max_tree_size;       /* pairs; 0 = 1 << 20 */
    double prune_target_ratio;  /* (0, 1]; 0 = 0.8 */
} kvr_approx_config_t;

typedef struct kvr_approx kvr_approx_t;

/* Validates cfg (KVR_EINVAL naming the field in *field when non-NULL). */
int kvr_approx_config_validate(const kvr_approx_config_t *cfg, const char **field);
kvr_approx_t *kvr_approx_new(kvr_index_t *ix, const kvr_approx_config_t *cfg, int *status);
void kvr_approx_free(kvr_approx_t *ap);
/* Records that worker was sent a prompt with these hashes at now_ms; refreshes the TTL of
 * blocks already recorded; prunes to prune_target_ratio * max_tree_size when over size. */
int kvr_approx_record(kvr_approx_t *ap, kvr_worker_t worker, const uint64_t *lbh,
                      const uint64_t *seq, size_t n, uint64_t now_ms);
/* Removes entries whose TTL has passed. Returns the number removed. */
size_t kvr_approx_expire(kvr_approx_t *ap, uint64_t now_ms);
/* The earliest pending expiry (UINT64_MAX when none). */
uint64_t kvr_approx_next_expiry(const kvr_approx_t *ap);
size_t kvr_approx_size(const kvr_approx_t *ap);
/* Drops every entry of worker_id (all ranks) from the tracker and the index. */
int kvr_approx_remove_worker(kvr_approx_t *ap, uint64_t worker_id);
/* The same for one rank of a worker. */
int kvr_approx_remove_rank(kvr_approx_t *ap, kvr_worker_t w);
/* A rank's cache capacity in blocks (0 = unknown: only the TTL and the size bound apply).
 * With one, the rank holds at most that many recorded blocks: recording more evicts its least
 * recently recorded ones (of one decision, the deepest first), as its engine's LRU would, so
 * the router stops crediting it with prefixes it has evicted. */
int kvr_approx_set_capacity(kvr_approx_t *ap, kvr_worker_t w, uint64_t blocks);
/* A request's life on a rank with a known capacity, as its engine's cache sees it:
 *   begin   routed: its blocks recorded (kvr_approx_record), kept under key (the load tracker's
 *           handle, never 0); a key whose slot holds an unended request ends that one first;
 *   start   its engine admitted it (the first token): its blocks held (not evictable) until
 *           it ends, as an engine holds a running request's blocks (recorded again first
 *           when one was evicted since the routing: the engine computes it again);
 *   output  it filled an output block: held too, and evictable once it ends, though no prompt
 *           asks for it;
 *   end     finished: its blocks touched again, outputs first, then its prompt deepest first,
 *           as an engine frees them into its LRU.
 * KVR_ENOTFOUND: no request under key. */
int kvr_approx_begin(kvr_approx_t *ap, uint64_t key, kvr_worker_t worker, const uint64_t *lbh,
                     const uint64_t *seq, size_t n, uint64_t now_ms);
int kvr_approx_start(kvr_approx_t *ap, uint64_t key, uint64_t now_ms);
int kvr_approx_output(kvr_approx_t *ap, uint64_t key);
int kvr_approx_end(kvr_approx_t *ap, uint64_t key, uint64_t now_ms);
/* Blocks evicted by capacity so far. */
uint64_t kvr_approx_evicted(const kvr_approx_t *ap);
/* Checks the invariants core/approx.c states (KVR_OK; KVR_EINVAL with msg; KVR_ENOMEM). O(size
 * x ranks); for tests. Not const: it marks timers while it runs, and leaves them as they were. */
int kvr_approx_verify(kvr_approx_t *ap, char *msg, size_t msg_len);

#endif /* KVR_CORE_APPROX_H */
