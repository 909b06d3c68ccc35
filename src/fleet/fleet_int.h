/*
 * fleet_int.h: what fleet.c (membership, the tick) and health.c (probes, fencing, rank
 * states) share. Threads: the HTTP thread only.
 */
#ifndef KVR_FLEET_INT_H
#define KVR_FLEET_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"
#include "fleet/drift.h"
#include "fleet/fleet.h"

#define KVR_FLEET_MAX_PROBES 4096

typedef struct probe {
    kvr_fleet_t *f;
    uint64_t worker_id;
    struct evhttp_connection *conn;
    bool in_flight;
    bool dead; /* its worker was removed; kept until the fleet goes (a late callback) */
    uint32_t failures;
    char suspect[96]; /* non-empty: a probe sent on other evidence; its failure fences */
    char fence_why[160]; /* why it was last fenced ("" never) */
    /* its KV-cache size from GET /metrics, when registered without one */
    struct evhttp_connection *cap_conn; /* its own: a health connection may be closing */
    bool cap_in_flight;
    uint8_t cap_tries; /* failed fetches; it gives up after CAP_TRIES */
} probe_t;

struct kvr_fleet {
    struct event_base *base;
    struct event *tick;
    kvr_router_t *r;
    kvr_ingest_t *g;
    kvr_sched_t *sched;
    kvr_router_config_t cfg;
    probe_t **probes; /* live probes, then dead ones from n_probes to n_all */
    size_t n_probes, n_all;
    uint64_t last_probe_ms;
    kvr_fleet_observer_t obs[KVR_FLEET_MAX_OBSERVERS];
    size_t n_obs;
    kvr_ratelimit_t rl_silent; /* ranks whose KV events never came */
    kvr_ratelimit_t rl_cap;    /* capacity fetches that failed */
    uint64_t cap_fetches[3];   /* capacity from /metrics: learnt, none there, failed */
    uint64_t first_routed_ms, last_silent_check_ms;
    char index_origin[512];
    bool index_loading; /* a peer's snapshot is on its way (start-up) */
    /* the index checking itself (fleet_drift.c); NULL when off */
    kvr_drift_t *drift;
    kvr_ratelimit_t rl_drift;
    uint64_t cached_reported, cached_unreported; /* answers with / without a report */
    uint64_t cached_not_asked; /* answers that were not to carry usage */
    uint64_t resyncs[4]; /* asked, dropped (no replay socket), busy, failed */
    uint64_t approximations; /* ranks switched to approximate routing */
};

/* ---- health.c ---------------------------------------------------------------------------- */
/* A new worker's probe (workers with a url only; none past KVR_FLEET_MAX_PROBES). */
void fleet_add_probe(kvr_fleet_t *f, uint64_t worker_id);
/* A removed worker's probe is cancelled and kept (a late callback) until the fleet goes. */
void fleet_remove_probe(kvr_fleet_t *f, uint64_t worker_id);
/* A live worker's probe, or NULL (no url, or removed). */
const probe_t *fleet_probe(const kvr_fleet_t *f, uint64_t worker_id);
void fleet_free_probes(kvr_fleet_t *f);
/* Probes every live worker's /health. */
void fleet_probe_all(kvr_fleet_t *f);
void fleet_warn_silent_ranks(kvr_fleet_t *f, uint64_t now);

/* ---- fleet_drift.c ----------------------------------------------------------------------- */
/* The tracker, when the router learns from KV events here and the window is not 0. */
int fleet_drift_init(kvr_fleet_t *f);
void fleet_drift_free(kvr_fleet_t *f);

#endif
