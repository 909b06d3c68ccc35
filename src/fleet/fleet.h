/*
 * fleet.h: the workers a router serves, as every service of `kvrouter serve` sees them. One
 * place adds and removes a worker everywhere (the router's registry, its KV-event
 * subscription, its health probe, and the observers: the front end drops its connections,
 * discovery its entry), and one place keeps their health: /health probes every
 * health_interval_ms, fencing (never picked, index state dropped) after health_failures
 * failures or at once on other evidence (kvr_fleet_suspect), readmission on a 200, the KV-cache
 * size learnt from a worker's /metrics, the ingest thread's per-rank state copied into the
 * router, and a warning about ranks whose KV events never came.
 * It also runs the 100 ms tick of the serving loop: rank states, the scheduler's expiry and
 * queue, the probes.
 * Ownership: the fleet borrows the loop, the scheduler (and its router) and the ingest thread;
 * all outlive it. Threads: the HTTP thread only. Cost: O(workers) per tick; a probe is one
 * small HTTP request per worker per interval.
 */
#ifndef KVR_FLEET_FLEET_H
#define KVR_FLEET_FLEET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/config.h"
#include "kvrouter/router.h"
#include "kvrouter/sched.h"
#include "events/ingest.h"
#include "fleet/drift.h"
#include "wire/prom.h"

struct event_base;
typedef struct kvr_fleet kvr_fleet_t;

/* g: the ingest thread, NULL without KV events. NULL with *status and err on failure. */
kvr_fleet_t *kvr_fleet_new(struct event_base *base, kvr_sched_t *sched, kvr_ingest_t *g,
                           const kvr_router_config_t *cfg, int *status, char *err,
                           size_t err_len);
void kvr_fleet_free(kvr_fleet_t *f);

kvr_router_t *kvr_fleet_router(const kvr_fleet_t *f);
kvr_sched_t *kvr_fleet_sched(const kvr_fleet_t *f);
kvr_ingest_t *kvr_fleet_ingest(const kvr_fleet_t *f); /* NULL without KV events */

/* Registers a worker everywhere (router, event subscription, health probe). KVR_OK, or the
 * router's or the subscription's error with err (nothing registered then). */
int kvr_fleet_add_worker(kvr_fleet_t *f, const kvr_worker_spec_t *w, char *err, size_t err_len);
/* Removes a worker everywhere (router, its bookings, event subscription, probe), then tells
 * the observers. KVR_OK or KVR_ENOWORKER. */
int kvr_fleet_remove_worker(kvr_fleet_t *f, uint64_t worker_id);

/* Told of every membership change, after it: added (the worker is registered everywhere) and
 * removed (its bookings went with it); either may be NULL. At most KVR_FLEET_MAX_OBSERVERS,
 * called in the order they observed (KVR_EFULL past it). Membership changes only here, so an
 * observer's view of the workers is exact. */
typedef struct kvr_fleet_observer {
    void (*added)(void *arg, const kvr_worker_spec_t *w);
    void (*removed)(void *arg, uint64_t worker_id);
    void *arg;
} kvr_fleet_observer_t;
#define KVR_FLEET_MAX_OBSERVERS 8
int kvr_fleet_observe(kvr_fleet_t *f, const kvr_fleet_observer_t *o);
/* Removes the one observing with this arg. */
void kvr_fleet_unobserve(kvr_fleet_t *f, void *arg);

/* Fences a worker as failed health checks do (never picked, index state dropped); its probe
 * readmits it once /health answers 200. why is logged. */
void kvr_fleet_fence(kvr_fleet_t *f, uint64_t worker_id, const char *why);
/* Evidence that a worker may be gone (a request could not connect, its events connection was
 * lost): /health is probed at once, and if that fails too it is fenced without waiting for
 * health_failures periodic probes. */
void kvr_fleet_suspect(kvr_fleet_t *f, uint64_t worker_id, const char *why);

/* Copies the ingest thread's per-rank state into the router (done on the tick; call it before
 * showing the ranks). */
