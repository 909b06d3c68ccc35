/*
 * api_int.h: what the JSON API's files share (api.c: dispatch, the routing / lifecycle /
 * workers / /router endpoints through the scheduler; api_metrics.c: GET /metrics).
 * Threads: the HTTP thread only.
 */
#ifndef KVR_API_INT_H
#define KVR_API_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/http.h>

#include "api/api.h"
#include "core/load.h"
#include "base/log.h"
#include "base/stats.h"
#include "kvrouter/sched.h"
#include "fleet/fleet.h"
#include "http/http.h"
#include "wire/api_json.h"
#include "wire/json_writer.h"
#include "wire/prom.h"

/* A JSON API request waiting in the scheduler's queue: the client to answer when it leaves.
 * Kept on a free list (no allocation once warm); every one ever made is on the all list. */
typedef struct waiter {
    kvr_api_t *s;
    struct evhttp_request *req;
    kvr_ticket_t ticket;
    bool tagged; /* came from POST /router (reply shape differs) */
    struct waiter *next_free, *next_all;
} waiter_t;

struct kvr_api {
    kvr_http_host_t *host;
    kvr_fleet_t *fleet;
    kvr_reply_t *rep;     /* the host's */
    kvr_json_writer_t *w; /* rep's writer: the bodies */
    kvr_router_t *r;
    kvr_ingest_t *g;    /* NULL without KV events */
    kvr_sched_t *sched; /* places, queues and tracks requests (kvrouter/sched.h) */
    bool observing;     /* the scheduler's events */
    kvr_router_config_t cfg;
    kvr_api_decoder_t *dec;
    kvr_prom_t prom;
    waiter_t *free_waiters, *all_waiters;
    kvr_hist_t h_hash, h_lookup, h_select, h_total;
    uint64_t routes_with_overlap;
    kvr_rank_score_t *scores;
    kvr_load_projection_t *loads;
    size_t cap_ranks;
    kvr_ratelimit_t rl_decisions; /* the decisions' debug lines */
};

/* ---- api.c ------------------------------------------------------------------------------- */
/* A status code as its HTTP answer (field names the bad field for KVR_EINVAL). */
void api_reply_status(kvr_api_t *s, struct evhttp_request *req, int rc, const char *field);

/* ---- api_metrics.c ----------------------------------------------------------------------- */
void api_h_metrics(kvr_api_t *s, struct evhttp_request *req);
/* The router API's families: its service's metrics callback (arg: the kvr_api_t). */
void api_metrics(void *arg, kvr_prom_t *p);

#endif
