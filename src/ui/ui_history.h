/*
 * ui_history.h: the live page's memory: one point a second for the last ten minutes, each
 * computed from two readings of the router's exposition text (ui_reading.h) as a Prometheus
 * would compute it: rates over the second before the point; ratios and quantiles over the
 * ratio window (the 10 s before it), so that a point of a quiet second still shows the last
 * requests' latency.
 * A figure that cannot be known is NaN (JSON null): a ratio with no denominator, a quantile
 * with no observation, a family the router does not export (no queue, no front end, no NATS).
 * Invariants: n_points <= KVR_UI_POINTS; points are in time order; n_readings <=
 * KVR_UI_RATIO_S + 1 (kvr_ui_history_verify).
 * Ownership: the history owns its rings (~150 KB, allocated by the caller once). Threads: one
 * (the HTTP thread). Cost: O(1) per reading.
 */
#ifndef KVR_UI_HISTORY_H
#define KVR_UI_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ui/ui_reading.h"

#define KVR_UI_POINTS 600 /* ten minutes at one a second */
#define KVR_UI_RATIO_S 10 /* the window of ratios and quantiles, in readings */

typedef struct kvr_ui_point {
    uint64_t t_ms; /* unix ms */
    double decisions_per_s, refusals_per_s, in_flight, queue_pending;
    double hit_predicted, hit_reported;
    double ttft_p50_ms, ttft_p99_ms, itl_p50_ms, itl_p99_ms;
    double errors_per_s, kv_events_per_s, kv_gaps;
    bool pool_seen[KVR_UI_POOLS]; /* the pool ever placed a request */
    double pool_decisions_per_s[KVR_UI_POOLS], pool_hit_predicted[KVR_UI_POOLS];
    bool has_replicas;
    double peers, sync_lag_p50_ms, sync_lag_p99_ms, sync_events_per_s, sync_lost;
} kvr_ui_point_t;

typedef struct kvr_ui_history {
    kvr_ui_point_t points[KVR_UI_POINTS]; /* ring: the oldest at head when full */
    size_t n_points, head;
    kvr_ui_reading_t readings[KVR_UI_RATIO_S + 1]; /* ring of the latest readings */
    size_t n_readings, rhead;
} kvr_ui_history_t;

void kvr_ui_history_init(kvr_ui_history_t *h);
/* Takes a reading; from the second one on, adds a point at its time (a reading not later
 * than the previous one is dropped: false). */
bool kvr_ui_history_add(kvr_ui_history_t *h, const kvr_ui_reading_t *r);
/* The i-th point, oldest first (i < n_points). */
const kvr_ui_point_t *kvr_ui_history_point(const kvr_ui_history_t *h, size_t i);
int kvr_ui_history_verify(const kvr_ui_history_t *h, char *msg, size_t msg_len);

#endif
