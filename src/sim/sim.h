/*
 * sim.h: the virtual-time simulator behind `kvrouter sim`: a list of timed requests through the
 * real router core (kvrouter/router.h: prefix index, load tracker, selector, and the queue of
 * core/queue.c when router_queue_threshold is set) and N simulated engines (sim/engine.h),
 * with no sockets and no clock. One run = one routing policy (cfg.router.router_mode).
 *
 * Event loop (discrete events, time in ms as a double):
 *   arrival     request i at reqs[i].arrival_ms: kvr_router_route(update_state, id "r<i>") ->
 *               kvr_engine_add on the chosen worker (or the router queue on KVR_EBUSY);
 *   step end    each worker runs one engine step at a time; a step begun at t ends at
 *               t + duration_ms (the engine's timing model), delivering its output tokens:
 *               the first -> kvr_router_first_token, every block_size-th ->
 *               kvr_router_output_block, the last -> kvr_router_free_request;
 *   queue       after step ends, queued requests are retried while the head can be placed;
 *               a queued request past router_queue_timeout_ms is dropped (counted);
 *   step begin  after all events of one instant, every idle worker with work begins a step.
 * Events of one instant run in a fixed order: step ends (by worker index), queue dispatch,
 * queue expiry, arrivals (by request index), step begins (in the order workers got work), so
 * a run is a function of its inputs and cfg.seed. KV mode: the engines' KV events go straight
 * into the prefix index (worker w = {w, 0}, engine hash = sequence hash, local block hash
 * recomputed from the event's tokens), synchronously when the engine emits them. Approximate
 * mode: the router writes the index itself and engine events are ignored.
 *
 * Disaggregated (n_prefill > 0): workers 0 .. n_prefill-1 are prefill workers (role prefill),
 * the others decode workers. A request is routed on the prefill pool (id "r<i>p", without
 * active blocks), prefilled there (max_tokens 1, its KV held: hold_kv); when that prefill's
 * token is out it is routed on the decode pool with the reference's decode overrides, and
 * its KV travels for blocks x kv_bytes_per_block x 8 / (kv_transfer_gbps x 1e9) s; then the
 * prefill worker frees it and the decode worker admits the request kv_loaded (the vLLM pull
 * flow). Its first token, TTFT and ITL are the decode worker's; its cached tokens the
 * prefill worker's (the prefill pool's hits). The router's disagg_policy applies: a request
 * it keeps local is routed on the decode pool as an aggregated request.
 *
 * Not modelled: network and HTTP latency, event propagation delay (the index is exact at every
 * instant), tokenisation, engine restarts and faults, lower KV tiers; with disaggregation,
 * the router queue (refused by validation).
 *
 * Ownership: the caller owns the request array and the records; the simulator owns the router,
 * index, queue and engines of a run and frees them before returning. Threads: one (the
 * caller's). Memory: the engines' caches (O(workers x num_gpu_blocks)), the index, one record
 * per request, one prompt buffer of the longest prompt. Cost: O(events x log workers) plus the
 * engines' and router's own costs; no wall clock is read here (the caller times the run).
 */
#ifndef KVR_CORE_SIM_H
#define KVR_CORE_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/config.h"
#include "sim/engine.h"
#include "sim/evlink.h"
#include "base/stats.h"

#define KVR_SIM_MAX_WORKERS 4096u

typedef struct kvr_sim_request {
    double arrival_ms;   /* virtual time; finite, >= 0, non-decreasing along the array */
    uint32_t n_tokens;   /* prompt tokens, >= 1 */
    uint32_t max_tokens; /* output tokens, >= 1 (the request finishes by length) */
    uint64_t session;    /* a sticky session (the router's session_ttl_secs); 0 = none */
} kvr_sim_request_t;

/* Writes request i's prompt (reqs[i].n_tokens tokens) into out (capacity cap >= n_tokens).
 * Must give the same tokens every time it is asked (a queued request is asked again).
 * Returns KVR_OK or a status that stops the run. */
typedef int (*kvr_sim_tokens_fn)(void *ud, size_t i, uint32_t *out, size_t cap);

typedef struct kvr_sim_input {
    const kvr_sim_request_t *reqs;
    size_t n;
    kvr_sim_tokens_fn tokens;
    void *ud;
    /* called as each request finishes (done of n) with the virtual time; may be NULL */
    void (*progress)(void *arg, size_t done, size_t n, double virtual_ms);
    void *progress_arg;
} kvr_sim_input_t;

typedef struct kvr_sim_config {
    uint32_t n_workers;         /* 1 .. KVR_SIM_MAX_WORKERS */
    uint32_t n_prefill;         /* of which prefill workers (0: aggregated); < n_workers */
    uint64_t kv_bytes_per_block; /* disaggregated: the KV transfer's size per block */
    double kv_transfer_gbps;     /* ... and bandwidth (Gbit/s, > 0) */
    kvr_engine_config_t engine; /* every worker's engine */
    kvr_router_config_t router; /* router_mode is the policy; block_size must be engine's */
    uint64_t seed;              /* the router's and the load tracker's randomness */
    /* Clairvoyant placement (aggregated fleets only): each request goes to the worker where
     * it would get its first token soonest had nothing arrived after it, found by running a
     * copy of every engine forward (kvr_engine_clone); the router books it there (pinned), so
     * its load view is right. Knows what no router can (every engine's exact queue, steps and
     * cache): a yardstick for online policies, not one. Cost: a copy of each engine per
     * request. */
    bool oracle;
    /* The second yardstick (with oracle): among the workers whose first token would come at
     * most this fraction later than the soonest, the one whose cache holds most of the prompt
     * (keeps a prefix where its next request will find it, at a bounded cost now); 0: the
     * soonest only. kvrouter sim's oracle-affinity is 0.1. */
    double oracle_affinity;
    /* KV mode: the events' way to the index (sim/evlink.h): delay, jitter, loss and replay.
     * All 0 (the default): applied the instant the engine changes. Its seed is the run's. */
    kvr_evlink_config_t link;
} kvr_sim_config_t;

