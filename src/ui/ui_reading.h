/*
 * ui_reading.h: what the live page's sampler reads from the router's exposition text each
 * second: the counters, gauges and histograms its series are computed from (ui_history.h),
 * summed over every label but the ones named (a histogram over its `le` only, as
 * `sum by (le)` would).
 * A family absent from the text reads "absent" (has_* false, counters 0): a queue that is off,
 * a router without KV events, NATS or a front end.
 * Pure: no allocation, no globals. Cost: one pass over the text; a reading is ~2 KB.
 */
#ifndef KVR_UI_READING_H
#define KVR_UI_READING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_UI_HIST_MAX 32 /* buckets of one histogram, +Inf included */

/* A histogram summed over its other labels: bounds ascending (+Inf last when present),
 * cumulative counts per bound. */
typedef struct kvr_ui_hist {
    size_t n;
    double le[KVR_UI_HIST_MAX];
    double cum[KVR_UI_HIST_MAX];
} kvr_ui_hist_t;

enum { KVR_UI_POOL_PREFILL, KVR_UI_POOL_DECODE, KVR_UI_POOLS };

typedef struct kvr_ui_reading {
    uint64_t t_ms; /* unix ms it was taken */
    double routes_ok;
    double routes_busy;    /* every eligible rank busy: counted per attempt (a queued request
                              is tried again at each dispatch) */
    double routes_refused; /* the other results but ok */
    double in_flight;
    bool has_queue;
    double queue_pending, queue_rejected, queue_expired;
    double pool_routed[KVR_UI_POOLS], pool_prompt[KVR_UI_POOLS], pool_cached[KVR_UI_POOLS];
    bool has_prediction; /* KV events and drift checking on */
    double pred_prompt, pred_reported_cached;
    bool has_frontend;
    kvr_ui_hist_t ttft, itl; /* seconds */
    double fe_5xx;
    bool has_events;
    double kv_events_applied, kv_gaps;
    bool has_peers; /* NATS replicas (kvr_replicas_peers) */
    double peers;
    bool has_sync; /* replica sync over them */
    double sync_applied, sync_lost;
    kvr_ui_hist_t sync_lag; /* seconds */
    size_t skipped; /* malformed lines (none expected: the text is the router's own) */
} kvr_ui_reading_t;

/* Fills *out from the exposition text (t_ms is the caller's). */
void kvr_ui_reading_parse(const char *text, size_t len, uint64_t t_ms, kvr_ui_reading_t *out);

/* The q-quantile (0..1) of the observations between two readings of one histogram
 * (later - earlier, bucket by bucket), as Prometheus's histogram_quantile computes it
 * (linear within a bucket, the first bucket's lower bound 0, the +Inf bucket reads as the
 * highest finite bound); NaN when no observation fell between them or the bounds differ. */
double kvr_ui_hist_quantile(const kvr_ui_hist_t *later, const kvr_ui_hist_t *earlier, double q);

#endif
