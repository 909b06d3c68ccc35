/*
 * drift.h: the index checking itself. For each answered request whose engine reported how
 * many prompt tokens it found cached (usage.prompt_tokens_details.cached_tokens), the router's
 * prediction for the chosen rank is compared with the report; a rank whose predictions stop
 * agreeing is "drifting" (its index state no longer says what its engine holds).
 *
 * Judgement: a sample agrees when |reported - predicted| <= one block (an engine computes the
 * last prompt token even when it is cached, and counts whole blocks). Samples whose prompt
 * cannot hit a whole block ((prompt - 1) / block < 1) say nothing and are not judged. A rank
 * keeps its last `window` judged samples; once the window is full, agreement below
 * min_accuracy marks it drifting (KVR_DRIFT_FLAGGED); a drifting rank is well again as soon as
 * its window agrees at min_accuracy or more (KVR_DRIFT_RECOVERED), and each further full window
 * of fresh samples that does not is KVR_DRIFT_STILL (the caller may act again). restart()
 * empties a rank's window (its index state was rebuilt: older samples judged the old one).
 * Invariants: per rank, n <= window, agreeing <= n, agreeing equals the agreeing samples in
 * the ring (kvr_drift_verify).
 * Ownership: the tracker owns its ranks and their rings. Threads: one (the HTTP thread).
 * Cost: O(ranks) per observation (a linear search; fleets are hundreds of ranks at most),
 * window bytes per rank.
 */
#ifndef KVR_FLEET_DRIFT_H
#define KVR_FLEET_DRIFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/router.h"
#include "wire/prom.h"

typedef struct kvr_drift kvr_drift_t;

typedef struct kvr_drift_config {
    uint32_t window;     /* judged samples per rank, 1..1024 */
    double min_accuracy; /* 0..1 */
} kvr_drift_config_t;

typedef struct kvr_drift_sample {
    kvr_worker_t w;
    uint64_t prompt_tokens;
    uint64_t predicted; /* cached tokens the router expected on w at routing */
    uint64_t reported;  /* cached tokens w's engine reported */
    uint32_t block_size;
    uint64_t now_ms;
} kvr_drift_sample_t;

typedef enum kvr_drift_change {
    KVR_DRIFT_SAME = 0,  /* nothing to do */
    KVR_DRIFT_FLAGGED,   /* the rank has just been found drifting */
    KVR_DRIFT_STILL,     /* still drifting after another full window of fresh samples */
    KVR_DRIFT_RECOVERED, /* it agrees again */
} kvr_drift_change_t;

/* Token sums over observed samples (judged or not): the prompts, the cached tokens the router
 * predicted for them and those their engines reported; predicted_cached / prompt and
 * reported_cached / prompt are the hit ratios as predicted and as reported. */
typedef struct kvr_drift_tokens {
    uint64_t prompt, predicted_cached, reported_cached;
} kvr_drift_tokens_t;

typedef struct kvr_drift_view {
    uint32_t window_samples;  /* judged samples in the window now */
    uint32_t window_agreeing;
    double accuracy;          /* window_agreeing / window_samples (1 when empty) */
    double mean_abs_error;    /* tokens, over the window */
    double mean_error;        /* reported - predicted over the window: > 0 = the index misses
                                 blocks the engine holds, < 0 = it holds blocks the engine
                                 does not */
    bool drifting;
    uint64_t drifting_since_ms; /* 0 when not drifting */
    uint64_t compared, agreed;  /* judged samples ever, and those agreeing */
    uint64_t unjudged;          /* samples too short to say anything */
    uint64_t flagged, recovered; /* times found drifting, times well again */
    kvr_drift_tokens_t tokens;
} kvr_drift_view_t;

/* NULL when out of memory or the config is out of range. */
kvr_drift_t *kvr_drift_new(const kvr_drift_config_t *cfg);
void kvr_drift_free(kvr_drift_t *d);

kvr_drift_change_t kvr_drift_observe(kvr_drift_t *d, const kvr_drift_sample_t *s);
/* Empties w's window (its state was rebuilt); it stays drifting until a full window agrees. */
void kvr_drift_restart(kvr_drift_t *d, kvr_worker_t w);
/* Forgets every rank of a worker. */
void kvr_drift_remove_worker(kvr_drift_t *d, uint64_t worker_id);
/* w's figures; false when no sample of w was ever observed (*out zeroed, accuracy 1). */
bool kvr_drift_view(const kvr_drift_t *d, kvr_worker_t w, kvr_drift_view_t *out);
/* Every sample's token sums (all ranks, removed workers' included). */
kvr_drift_tokens_t kvr_drift_tokens(const kvr_drift_t *d);
/* |reported - predicted| in tokens of every judged sample. */
const kvr_hist_t *kvr_drift_error_hist(const kvr_drift_t *d);

int kvr_drift_verify(const kvr_drift_t *d, char *msg, size_t msg_len);

#endif
