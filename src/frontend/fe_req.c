/*
 * fe_req.c: a front-end request's lifecycle (fe_req.h): made at arrival, linked in fe->live,
 * freed by the state machine once its client is answered or gone; its invariant checker.
 * Invariants: those of fe_req.h. Ownership: see fe_req.h. Threads: the HTTP thread only.
 * Cost: one calloc a request, one free per member it owns.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>

#include "frontend/fe_req.h"

fe_req_t *fe_req_new(kvr_frontend_t *fe, struct evhttp_request *req, kvr_oai_endpoint_t ep,
                     uint64_t t0)
{
    fe_req_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->fe = fe;
    p->client.req = req;
    p->client.conn = evhttp_request_get_connection(req);
    p->client.ep = ep;
    p->client.arrival_ns = t0;
    fe_leg_whole(p);
    return p;
}

void fe_req_free(fe_req_t *p)
{
    assert(p->dis == NULL); /* returned by fe_plan_release(FE_REL_END) */
    if (p->up.sse != NULL)
        evbuffer_free(p->up.sse);
    free(p->prompt.tokens);
    free(p->prompt.body_own);
    free(p->prompt.tok_body);
    free(p->prompt.model);
    free(p->prompt.images);
    free(p->prompt.mm);
    free(p->client.auth);
    free(p->hints.lora);
    free(p->hints.allowed);
    free(p->route.scratch);
    free(p);
}

void fe_req_link(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    p->next = fe->live;
    if (fe->live)
        fe->live->prev = p;
    fe->live = p;
    fe->n_live++;
}

void fe_req_unlink(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    if (p->prev)
        p->prev->next = p->next;
    else
        fe->live = p->next;
    if (p->next)
        p->next->prev = p->prev;
    fe->n_live--;
}

void fe_leg_whole(fe_req_t *p)
{
    p->leg = (fe_leg_t){.shape = NULL,
                        .pin = &p->hints.worker,
                        .body = NULL,
                        .silence_ms = p->fe->cfg.frontend_upstream_timeout_ms,
                        .may_stream = true,
                        .keep = FE_KEEP_NONE};
}

/* The request is about to get its last reply: nothing may reach it through its connection. */
struct evhttp_request *fe_client_take(fe_req_t *p)
{
    struct evhttp_request *c = p->client.req;
    if (c != NULL)
        evhttp_connection_set_closecb(p->client.conn, NULL, NULL);
    p->client.req = NULL;
    return c;
}

size_t fe_client_backlog(const fe_req_t *p)
{
    if (p->client.req == NULL || p->client.conn == NULL)
        return 0;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(p->client.conn);
    return bev != NULL ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
}

bool fe_set_tokens(fe_req_t *p, const uint32_t *t, size_t n)
{
    free(p->prompt.tokens);
    p->prompt.tokens = malloc((n ? n : 1) * sizeof *t);
    if (p->prompt.tokens == NULL)
        return false;
    if (n)
        memcpy(p->prompt.tokens, t, n * sizeof *t);
    p->prompt.n_tokens = n;
    return true;
}

void fe_on_up_error(enum evhttp_request_error err, void *arg)
{
    fe_req_t *p = arg;
    p->up.err_set = true;
    switch (err) {
    case EVREQ_HTTP_TIMEOUT:
        p->up.err = UPK_TIMEOUT; /* connected, then silent (a connect timeout is UPK_CONNECT) */
        break;
    case EVREQ_HTTP_EOF:
        p->up.err = UPK_EOF;
        break;
    case EVREQ_HTTP_DATA_TOO_LONG:
        p->up.err = UPK_TOO_LARGE;
        break;
    default:
        p->up.err = UPK_PROTOCOL;
        break;
    }
}

void fe_req_verify(const fe_req_t *p)
{
#ifdef NDEBUG
    (void)p;
#else
    assert(p->fe != NULL);
    assert(p->phase <= PH_RETRY);
    assert((p->up.req == NULL) == (p->up.uc == NULL));
    assert(p->up.uc == NULL || p->up.uc->busy);
    assert(p->phase != PH_QUEUED || (p->route.ticket != 0 && !fe_req_booked(p) &&
                                     p->up.req == NULL));
    assert(p->client.req == NULL || p->client.conn != NULL);
    assert(p->client.kept == FE_KEEP_NONE || p->client.req == NULL);
    assert(!p->client.slow_abort || p->retry_ev != NULL);
    assert(p->route.n_tried <= FE_MAX_ATTEMPTS && p->prompt.n_tok_tried <= FE_MAX_ATTEMPTS);
    assert(p->leg.pin == &p->hints.worker || p->leg.pin == &p->hints.pf);
    assert(p->prompt.body == NULL || p->prompt.body == p->prompt.body_own ||
           p->prompt.body == p->prompt.client_body || p->client.kept != FE_KEEP_NONE);
    assert(!p->prompt.rewrite || p->prompt.body == NULL || p->prompt.body == p->prompt.body_own);
    assert(p->prompt.body == NULL || p->prompt.tokens != NULL);
    assert(p->dis != NULL || (p->leg.shape == NULL && p->leg.pin == &p->hints.worker &&
                              p->leg.body == NULL));
#endif
}
