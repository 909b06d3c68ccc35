/*
 * kvrouter/sched.h: the scheduler (core/sched.c). Every front door (the JSON API, the OpenAI front end, an embedding
 * program) places requests and reports their lifecycle here, not to the router directly:
 *
 *   place        route now, or queue while every eligible worker is busy (router_queue_*);
 *                a queued request is told its outcome once, by callback, when a load change
 *                or the tick lets it go, or when it waits past router_queue_timeout_ms
 *   lifecycle    first token, output block, free: by the handle the placement returned (O(1))
 *                or by request id (the JSON API's /v1/requests/{id}/..., a peer's event);
 *                any change that can lower a load re-runs the queue at once
 *   upkeep       kvr_sched_tick: expiry of bookings and of queued requests, then a dispatch
 *                pass for changes nothing reported
 *   observers    told of every placement and lifecycle event, with its origin, so replica
 *                sync can publish local events and apply a peer's without echoing them, and
 *                the HTTP layer can keep its histograms
 *
 * How disaggregated serving and replica sync use it: docs/architecture.md (sched.c).
 *
 * Ownership: the scheduler borrows the router (which must outlive it) and owns its queue and
 * the copies of queued requests it was asked to copy (kvr_place_t.copy). A request placed
 * without copy is borrowed: its memory must stay valid and unchanged until its callback runs
 * or kvr_sched_cancel takes it back.
 * Threads: one owner thread (the event loop that owns the router); no locks. Callbacks run on
 * it, from inside kvr_sched_* calls; they may call back into the scheduler (a dispatch it
 * triggers is left to the running pass, which looks at the queue again after each callback).
 * Cost: place = one route (kvr_router_route); queuing hashes the prompt once (the dispatch
 * passes reuse the hashes) and allocates one block for the entry; a lifecycle call by handle
 * is O(1) plus a dispatch pass, which stops at the first request that still cannot be placed.
 */
#ifndef KVR_SCHED_H
#define KVR_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/router.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVR_QUEUE_MAX_CAPACITY ((size_t)1 << 20)

/* The queue of requests waiting while every eligible worker is busy (core/queue.c). */
typedef struct kvr_queue_config {
    /* public */
    size_t capacity;                 /* max queued requests, memory fixed at creation; [2, 2^20] */
    uint64_t max_pending_isl_tokens; /* 0 = unlimited */
    kvr_queue_order_t order;       /* router_queue_policy */
} kvr_queue_config_t;

typedef struct kvr_queue_stats {
    /* read-only */
    uint64_t pending;            /* gauge */
    uint64_t pending_isl_tokens; /* gauge */
    uint64_t enqueued, dispatched, rejected, expired, cancelled;
} kvr_queue_stats_t;

typedef struct kvr_sched kvr_sched_t;

typedef struct kvr_sched_config {
    /* public */
    bool queue;                   /* queue while busy (router_queue_threshold set) */
    kvr_queue_config_t queue_cfg; /* capacity, pending ISL limit, order */
    uint64_t queue_timeout_ms;    /* 0 = wait forever */
    uint32_t min_initial_workers; /* until this many are ready (once), requests wait */
    uint64_t initial_wait_ms;     /* ... at most this long from the first call, the start-up
                                     window (0 = forever) */
} kvr_sched_config_t;

/* The scheduler's settings from the router's configuration (router_queue_*). */
void kvr_sched_config_from(kvr_sched_config_t *out, const kvr_router_config_t *cfg);

/* NULL on failure with *status (KVR_EINVAL: *field names the setting; KVR_ENOMEM). */
kvr_sched_t *kvr_sched_new(kvr_router_t *r, const kvr_sched_config_t *cfg, int *status,
                           const char **field);
/* Requests still queued are dropped without a callback (their owner goes away with its
 * clients: answer them first). */
void kvr_sched_free(kvr_sched_t *s);
kvr_router_t *kvr_sched_router(const kvr_sched_t *s);

/* ---- placing ---- */

/* A queued placement's outcome, called once: KVR_OK (booked; res filled, res->handle names
 * the booking), a routing error as kvr_router_route's (res->error_field for KVR_EINVAL),
 * KVR_EBUSY with res NULL when it waited past queue_timeout_ms, or KVR_ENOWORKER with res
 * NULL when it waited past initial_wait_ms for min_initial_workers. */