void kvr_fleet_sync(kvr_fleet_t *f);
/* A rank's index state as /v1/workers and /metrics name it: the ingest state of a rank with
 * KV events; "no_events" without an events endpoint; "approximate" in approximate mode;
 * "remote" with a remote indexer; "not_indexed" when the router keeps no index. */
const char *kvr_fleet_index_state(const kvr_fleet_t *f, const kvr_worker_spec_t *sp,
                                  const kvr_rank_status_t *st);
/* The one word a rank is shown as (GET /v1/workers' "state", the live page, `kvrouter top`),
 * health first: "unreachable" (fenced after its /health probes failed), "fenced" (fenced,
 * its probes not failing now); then "drifting" (its predictions disagree with its engine's
 * reports); then kvr_fleet_index_state's word. why gets a sentence for it ("" when the state
 * is "exact" or needs none). */
const char *kvr_fleet_rank_state(const kvr_fleet_t *f, const kvr_worker_spec_t *sp,
                                 kvr_worker_t w, const kvr_rank_status_t *st, char *why,
                                 size_t cap);
/* Consecutive failed /health probes of a worker (0 when healthy or not probed). */
uint32_t kvr_fleet_probe_failures(const kvr_fleet_t *f, uint64_t worker_id);
/* Whether the index is still being loaded at start (a peer's snapshot on its way): the router
 * serves cold meanwhile and does not hand its own snapshot on. */
void kvr_fleet_set_index_loading(kvr_fleet_t *f, bool loading);
bool kvr_fleet_index_loading(const kvr_fleet_t *f);
/* Where the index came from at start ("cold", "state_file ...", "peer URL ..."); copied. "" =
 * not told. */
void kvr_fleet_set_index_origin(kvr_fleet_t *f, const char *origin);
const char *kvr_fleet_index_origin(const kvr_fleet_t *f);
/* Reads of workers' KV-cache sizes from their /metrics: learnt, not exposed, failed. */
void kvr_fleet_capacity_fetches(const kvr_fleet_t *f, uint64_t out[3]);

/* The index checking itself (fleet/drift.h): an answer's engine report of the prompt tokens it
 * found cached, against the router's prediction for that rank. Counted as unreported when the
 * answer carried none, as not asked when it was not to carry usage (a stream whose client did
 * not set stream_options.include_usage). A rank found drifting is logged (why: how often its predictions agree,
 * by how much and which way they miss) and, per prediction_drift_action, rebuilt from its
 * engine's replay buffer (at most once a window). No-op when the check is off. */
typedef struct kvr_fleet_cached_report {
    kvr_worker_t w;
    uint64_t prompt_tokens;
    uint64_t predicted;
    bool asked; /* the answer was to carry usage */
    bool has_report;
    uint64_t reported;
} kvr_fleet_cached_report_t;
void kvr_fleet_report_cached(kvr_fleet_t *f, const kvr_fleet_cached_report_t *r);
/* NULL when the check is off (no KV events here, or prediction_drift_window 0). */
const kvr_drift_t *kvr_fleet_drift(const kvr_fleet_t *f);
/* kvr_prediction_* families (nothing when the check is off). */
void kvr_fleet_drift_metrics(const kvr_fleet_t *f, kvr_prom_t *p);

/* Checks the invariants of fleet.c and health.c (live probes first, each for a registered
 * worker with a url, no two for one worker; the dead ones after; observers within bounds):
 * KVR_OK, or KVR_EINVAL with msg. O(workers). Asserted after every change in debug builds. */
int kvr_fleet_verify(const kvr_fleet_t *f, char *msg, size_t msg_len);

/* Why no worker could take a request, as far as the fleet alone can say: none registered, or
 * all fenced (how many); "" when neither (the request's model, pool or filters left none). */
void kvr_fleet_why_none(const kvr_fleet_t *f, char *buf, size_t len);

/* A queued placement that ran out of time (kvr_sched_done_fn with res NULL): the HTTP status
 * and a message naming the setting (429 for router_queue_timeout_ms; 503 for
 * min_initial_workers_wait_ms, with the ready count). Every front door answers with these. */
int kvr_fleet_wait_failed(const kvr_router_t *r, int rc, char *msg, size_t msg_len);

#endif
