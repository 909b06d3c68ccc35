/*
 * queue.h (private to the tree; not installed): requests waiting while every eligible worker
 * is busy, reference 5.7 (core/queue.c). Its configuration and counters are public
 * (kvrouter/sched.h, which owns the queue).
 *
 * Invariants: queue.c states them; kvr_queue_verify checks them.
 * Ownership: kvr_queue_new allocates everything; items are copied in. Threads: one owner
 * thread. Time is passed in. Cost: push, pop, remove, expire O(log n).
 */
#ifndef KVR_CORE_QUEUE_H
#define KVR_CORE_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/sched.h"

/* What the caller queues (copied in). */
typedef struct kvr_queue_item {
    /* public */
    uint64_t isl_tokens;
    uint64_t cost_tokens;     /* wspt: uncached tokens on the best eligible worker (0 reads 1) */
    double priority_jump;     /* finite; seconds of head start (fcfs, lcfs), weight (wspt) */
    uint32_t strict_priority; /* higher tiers always dispatch first */
    uint64_t timeout_ms;      /* queue deadline = enqueue time + timeout; 0 = none */
    void *user;               /* opaque, returned as given */
} kvr_queue_item_t;

/* Names one queued request; stale handles (dispatched, expired, removed) are detected. Never 0. */
typedef uint64_t kvr_queue_handle_t;

typedef struct kvr_queue_entry {
    /* read-only */
    kvr_queue_item_t item;
    kvr_queue_handle_t handle;
    uint64_t seq;            /* enqueue order */
    uint64_t enqueued_ms;
    uint64_t deadline_ms;    /* UINT64_MAX = none */
    double score;            /* policy_score */
} kvr_queue_entry_t;

typedef struct kvr_queue kvr_queue_t;

int kvr_queue_config_validate(const kvr_queue_config_t *cfg, const char **field);
/* NULL and *status = KVR_EINVAL / KVR_ENOMEM on failure. */
kvr_queue_t *kvr_queue_new(const kvr_queue_config_t *cfg, int *status);
void kvr_queue_free(kvr_queue_t *q);
/* Runtime limits (e.g. per-worker limits times discovered workers): max_requests in
 * [1, capacity] (0 = capacity), max_pending_isl_tokens 0 = unlimited. KVR_ERANGE otherwise. */
int kvr_queue_set_limits(kvr_queue_t *q, size_t max_requests, uint64_t max_pending_isl_tokens);
/* KVR_OK (handle may be NULL); KVR_EQUEUEFULL (counted in rejected) when max_requests are
 * queued or the pending ISL tokens already reach their limit (the crossing request is accepted);
 * KVR_EINVAL (priority_jump not finite). */
int kvr_queue_push(kvr_queue_t *q, const kvr_queue_item_t *item, uint64_t now_ms,
                   kvr_queue_handle_t *handle);
/* The best entry: higher (strict_priority, score), then earlier seq. KVR_ENOTFOUND if empty. */
int kvr_queue_peek(const kvr_queue_t *q, kvr_queue_entry_t *out);
int kvr_queue_pop(kvr_queue_t *q, kvr_queue_entry_t *out);              /* counts dispatched */
int kvr_queue_remove(kvr_queue_t *q, kvr_queue_handle_t h, kvr_queue_entry_t *out); /* cancelled */
/* Pops one entry whose deadline is <= now_ms (earliest first); KVR_ENOTFOUND when none. */
int kvr_queue_expire(kvr_queue_t *q, uint64_t now_ms, kvr_queue_entry_t *out);
uint64_t kvr_queue_next_deadline(const kvr_queue_t *q); /* UINT64_MAX when none */
size_t kvr_queue_len(const kvr_queue_t *q);
void kvr_queue_stats(const kvr_queue_t *q, kvr_queue_stats_t *out);
/* Checks both heaps, handles, free list, gauges and counters; KVR_EINVAL with msg otherwise. */
int kvr_queue_verify(const kvr_queue_t *q, char *msg, size_t msg_len);

#endif /* KVR_CORE_QUEUE_H */
