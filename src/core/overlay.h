/*
 * overlay.h (private to the tree; not installed): ranks routed approximately inside a router
 * that learns from KV events (core/overlay.c). A rank whose events stopped saying what its
 * engine holds (the front end found its predictions drifting) is routed, until they agree
 * again, on what the router itself sent it: its decisions are recorded in an index of its own
 * (approximate mode's model, core/approx.h: TTL, capacity LRU, the request's life), and its
 * overlap is read there instead of in the event-fed index, which goes on being fed so that
 * agreement can be judged.
 * Invariants: a rank is listed at most once; only listed ranks have entries in the overlay's
 * index; unlisting a rank drops its entries.
 * Ownership: the overlay owns its index, its approx model and its lookup scratch. Threads: the
 * router's (one). Cost: a lookup of the overlay's index per routed request while any rank is
 * listed; nothing otherwise.
 */
#ifndef KVR_CORE_OVERLAY_H
#define KVR_CORE_OVERLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/approx.h"
#include "kvrouter/index.h"

typedef struct kvr_overlay kvr_overlay_t;

/* max_pairs bounds the overlay's index (and its recorded pairs); NULL when out of memory. */
kvr_overlay_t *kvr_overlay_new(const kvr_approx_config_t *ac, size_t max_pairs,
                               uint32_t max_workers, int *status);
void kvr_overlay_free(kvr_overlay_t *ov);

/* Lists w (capacity: its KV cache in blocks, 0 = unknown) or unlists it (its entries go). */
int kvr_overlay_set(kvr_overlay_t *ov, kvr_worker_t w, bool on, uint64_t capacity);
bool kvr_overlay_has(const kvr_overlay_t *ov, kvr_worker_t w);
size_t kvr_overlay_n(const kvr_overlay_t *ov);
kvr_worker_t kvr_overlay_rank(const kvr_overlay_t *ov, size_t i);
/* Unlists every rank of a worker. */
void kvr_overlay_remove_worker(kvr_overlay_t *ov, uint64_t worker_id);
/* The capacity of a listed rank changed. */
void kvr_overlay_set_capacity(kvr_overlay_t *ov, kvr_worker_t w, uint64_t blocks);
/* The listed ranks' matches for a prompt's sequence hashes (valid until the next lookup). */
const kvr_lookup_t *kvr_overlay_lookup(kvr_overlay_t *ov, const uint64_t *seq, size_t n,
                                       int *status);
/* The approximate model (record, the request's life, expiry). */
kvr_approx_t *kvr_overlay_approx(kvr_overlay_t *ov);

#endif