typedef void (*kvr_sched_done_fn)(void *arg, int rc, const kvr_route_res_t *res);

typedef struct kvr_place {
    /* public */
    const kvr_route_req_t *q;
    uint32_t strict_priority; /* queue tier: higher always dispatches first */
    bool copy;                /* queue a copy of q (else q is borrowed: see above) */
    kvr_sched_done_fn done;   /* NULL: never queue (busy answers KVR_EBUSY) */
    void *arg;
} kvr_place_t;

/* Names a queued request (for kvr_sched_cancel); never 0. */
typedef uint64_t kvr_ticket_t;

/* Routes p->q now (KVR_OK, res filled, *ticket 0), or queues it (KVR_OK, *ticket set, done
 * called later) when q->update_state and done is set, and either the queue is on and every
 * eligible worker is busy or a backlog waits (arrivals never overtake it), or fewer than
 * min_initial_workers have ever been ready at once (the start-up wait: it ends for good the
 * first time they are, checked at each placement, dispatch and tick, or once initial_wait_ms
 * have passed since the scheduler's first call: a request never waits past that window, and
 * one arriving after it is answered at once). Otherwise the routing
 * error; KVR_EQUEUEFULL when the queue is at its limits; KVR_ENOMEM. */
int kvr_sched_place(kvr_sched_t *s, const kvr_place_t *p, uint64_t now_ms, kvr_route_res_t *res,
                    kvr_ticket_t *ticket);
/* Whether the start-up wait is over (min_initial_workers were ready at once, or the start-up
 * window has passed). */
bool kvr_sched_warm(kvr_sched_t *s);
/* Takes a queued request back (its client went away): true if it was still queued; done is
 * then never called. */
bool kvr_sched_cancel(kvr_sched_t *s, kvr_ticket_t t);

/* ---- overlaps from elsewhere ---- */
/* An asynchronous source of a prompt's overlaps (a remote indexer, indexer/remote_indexer.h).
 * With one set, a placement that may wait (done set) is not routed at once: its prompt is
 * hashed, the source asked, and the placement returns a ticket; when the source answers, the
 * request is routed with the overlaps given (kvr_route_req_t.matches), or queued as any other
 * when every worker is busy, and done is called as for a queued request. A source that fails
 * or times out answers with status != KVR_OK and no matches: the request is routed with zero
 * overlap (the source counts it). Placements without done are routed at once with the
 * router's own index (none: zero overlap). */
typedef void (*kvr_overlap_done_fn)(void *ctx, int status, const kvr_match_t *matches, size_t n,
                                    uint64_t now_ms);
typedef struct kvr_overlap_source {
    /* public */
    /* Starts a lookup of q's prompt (q->hashed: its local block hashes); calls done(ctx, ...)
     * exactly once, on the owner thread, and never from inside lookup. Non-OK: nothing will
     * be called (the request is routed at once with zero overlap). */
    int (*lookup)(void *arg, const kvr_route_req_t *q, kvr_overlap_done_fn done, void *ctx);
    void *arg;
} kvr_overlap_source_t;
/* src NULL: back to the router's own index. The source must outlive the lookups it started. */
void kvr_sched_set_overlap_source(kvr_sched_t *s, const kvr_overlap_source_t *src);
/* Whether an overlap source is set (a placement with done then always answers through it). */
bool kvr_sched_has_overlap_source(const kvr_sched_t *s);
/* Placements waiting for their overlaps. */
size_t kvr_sched_awaiting(const kvr_sched_t *s);

/* ---- lifecycle ---- */

typedef enum kvr_sched_kind {
    KVR_SCHED_ROUTED = 0, /* a placement was booked (observers only) */
    KVR_SCHED_FIRST_TOKEN,
    KVR_SCHED_OUTPUT_BLOCK,
    KVR_SCHED_FREE,
} kvr_sched_kind_t;

typedef enum kvr_sched_origin {
    KVR_SCHED_ORIGIN_LOCAL = 0, /* this router's clients */
    KVR_SCHED_ORIGIN_PEER,      /* another replica's, applied here */
} kvr_sched_origin_t;