/* Engine and router defaults, with two sim-specific router changes:
 * router_request_expiry_ms = its maximum (no free is ever lost in a simulation, and the 5 min
 * backstop would release requests an overloaded engine still holds, so the router would
 * misjudge load), and seed 1. */
void kvr_sim_config_default(kvr_sim_config_t *cfg);
/* Engine and router validation, block sizes equal, worker count in range; err names the
 * field. */
int kvr_sim_config_validate(const kvr_sim_config_t *cfg, char *err, size_t err_len);

typedef enum kvr_sim_outcome {
    KVR_SIM_PENDING = 0,  /* never happens after a run */
    KVR_SIM_DONE,         /* finished by length */
    KVR_SIM_TOO_LONG,     /* prompt + max_tokens > max_model_len: not routed */
    KVR_SIM_REJECTED,     /* refused by the router (or engine), or queue full */
    KVR_SIM_EXPIRED,      /* queued longer than router_queue_timeout_ms */
} kvr_sim_outcome_t;

/* One request's story (optional output of a run). Times are virtual ms; NAN when absent. */
typedef struct kvr_sim_record {
    kvr_sim_outcome_t outcome;
    int32_t worker;          /* -1 when never placed */
    int status;              /* the router's or engine's refusal (KVR_OK otherwise) */
    double arrival_ms, routed_ms, first_ms, finish_ms;
    uint32_t n_output;
    uint32_t cached_tokens;  /* engine: prompt tokens found cached at first admission */
    uint64_t predicted_cached_tokens; /* router: cached tokens it expected on that worker */
    uint64_t best_cached_tokens;      /* router: the most any worker had cached (KV mode) */
    int32_t prefill_worker;  /* disaggregated: its prefill worker (-1: none) */
    double prefilled_ms;     /* disaggregated: the prefill's token came out */
} kvr_sim_record_t;

typedef struct kvr_sim_result {
    uint64_t requests;        /* finished */
    uint64_t too_long;        /* skipped: prompt + outputs beyond max_model_len */
    uint64_t rejected;        /* refused by the router or an engine, or queue full */
    uint64_t expired;         /* dropped from the router queue after its timeout */
    uint64_t queued;          /* requests that waited in the router queue */
    kvr_pcts_t ttft_ms;       /* first token - arrival, over finished requests */
    kvr_pcts_t itl_ms;        /* per request (finish - first) / (outputs - 1), outputs >= 2 */
    kvr_pcts_t e2e_ms;        /* finish - arrival */
    kvr_pcts_t queue_ms;      /* routed - arrival (router queue wait), over finished requests */
    double ttft_mean_ms;
    uint64_t prompt_tokens;   /* over finished requests */
    uint64_t cached_tokens;   /* engine-reported hits, over finished requests */
    uint64_t predicted_cached_tokens; /* the router's expectation for the same requests */
    uint64_t best_cached_tokens;      /* KV mode: had each gone to the worker caching most */
    double hit_ratio;         /* cached_tokens / prompt_tokens */
    double max_worker_share;  /* the busiest worker's share of placed requests */
    uint64_t max_worker_requests;
    double virtual_ms;        /* time of the last event */
    uint64_t steps, preemptions;
    uint64_t index_events, index_errors; /* engine events applied to the index / refused */
    uint64_t transfers;       /* disaggregated: KV transfers completed */
    uint64_t event_batches;   /* KV mode with a link model: batches sent, ... */
    uint64_t events_lost;     /* ... of which lost and replayed */
    double event_delay_ms;    /* ... and their mean delay to the index */
    uint64_t bypassed;        /* disaggregated: requests the router's disagg_policy kept on a
                                 decode worker alone */
    double transfer_ms;       /* ... and their modelled time, summed */
    kvr_pcts_t prefill_ms;    /* disaggregated: arrival -> the prefill's token, finished ones */
    uint64_t router_live_at_end;  /* requests the load tracker still held (0 when consistent) */
    uint64_t router_unknown_ids;  /* lifecycle calls for ids the tracker did not know (0) */
} kvr_sim_result_t;

/* Runs the requests to completion. records: NULL or in->n entries. KVR_OK; KVR_EINVAL (bad
 * config or input, err names it); KVR_ENOMEM; or the tokens callback's status. */
int kvr_sim_run(const kvr_sim_config_t *cfg, const kvr_sim_input_t *in, kvr_sim_result_t *out,
                kvr_sim_record_t *records, char *err, size_t err_len);

#endif /* KVR_CORE_SIM_H */
