/*
 * api_int.h: what the HTTP API's files share (internal to net/api_server*.c, api_metrics.c,
 * api_health.c): the server's state and the reply helpers.
 *   api_server.c   listeners, dispatch of requests, the routing / lifecycle / workers /
 *                  /router endpoints (through the scheduler), creation and the tick
 *   api_metrics.c  GET /metrics: the router's, the ingest thread's and the workers' families
 *   api_health.c   health probes, fencing and readmission, the ranks' status from the ingest
 *                  thread and the warning about ranks whose events never came
 * Threads: the HTTP thread only.
 */
#ifndef KVR_NET_API_INT_H
#define KVR_NET_API_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/http.h>

#include "core/load.h"
#include "kvrouter/sched.h"
#include "http/access.h"
#include "api/api_server.h"
#include "http/http_guard.h"
#include "base/log.h"
#include "wire/api_json.h"
#include "wire/json_writer.h"
#include "wire/prom.h"

#define MAX_PROBES 4096

typedef struct probe {
    kvr_api_server_t *s;
    uint64_t worker_id;
    struct evhttp_connection *conn;
    bool in_flight;
    bool dead; /* its worker was removed; kept until the server goes (a late callback) */
    uint32_t failures;
    char suspect[96]; /* non-empty: a probe sent on other evidence; its failure fences */
    /* its KV-cache size from GET /metrics, when registered without one (api_health.c) */
    struct evhttp_connection *cap_conn; /* its own: a health connection may be closing */
    bool cap_in_flight;
    uint8_t cap_tries; /* failed fetches; it gives up after CAP_TRIES */
} probe_t;

/* A JSON API request waiting in the scheduler's queue: the client to answer when it leaves.
 * Kept on a free list (no allocation once warm); every one ever made is on the all list. */
typedef struct waiter {
    kvr_api_server_t *s;
    struct evhttp_request *req;
    kvr_ticket_t ticket;
    bool tagged; /* came from POST /router (reply shape differs) */
    struct waiter *next_free, *next_all;
} waiter_t;

struct kvr_api_server {
    struct event_base *base;
    struct evhttp *http, *admin_http; /* the client port; the admin listener (or NULL) */
    kvr_http_guard_t *guards[2];      /* their connection limits: client, admin */
    size_t n_guards;
    uint16_t admin_port;
    kvr_access_t access;
    uint64_t unauthorized; /* answered 401 */
    struct event *tick;
    kvr_router_t *r;
    kvr_ingest_t *g;
    kvr_sched_t *sched; /* places, queues and tracks requests (core/sched.h) */
    kvr_router_config_t cfg;
    uint16_t port;
    kvr_api_decoder_t *dec;
    kvr_json_writer_t w;
    kvr_prom_t prom;
    struct evbuffer *out;
    waiter_t *free_waiters, *all_waiters;
    probe_t **probes; /* live probes, then dead ones from n_probes to n_all */
    size_t n_probes, n_all;
    uint64_t last_probe_ms;
    kvr_hist_t h_hash, h_lookup, h_select, h_total;
    uint64_t routes_with_overlap;
    uint64_t http_requests, http_errors_4xx, http_errors_5xx;
    kvr_rank_score_t *scores;
    kvr_load_projection_t *loads;
    size_t cap_ranks;
    kvr_ratelimit_t rl_health;
    kvr_ratelimit_t rl_silent; /* ranks whose KV events never came (warn_silent_ranks) */
    kvr_ratelimit_t rl_cap;    /* capacity fetches that failed */
    uint64_t cap_fetches[3];   /* capacity from /metrics: learnt, none there, failed */
    uint64_t first_routed_ms, last_silent_check_ms;
    kvr_api_extension_t ext[KVR_API_MAX_EXTENSIONS]; /* the OpenAI front end, replica sync */
    size_t n_ext;
    char index_origin[512]; /* "" = not told (shown as nothing) */
};

/* ---- api_server.c ------------------------------------------------------------------------ */
void api_reply_text(kvr_api_server_t *s, struct evhttp_request *req, int code, const char *ctype,
                    const char *body, size_t len);
/* The writer's JSON, or a 500 when it overflowed. */
void api_reply_writer(kvr_api_server_t *s, struct evhttp_request *req, int code);
void api_reply_error(kvr_api_server_t *s, struct evhttp_request *req, int code, const char *type,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* A status code as its HTTP answer (field names the bad field for KVR_EINVAL). */
void api_reply_status(kvr_api_server_t *s, struct evhttp_request *req, int rc, const char *field);
/* A rank's index state as /v1/workers and /metrics name it: the ingest state of a rank with
 * KV events; "no_events" without an events endpoint; "approximate" in approximate mode;
 * "not_indexed" when the router keeps no index (overlap_score_credit 0). */
const char *api_index_state(const kvr_api_server_t *s, const kvr_worker_spec_t *sp,
                            const kvr_rank_status_t *st);

/* ---- api_metrics.c ----------------------------------------------------------------------- */
void api_h_metrics(kvr_api_server_t *s, struct evhttp_request *req);

/* ---- api_health.c ------------------------------------------------------------------------ */
/* Probes every live worker's /health (the tick, every health_interval_ms). */
void api_probe_all(kvr_api_server_t *s);
/* A removed worker's probe is cancelled and kept (a late callback) until the server goes. */
void api_remove_probe(kvr_api_server_t *s, uint64_t id);
/* The ingest thread's latest per-rank snapshot into the router (and suspicion on a lost
 * events connection). */
void api_sync_rank_status(kvr_api_server_t *s);
void api_warn_silent_ranks(kvr_api_server_t *s, uint64_t now);

#endif