typedef struct kvr_sched_event {
    /* public */
    kvr_sched_kind_t kind;
    kvr_sched_origin_t origin;
    kvr_req_handle_t handle; /* the booking; KVR_REQ_HANDLE_NONE: by id */
    const char *id;          /* by id (handle NONE); for an event by handle, its id when a
                                named observer is registered (kvr_sched_observe_named) */
    size_t id_len;
    double decay_fraction;      /* OUTPUT_BLOCK: NAN = none, else [0, 1] */
    const kvr_route_res_t *res; /* ROUTED, local: the decision (worker, overlap, timing) */
    const kvr_load_request_t *booking; /* ROUTED: what the load tracker admitted (prompt
                                          hashes, tokens), valid during the call */
} kvr_sched_event_t;

/* Applies a lifecycle event (FIRST_TOKEN, OUTPUT_BLOCK, FREE) to the router's load, tells the
 * observers, and dispatches what the queue can place now. KVR_OK; KVR_ENOTFOUND for an
 * unknown id or stale handle (counted by the router, harmless); KVR_EINVAL; KVR_ERANGE (a
 * decay fraction outside [0, 1]). */
int kvr_sched_apply(kvr_sched_t *s, const kvr_sched_event_t *ev, uint64_t now_ms);

/* Admits a peer replica's booking (kvr_router_admit) and tells the observers (ROUTED, origin
 * PEER, res NULL). KVR_OK with *handle, or kvr_router_admit's error (nothing told). */
int kvr_sched_admit_peer(kvr_sched_t *s, const kvr_load_request_t *lr, uint64_t now_ms,
                         kvr_req_handle_t *handle);

/* The common calls, by handle, local origin. */
int kvr_sched_first_token(kvr_sched_t *s, kvr_req_handle_t h, uint64_t now_ms);
int kvr_sched_output_block(kvr_sched_t *s, kvr_req_handle_t h, double decay_fraction,
                           uint64_t now_ms);
int kvr_sched_release(kvr_sched_t *s, kvr_req_handle_t h, uint64_t now_ms);

/* ---- upkeep ---- */

typedef enum kvr_sched_trigger {
    KVR_SCHED_BY_EVENT = 0, /* a change the scheduler was told of */
    KVR_SCHED_BY_TICK,      /* the periodic pass (a change nothing reported) */
    KVR_SCHED_N_TRIGGERS
} kvr_sched_trigger_t;

/* Places what the queue can place now (a worker was added or readmitted, or load went down
 * somewhere the scheduler was not told of). */
void kvr_sched_dispatch(kvr_sched_t *s, uint64_t now_ms, kvr_sched_trigger_t why);
/* Expires bookings (kvr_router_tick) and queued requests past their deadline (told KVR_EBUSY),
 * then dispatches (KVR_SCHED_BY_TICK). */
void kvr_sched_tick(kvr_sched_t *s, uint64_t now_ms);

/* ---- observers and figures ---- */

typedef void (*kvr_sched_observer_fn)(void *arg, const kvr_sched_event_t *ev);
#define KVR_SCHED_MAX_OBSERVERS 4
/* Adds an observer (KVR_EFULL past KVR_SCHED_MAX_OBSERVERS); called on the owner thread after
 * each event took effect. Observers must not call back into the scheduler. */
int kvr_sched_observe(kvr_sched_t *s, kvr_sched_observer_fn fn, void *arg);
/* The same, for an observer that needs the request id of lifecycle events made by handle
 * (replica sync publishes ids): while one is registered, such an event's id is looked up and
 * copied before it is applied (a free takes it with the request); otherwise ev->id is NULL for
 * them and nothing is looked up. */
int kvr_sched_observe_named(kvr_sched_t *s, kvr_sched_observer_fn fn, void *arg);
void kvr_sched_unobserve(kvr_sched_t *s, kvr_sched_observer_fn fn, void *arg);

typedef struct kvr_sched_stats {
    /* read-only */
    bool queue_on;
    kvr_queue_stats_t queue; /* all zero when the queue is off */
    uint64_t dispatched[KVR_SCHED_N_TRIGGERS];
    uint64_t applied[2]; /* lifecycle events applied: [origin] */
} kvr_sched_stats_t;
void kvr_sched_stats(const kvr_sched_t *s, kvr_sched_stats_t *out);
size_t kvr_sched_queued(const kvr_sched_t *s);

/* Checks the invariants (the queue's, the entries' hashes, the counters); KVR_OK or
 * KVR_EINVAL with msg. */
int kvr_sched_verify(const kvr_sched_t *s, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif /* KVR_SCHED_H */
