/*
 * inflight.h (private to the tree; not installed): whether the router's in-flight credits came
 * true (core/inflight.c). A booking routed with blocks credited because requests in flight on
 * its rank were computing them (kvr_select_candidate_t.predicted_blocks) is watched until the
 * rank's KV events report every credited block (a confirmation), or the booking ends or 30 s
 * pass without that (an expiry): the two counts say whether crediting blocks before their
 * events arrive is sound on this fleet.
 * Invariants: at most KVR_INFLIGHT_WATCH entries, oldest first; an entry leaves once, counted
 * once as confirmed, expired or dropped (a newer one needed its room, or its worker left).
 * Ownership: the watch owns its entries and its scratch; it reads the index and the load
 * tracker (the booking's prompt hashes) it is given. Threads: the router's (an index reader).
 * Cost: a watch is O(1); a check (at most once a second) looks up each watched booking's
 * credited prefix, O(its blocks).
 */
#ifndef KVR_CORE_INFLIGHT_H
#define KVR_CORE_INFLIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "core/load.h"
#include "kvrouter/index.h"

#define KVR_INFLIGHT_WATCH 1024
#define KVR_INFLIGHT_WINDOW_MS 30000 /* an unconfirmed credit expires this long after booking */
#define KVR_INFLIGHT_CHECK_MS 1000   /* checks at most this often */

typedef struct kvr_inflight_entry {
    kvr_req_handle_t booking;
    kvr_worker_t worker;
    uint32_t depth; /* the credited prefix: reported + predicted blocks */
    uint64_t booked_ms;
} kvr_inflight_entry_t;

typedef struct kvr_inflight {
    /* read-only */
    uint64_t confirmed, expired, dropped;
    size_t n;
    /* private */
    kvr_inflight_entry_t e[KVR_INFLIGHT_WATCH]; /* a ring from head */
    size_t head;
    uint64_t next_check_ms;
    uint64_t *seq; /* the scratch of a check */
    size_t cap_seq;
    kvr_lookup_t lk;
} kvr_inflight_t;

void kvr_inflight_init(kvr_inflight_t *w);
void kvr_inflight_deinit(kvr_inflight_t *w);
/* Watches a booking credited up to depth blocks on worker (a full watch drops its oldest). */
void kvr_inflight_watch(kvr_inflight_t *w, kvr_req_handle_t booking, kvr_worker_t worker,
                        uint32_t depth, uint64_t now_ms);
/* Confirms the bookings ix now reports in full, expires those ended or past the window. */
void kvr_inflight_check(kvr_inflight_t *w, kvr_index_t *ix, const kvr_load_t *lt,
                        uint64_t now_ms);
/* Drops the entries of a worker (every rank) that left the fleet. */
void kvr_inflight_forget(kvr_inflight_t *w, uint64_t worker_id);

#endif /* KVR_CORE_INFLIGHT_H */
