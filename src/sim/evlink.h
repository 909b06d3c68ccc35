/*
 * evlink.h: the simulator's model of the link from each engine's KV-event publisher to the
 * router (`kvrouter sim --event-delay-ms / --event-jitter-ms / --event-loss /
 * --event-replay-ms`). In a real fleet events reach the index late (ZeroMQ, NATS, a busy
 * indexer) and sometimes not at all until the router notices the gap and replays them; the
 * simulator otherwise applies them at the instant the engine changes.
 *
 * Model, per worker, in publication order (a publisher's batches are never reordered):
 *   delivery = publication + delay + jitter x U(-1, 1) (at least publication);
 *   a batch is lost with probability `loss`; the router's gap detection and replay bring it
 *   back replay_ms after its publication (or its normal delivery, if later);
 *   a batch is never delivered before the one published before it (a lost batch holds back
 *   the ones behind it, as an in-order replay does).
 *
 * Ownership: the link copies each batch (its blocks or removed hashes) until it is taken.
 * Invariants (kvr_evlink_verify): each worker's queue is in publication order with
 * non-decreasing delivery times. Threads: one. Memory: the batches in flight. Cost: O(1)
 * amortised per push and pop, plus the copy.
 */
#ifndef KVR_CORE_EVLINK_H
#define KVR_CORE_EVLINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"

typedef struct kvr_evlink_config {
    double delay_ms;  /* >= 0 */
    double jitter_ms; /* >= 0, <= delay_ms */
    double loss;      /* [0, 1) */
    double replay_ms; /* >= 0: a lost batch's recovery */
    uint64_t seed;
} kvr_evlink_config_t;

typedef struct kvr_evlink_stats {
    uint64_t batches;    /* pushed */
    uint64_t lost;       /* of which lost and replayed */
    double delay_sum_ms; /* delivery - publication, summed over delivered batches */
} kvr_evlink_stats_t;

typedef struct kvr_evlink kvr_evlink_t;

/* NULL on a bad config (*status KVR_EINVAL, *field names it) or KVR_ENOMEM. */
kvr_evlink_t *kvr_evlink_new(uint32_t n_workers, const kvr_evlink_config_t *cfg, int *status,
                             const char **field);
void kvr_evlink_free(kvr_evlink_t *l);
/* NULL when cfg is valid, else the problem, naming the field. */
const char *kvr_evlink_config_check(const kvr_evlink_config_t *cfg);
/* Whether cfg delays or loses anything (else the caller applies events at once). */
bool kvr_evlink_config_active(const kvr_evlink_config_t *cfg);
/* Queues worker w's batch published at now_ms (copied). *deliver_ms: when it arrives;
 * *was_empty: the worker had nothing in flight (the caller schedules its delivery). KVR_OK or
 * KVR_ENOMEM (nothing queued). */
int kvr_evlink_push(kvr_evlink_t *l, uint32_t w, double now_ms, const kvr_event_t *e,
                    double *deliver_ms, bool *was_empty);
/* Worker w's oldest batch in flight into *out (its arrays valid until the next call for w);
 * *next_ms: the next one's delivery, INFINITY when none. KVR_ENOTFOUND when w has none. */
int kvr_evlink_pop(kvr_evlink_t *l, uint32_t w, kvr_event_t *out, double *next_ms);
void kvr_evlink_stats(const kvr_evlink_t *l, kvr_evlink_stats_t *out);
int kvr_evlink_verify(const kvr_evlink_t *l, char *msg, size_t msg_len);

#endif
