/*
 * fe_upstream.c: the front end's per-worker upstream pools (fe_upstream.h): keep-alive
 * connections reused up to frontend_max_idle_connections, a new pool when a worker's url
 * changes, and consecutive failures that fence a worker.
 * Invariants, ownership, threads and cost: see fe_upstream.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <yajl/yajl_tree.h>

#include "kvrouter/router.h"
#include "fleet/fleet.h"
#include "frontend/fe_ctx.h"
#include "frontend/fe_upstream.h"

/* ---------------------------------------------------------------------------------------- */
/* Upstream pools */

void fe_pool_free(upool_t *u)
{
    for (size_t i = 0; i < u->n_conns; i++) {
        if (u->conns[i]->conn != NULL)
            evhttp_connection_free(u->conns[i]->conn);
        free(u->conns[i]);
    }
    if (u->mconn != NULL)
        evhttp_connection_free(u->mconn);
    for (size_t i = 0; i < u->n_models; i++) {
        free(u->models[i].id);
        free(u->models[i].owned_by);
        free(u->models[i].parent);
    }
    free(u->models);
    free(u->conns);
    free(u);
}

/* The live pool of a registered worker (made on first use; a new one when its url changed). */
upool_t *fe_pool_for(kvr_frontend_t *fe, const kvr_worker_spec_t *sp)
{
    for (size_t i = 0; i < fe->n_pools; i++) {
        upool_t *u = fe->pools[i];
        if (u->dead || u->worker_id != sp->worker_id)
            continue;
        if (strcmp(u->url, sp->url) == 0)
            return u;
        u->dead = true; /* re-registered elsewhere */
    }
    if (fe->n_pools == fe->cap_pools) {
        size_t cap = fe->cap_pools ? fe->cap_pools * 2 : 16;
        upool_t **pp = realloc(fe->pools, cap * sizeof *pp);
        if (pp == NULL)
            return NULL;
        fe->pools = pp;
        fe->cap_pools = cap;
    }
    upool_t *u = calloc(1, sizeof *u);
    if (u == NULL)
        return NULL;
    u->fe = fe;
    u->worker_id = sp->worker_id;
    snprintf(u->url, sizeof u->url, "%s", sp->url);
    u->bad_url = sp->url[0] == '\0' ||
                 kvr_endpoint_parse_url(sp->url, NULL, &u->loc, NULL, 0) != KVR_OK;
    fe->pools[fe->n_pools++] = u;
    return u;
}

struct evhttp_connection *fe_new_conn(kvr_frontend_t *fe, const upool_t *u,
                                          const struct timeval *tv)
{
    struct evhttp_connection *c =
        evhttp_connection_base_new(fe->base, NULL, u->loc.host, u->loc.port);
    if (c == NULL)
        return NULL;
    evhttp_connection_set_timeout_tv(c, tv);
    /* a worker's status line and headers: a longer head fails the call before it is kept */
    evhttp_connection_set_max_headers_size(c, FE_MAX_UPSTREAM_HEADER_BYTES);
    struct bufferevent *bev = evhttp_connection_get_bufferevent(c);
    if (bev != NULL) {
        bufferevent_set_max_single_read(bev, FE_BEV_MAX_IO);
        bufferevent_set_max_single_write(bev, FE_BEV_MAX_IO);
    }
    return c;
}

static struct timeval ms_tv(uint64_t ms)
{
    return (struct timeval){.tv_sec = (time_t)(ms / 1000),
                            .tv_usec = (suseconds_t)(ms % 1000) * 1000};
}

/* An idle keep-alive connection of the pool, or a new one, with timeout_ms of silence
 * allowed on it for this call. */
upconn_t *fe_pool_acquire(kvr_frontend_t *fe, upool_t *u, uint64_t timeout_ms)
{
    struct timeval tv = ms_tv(timeout_ms);
    for (size_t i = u->n_conns; i-- > 0;) {
        upconn_t *c = u->conns[i];
        if (!c->busy) {
            c->busy = true;
            u->n_busy++;
            evhttp_connection_set_timeout_tv(c->conn, &tv);
            return c;
        }
    }
    if (u->n_conns == u->cap_conns) {
        size_t cap = u->cap_conns ? u->cap_conns * 2 : 8;
        upconn_t **cc = realloc(u->conns, cap * sizeof *cc);
        if (cc == NULL)
            return NULL;
        u->conns = cc;
        u->cap_conns = cap;
    }
    upconn_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    if ((c->conn = fe_new_conn(fe, u, &tv)) == NULL) {
        free(c);
        return NULL;
    }
    c->pool = u;
    c->busy = true;
    u->conns[u->n_conns++] = c;
    u->n_busy++;
    return c;
}

void fe_pool_release(upconn_t *c)
{
    if (c != NULL && c->busy) {
        c->busy = false;
        c->pool->n_busy--;
    }
}

void fe_up_count_error(kvr_frontend_t *fe, up_kind_t kind, uint64_t worker_id, bool before)
{
    fe->st.upstream_errors[kind]++;
    kvr_log_limited(&fe->rl_up, KVR_LOG_WARN, "upstream %s on worker %llu (%s the first byte)",
                    UPK_NAMES[kind], (unsigned long long)worker_id, before ? "before" : "after");
}

/* The client's Authorization when frontend_forward_authorization is on and it sent one, else
 * the router's own worker token, else none. */
void fe_up_add_auth(const kvr_frontend_t *fe, const char *client_auth, struct evkeyvalq *h)
{
    if (client_auth != NULL)
        evhttp_add_header(h, "Authorization", client_auth);
    else if (fe->worker_auth[0] != '\0')
        evhttp_add_header(h, "Authorization", fe->worker_auth);
}

/* A refused connection or a failure before the first byte: counted against the worker. */
void fe_worker_failed(kvr_frontend_t *fe, upool_t *u, up_kind_t kind)
{
    if (kind == UPK_NO_URL)
        return;
    if (kind == UPK_CONNECT)
        kvr_fleet_suspect(fe->fleet, u->worker_id, "a request could not connect");
    u->consecutive_failures++;
    if (u->consecutive_failures >= fe->cfg.frontend_fence_failures &&
        !kvr_router_fenced(fe->r, u->worker_id) && kvr_router_worker(fe->r, u->worker_id)) {
        char why[96];
        snprintf(why, sizeof why, "failed %u upstream requests in a row (last: %s)",
                 u->consecutive_failures, UPK_NAMES[kind]);
        kvr_fleet_fence(fe->fleet, u->worker_id, why);
        fe->st.fenced++;
    }
}


void fe_pool_upkeep(kvr_frontend_t *fe)
{
    size_t o = 0;
    for (size_t i = 0; i < fe->n_pools; i++) {
        upool_t *u = fe->pools[i];
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, u->worker_id);
        if (sp == NULL || strcmp(sp->url, u->url) != 0)
            u->dead = true;
        if (u->dead && u->n_busy == 0 && !u->m_in_flight) {
            fe_pool_free(u);
            continue;
        }
        /* idle connections beyond the cap (the oldest ones first) */
        size_t idle = u->n_conns - u->n_busy;
        size_t keep = u->dead ? 0 : fe->cfg.frontend_max_idle_connections;
        size_t w = 0;
        for (size_t k = 0; k < u->n_conns; k++) {
            upconn_t *c = u->conns[k];
            if (!c->busy && idle > keep) {
                evhttp_connection_free(c->conn);
                free(c);
                idle--;
                continue;
            }
            u->conns[w++] = c;
        }
        u->n_conns = w;
        fe->pools[o++] = u;
    }
    fe->n_pools = o;
}
