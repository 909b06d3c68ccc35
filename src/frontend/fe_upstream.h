/*
 * fe_upstream.h: the front end's per-worker upstream side (fe_upstream.c): one pool of
 * keep-alive connections per worker, its failure accounting (consecutive failures fence the
 * worker), the Authorization a worker gets, and the worker's model list (fe_models.c fills it).
 * Invariants: a pool is in fe->pools from its first use until the tick frees it (dead: its
 * worker left or changed url, and none of its connections is busy); n_busy counts the busy
 * connections. Ownership: the front end owns the pools; a caller holds a connection from
 * fe_pool_acquire to fe_pool_release. Threads: the HTTP thread only. Cost: an acquire scans
 * the pool's connections (a handful), a lookup the pools (one per worker).
 */
#ifndef KVR_FRONTEND_FE_UPSTREAM_H
#define KVR_FRONTEND_FE_UPSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/http.h>

#include "core/endpoint.h"
#include "frontend/frontend.h"

typedef enum up_kind {
    UPK_CONNECT = 0, /* refused, unreachable, or no connection within the timeout */
    UPK_TIMEOUT,     /* silence past frontend_upstream_timeout_ms on a connected upstream */
    UPK_EOF,         /* closed before the response was complete */
    UPK_PROTOCOL,    /* a malformed answer */
    UPK_NO_URL,      /* the worker has no usable url */
    UPK_STATUS_5XX,  /* answered with a 5xx status (relayed, not retried) */
    UPK_TOO_LARGE,   /* a whole answer longer than frontend_max_answer_bytes */
    UPK_COUNT
} up_kind_t;

extern const char *const UPK_NAMES[UPK_COUNT]; /* fe_metrics.c */

typedef struct upool upool_t;

typedef struct upconn {
    upool_t *pool;
    struct evhttp_connection *conn;
    bool busy;
} upconn_t;

typedef struct pmodel {
    char *id, *owned_by, *parent; /* parent: a LoRA adapter's base model; NULL: none */
    uint64_t created, max_model_len;
} pmodel_t;

/* One worker's upstream side: where it is, its connections, its failures, its models. */
struct upool {
    kvr_frontend_t *fe;
    uint64_t worker_id;
    char url[KVR_ADDR_BYTES];
    kvr_url_t loc; /* url taken apart: host, port, Host header, base path */
    bool bad_url;
    bool dead;                 /* left the registry or changed url: freed once unused */
    upconn_t **conns;
    size_t n_conns, cap_conns, n_busy;
    uint32_t consecutive_failures;
    /* GET /v1/models */
    struct evhttp_connection *mconn;
    bool m_in_flight;
    pmodel_t *models;
    size_t n_models;
};

/* The live pool of a registered worker (made on first use; a new one when its url changed). */
upool_t *fe_pool_for(kvr_frontend_t *fe, const kvr_worker_spec_t *sp);
struct evhttp_connection *fe_new_conn(kvr_frontend_t *fe, const upool_t *u,
                                      const struct timeval *tv);
/* An idle pooled connection to u, or a new one; timeout_ms of silence allowed on this call. */
upconn_t *fe_pool_acquire(kvr_frontend_t *fe, upool_t *u, uint64_t timeout_ms);
void fe_pool_release(upconn_t *c);
void fe_pool_free(upool_t *u);
/* A refused connection or a failure before the first byte: counted against the worker. */
void fe_worker_failed(kvr_frontend_t *fe, upool_t *u, up_kind_t kind);
/* Frees the pools of workers gone and idle connections beyond the cap. */
void fe_pool_upkeep(kvr_frontend_t *fe);
/* An upstream failure counted by kind and logged (rate-limited). */
void fe_up_count_error(kvr_frontend_t *fe, up_kind_t kind, uint64_t worker_id, bool before);
/* The Authorization a worker gets: client_auth (the client's, when forwarded) else the
 * router's own worker token, else none. */
void fe_up_add_auth(const kvr_frontend_t *fe, const char *client_auth, struct evkeyvalq *h);

#endif
