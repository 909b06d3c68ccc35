/*
 * run_report.h: the summary of one policy's run over a trace, as `kvrouter replay --json`
 * (measured against live endpoints) and `kvrouter sim --json` (virtual time) both print it,
 * so their outputs can be compared key for key:
 *   {"policy","workers","requests","ttft_ms":{"p50","p90","p99"},"itl_ms":{..},"e2e_ms":{..},
 *    "hit_ratio","ceiling_infinite","ceiling_pooled","max_worker_share"}
 * Latencies in milliseconds, nearest-rank percentiles (base/stats.h); ratios in [0, 1]; a
 * value not known (NAN) is written as null. Each command adds its own keys after these.
 * Pure (no I/O); the writer is the caller's.
 */
#ifndef KVR_WIRE_RUN_REPORT_H
#define KVR_WIRE_RUN_REPORT_H

#include <stdint.h>

#include "base/stats.h"
#include "wire/json_writer.h"

typedef struct kvr_run_report {
    const char *policy;       /* a label: "kv", "round-robin", ... (NULL writes null) */
    uint64_t workers;
    uint64_t requests;
    kvr_pcts_t ttft_ms, itl_ms, e2e_ms;
    double hit_ratio;         /* cached prompt tokens / prompt tokens */
    double ceiling_infinite;  /* the hit ratio of an infinite single cache */
    double ceiling_pooled;    /* of one LRU cache as large as all workers' together */
    double max_worker_share;  /* the busiest worker's fraction of the requests */
} kvr_run_report_t;

/* Writes the shared keys into an object the caller has begun (and will end). Returns the
 * writer's status. */
int kvr_run_report_write_keys(kvr_json_writer_t *w, const kvr_run_report_t *r);

#endif /* KVR_WIRE_RUN_REPORT_H */
