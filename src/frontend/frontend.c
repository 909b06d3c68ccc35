/*
 * frontend.c: the OpenAI front end (see frontend.h for what it does and the policies).
 *
 * This file is the request state machine: decode, route (through the scheduler, kvrouter/sched.h:
 * a queued request is borrowed, not copied, and every lifecycle call goes by the booking's
 * handle), proxy, relay, retry, disconnect, slow clients; plus the tick and the lifecycle,
 * and the replies to clients (http/reply.h, OpenAI's error shape). It runs LEGS (p->leg): an aggregated request has
 * one, the whole request; a disaggregated one has those the leg planner (fe_disagg.h) gives
 * at its four hooks (fe_plan_first at the ids, fe_plan_placed at a booking, fe_plan_ended at
 * a leg's end, fe_plan_release at the request's end), whose verdicts the machine carries out
 * (apply). The other jobs have their own files and headers, none of which calls back here
 * but through a callback: fe_req.c (the per-request struct), fe_tokenize.c (ids from a
 * worker's /tokenize, cached: one callback, tok_done), fe_body.c (the workers' body, the nvext
 * naming the worker), fe_relay.c (SSE events cut for the client: on_token), fe_upstream.c
 * (per-worker connection pools), fe_models.c (GET /v1/models), fe_metrics.c, fe_disagg.c
 * (the planner: leg_lost).
 *
 * Invariants (fe_req.h states them per request, fe_req_verify asserts them): a request is in
 * the live list from arrival until its client is answered or gone. While it has an upstream
 * call (up.req) it holds one busy pooled connection (up.uc). Its client connection's close
 * callback points at it until its last reply is handed to libevent. It is booked in the
 * router (route.handle) between a successful placement and its free. Retries, leg switches
 * and failures continue from a zero-delay timer (retry_ev), never inside the libevent call
 * that reported them (which may run inside evhttp_make_request), so no request is freed under
 * a caller; connections are freed only by the tick, never inside their own callbacks
 * (libevent touches them after the callback returns).
 * libevent 2.1 lifetimes relied on: an upstream request is freed by libevent right after its
 * completion callback (after the error callback, before the completion callback with NULL, on
 * a failure), and without any callback by evhttp_cancel_request once its error callback is
 * cleared; a client request whose connection fails while a reply is still owed is detached
 * (its connection pointer becomes NULL) and is then ours to free, while one still attached
 * when its connection is freed is freed by libevent.
 * Memory: per request, its copies (ids, routing fields, bodies it had to rebuild); pooled
 * connections; the cache within its cap. Threads: the HTTP thread only. Cost: per request a
 * decode, a route, one upstream call (per leg), the relay's pass over the answer.
 */
#include "frontend/frontend.h"
#include "base/clock.h"
#include "http/http.h"

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <xxhash.h>
#include <yajl/yajl_tree.h>

#include "core/endpoint.h"
#include "fleet/fleet.h"
#include "frontend/tokcache.h"
#include "base/log.h"
#include "base/secret.h"
#include "wire/api_json.h"
#include "wire/json_scan.h"
#include "wire/json_writer.h"
#include "wire/oai_usage.h"
#include "wire/openai.h"
#include "wire/prom.h"

#include "frontend/fe_body.h"
#include "frontend/fe_ctx.h"
#include "frontend/fe_disagg.h"
#include "frontend/fe_metrics.h"
#include "frontend/fe_models.h"
#include "frontend/fe_relay.h"
#include "frontend/fe_req.h"
#include "frontend/fe_inproc.h"
#include "frontend/fe_tokenize.h"
#include "frontend/fe_upstream.h"

/* seconds: 5 us to 1 s */
static const double FORWARD_BUCKETS[] = {5e-6,   1e-5, 2.5e-5, 5e-5,   1e-4, 2.5e-4, 5e-4, 1e-3,
                                         2.5e-3, 5e-3, 1e-2,   2.5e-2, 5e-2, 0.1,    0.25, 1};
#define N_FORWARD_BUCKETS (sizeof FORWARD_BUCKETS / sizeof FORWARD_BUCKETS[0])

/* A request's invariants and its planner part's, at a state transition (no code under
 * NDEBUG). */
#ifdef NDEBUG
#define VERIFY(p) ((void)0)
#else
#define VERIFY(p) (fe_req_verify(p), fe_disagg_verify(p))
#endif

static void req_finish(fe_req_t *p);
static void end_stream(fe_req_t *p, const char *error);
static void route_attempt(fe_req_t *p);

/* ---------------------------------------------------------------------------------------- */
/* Replies to clients */


/* Answers with an error and frees the request. */
static void req_fail(fe_req_t *p, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void req_fail(fe_req_t *p, int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fe_plan_release(p, FE_REL_CANCEL); /* a bootstrap prefill would wait for a decode that
                                          won't come; a pulled prefill's KV for its timeout
                                          (first: it reads the client's body) */
    struct evhttp_request *c = fe_client_take(p);
    if (c != NULL)
        kvr_reply_error(&p->fe->rep, c, code, NULL, "%s", msg);
    req_finish(p);
}

/* The model's name if the request gave one, else NULL. */
static const char *model_of(const fe_req_t *p)
{
    return p->prompt.model != NULL && p->prompt.model[0] != '\0' ? p->prompt.model : NULL;
}

/* 404 for a model no worker serves, naming those they do. */
static void fail_unknown_model(fe_req_t *p)
{
    char names[512];
    fe_models_names(p->fe, names, sizeof names);
    req_fail(p, 404, "The model `%s` does not exist%s%s", p->prompt.model,
             names[0] ? "; the workers serve: " : "", names);
}

/* A routing status as the OpenAI error it is; frees the request. */
static void req_fail_route(fe_req_t *p, int rc, const kvr_route_res_t *res)
{
    switch (rc) {
    case KVR_ENOWORKER:
        if (p->route.n_tried > 0) {
            req_fail(p, 503, "no worker can serve this request (%s)", p->route.last_fail);
        } else {
            char why[600];
            fe_models_why_none(p->fe, model_of(p), why, sizeof why);
            req_fail(p, 503, "no worker can serve this request: %s", why);
        }
        return;
    case KVR_ENOTALLOWED:
        req_fail(p, 503, "the pinned worker is outside the request's filters");
        return;
    case KVR_ENOMODEL:
        if (p->hints.lora != NULL && res && res->error_field &&
            strncmp(res->error_field, "lora", 4) == 0)
            req_fail(p, 404, "no worker serves the LoRA adapter `%s` (lora_strict)", p->hints.lora);
        else
            fail_unknown_model(p);
        return;
    case KVR_EBUSY:
        req_fail(p, 429, "every eligible worker is busy");
        return;
    case KVR_EQUEUEFULL:
        req_fail(p, 429, "the request queue is full");
        return;
    case KVR_EFULL:
        req_fail(p, 429, "too many requests in flight");
        return;
    case KVR_ETOOBIG:
        req_fail(p, 413, "prompt longer than router_max_prompt_tokens (%llu tokens)",
                    (unsigned long long)p->fe->cfg.router_max_prompt_tokens);
        return;
    case KVR_EINVAL:
    case KVR_EPARSE:
    case KVR_ERANGE:
        req_fail(p, 400, "%s", res && res->error_field ? res->error_field : kvr_strerror(rc));
        return;
    default:
        req_fail(p, 500, "routing failed: %s", kvr_strerror(rc));
        return;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Requests: lifecycle */

/* The workers without a url (a proxy cannot reach them; the router API may still book them)
 * are kept as a list, exact from the fleet's membership changes, that every attempt excludes. */
static void urlless_add(kvr_frontend_t *fe, uint64_t id)
{
    if (fe->urlless == NULL &&
        (fe->urlless = malloc(FE_MAX_WORKERS * sizeof *fe->urlless)) == NULL) {
        fe->urlless_lost++;
        return;
    }
    if (fe->n_urlless < FE_MAX_WORKERS)
        fe->urlless[fe->n_urlless++] = id;
    else
        fe->urlless_lost++;
}

static void urlless_remove(kvr_frontend_t *fe, uint64_t id)
{
    for (size_t i = 0; i < fe->n_urlless; i++)
        if (fe->urlless[i] == id) {
            fe->urlless[i] = fe->urlless[--fe->n_urlless];
            return;
        }
}

static void fe_worker_added(void *arg, const kvr_worker_spec_t *w)
{
    if (w->url[0] == '\0')
        urlless_add(arg, w->worker_id);
    fe_inproc_worker_added(arg, w);
}

/* The fleet removed a worker, and the router its bookings: the requests still running there
 * drain from the engine but have nothing left to mark or free. */
static void fe_worker_removed(void *arg, uint64_t worker_id)
{
    kvr_frontend_t *fe = arg;
    urlless_remove(fe, worker_id);
    for (fe_req_t *p = fe->live; p != NULL; p = p->next)
        if (fe_req_booked(p) && p->route.worker.worker_id == worker_id)
            p->route.handle = KVR_REQ_HANDLE_NONE;
    fe_disagg_worker_removed(fe, worker_id);
}

/* Drops the upstream call without any callback (the connection is closed: the worker sees
 * the disconnect and cancels its request). */
static void cancel_upstream(fe_req_t *p)
{
    if (p->up.req != NULL) {
        evhttp_request_set_error_cb(p->up.req, NULL);
        evhttp_request_set_chunked_cb(p->up.req, NULL);
        evhttp_cancel_request(p->up.req);
        p->up.req = NULL;
    }
    fe_pool_release(p->up.uc);
    p->up.uc = NULL;
}

/* Frees the router's booking (the queue may place something now). */
static void unbook(fe_req_t *p)
{
    kvr_req_handle_t h = p->route.handle;
    if (h == KVR_REQ_HANDLE_NONE)
        return;
    p->route.handle = KVR_REQ_HANDLE_NONE;
    (void)kvr_sched_release(p->fe->sched, h, kvr_now_ms()); /* re-runs the queue */
}

/* Releases everything; the client was answered or is gone. */
static void req_finish(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    VERIFY(p);
    cancel_upstream(p);
    if (p->phase == PH_QUEUED)
        (void)kvr_sched_cancel(fe->sched, p->route.ticket);
    if (p->retry_ev != NULL)
        event_free(p->retry_ev);
    p->retry_ev = NULL;
    if (p->client.req != NULL) { /* never left unanswered */
        if (p->client.reply_started) {
            end_stream(p, "internal error: the request was dropped");
        } else {
            struct evhttp_request *c = fe_client_take(p);
            kvr_reply_error(&fe->rep, c, 500, NULL, "internal error: the request was dropped");
        }
    }
    fe_plan_release(p, FE_REL_END); /* a bootstrap prefill call runs to its end on its own */
    fe_req_unlink(p);
    kvr_req_handle_t handle = p->route.handle;
    fe_req_free(p);
    if (handle != KVR_REQ_HANDLE_NONE) /* last: the queue may place another request, which
                                          may call back here */
        (void)kvr_sched_release(fe->sched, handle, kvr_now_ms());
}

/* Whether p's call goes on though its client left (the leg says until when). */
static bool call_outlives_client(const fe_req_t *p)
{
    fe_keep_t k = p->leg.keep;
    return !p->client.slow_abort && p->up.req != NULL &&
           (k == FE_KEEP_TO_ANSWER || (k == FE_KEEP_TO_HEADERS && !p->up.got_headers));
}

static void on_client_close(struct evhttp_connection *conn, void *arg)
{
    (void)conn;
    fe_req_t *p = arg;
    if (!p->client.slow_abort)
        p->fe->st.client_disconnects++;
    struct evhttp_request *c = p->client.req;
    p->client.req = NULL;
    if (call_outlives_client(p)) {
        evhttp_connection_set_closecb(p->client.conn, NULL, NULL);
        p->client.kept = p->leg.keep;
        fe_plan_release(p, FE_REL_DETACH); /* what a release call needs of the client's body */
        p->prompt.client_body = NULL;
        p->prompt.client_body_len = 0;
        kvr_http_release_orphan(c);
        return;
    }
    cancel_upstream(p); /* first: nothing of ours may reach the client's buffers after this */
    fe_plan_release(p, FE_REL_CANCEL);
    kvr_http_release_orphan(c); /* http/http_conn.h */
    req_finish(p);
}

static void on_retry(evutil_socket_t fd, short what, void *arg);

/* The timer failures continue from, made before the first upstream call (so that a failure
 * never needs an allocation). */
static bool ensure_retry_ev(fe_req_t *p)
{
    if (p->retry_ev == NULL)
        p->retry_ev = evtimer_new(p->fe->base, on_retry, p);
    return p->retry_ev != NULL;
}

/* Continues p from a zero-delay timer. */
static void schedule_retry(fe_req_t *p)
{
    static const struct timeval now = {0, 0};
    p->phase = PH_RETRY;
    (void)evtimer_add(p->retry_ev, &now);
}

/* ---------------------------------------------------------------------------------------- */
/* Requests: the planner's verdicts, the ids */

static void reply_whole(fe_req_t *p, struct evhttp_request *up);

/* Continues p on its next leg from its timer (never inside the libevent call that ended the
 * last one): fresh attempts, a booking not yet told its first token. */
static void next_leg(fe_req_t *p)
{
    p->route.leg_pending = true;
    p->route.first_token_sent = false;
    p->route.attempts = 0;
    p->up.leg_sent = false;
    VERIFY(p);
    if (!ensure_retry_ev(p)) {
        req_fail(p, 500, "out of memory");
        return;
    }
    schedule_retry(p);
}

/* Carries out the planner's verdict (up: the leg's answer, for FE_STEP_REPLY). A leg that is
 * over frees its booking first. */
static void apply(fe_req_t *p, const fe_verdict_t *v, struct evhttp_request *up)
{
    switch (v->step) {
    case FE_STEP_GO:
        return;
    case FE_STEP_NEXT:
        unbook(p);
        next_leg(p);
        return;
    case FE_STEP_RETRY:
        if (!ensure_retry_ev(p)) {
            req_fail(p, 500, "out of memory");
            return;
        }
        schedule_retry(p);
        return;
    case FE_STEP_REPLY:
        unbook(p);
        reply_whole(p, up);
        req_finish(p);
        return;
    case FE_STEP_FINISH:
        req_finish(p);
        return;
    case FE_STEP_FAIL:
        unbook(p);
        req_fail(p, v->status, "%s", v->msg);
        return;
    }
}

/* Hook 3, its one site: p's current leg ended (e). True when the machine goes on with its
 * own handling (an aggregated request's), false when the planner's verdict was carried out. */
static bool leg_ended(fe_req_t *p, const fe_leg_end_t *e)
{
    fe_verdict_t v;
    fe_plan_ended(p, e, &v);
    if (v.step == FE_STEP_GO)
        return true;
    apply(p, &v, e->up);
    return false;
}

/* The planner lost p's current leg outside its hooks (a bootstrap prefill call failed under
 * p's decode call): the call is dropped, its booking freed, and p placed again from its
 * timer (the planner has set the leg). */
static void leg_lost(fe_req_t *p)
{
    cancel_upstream(p);
    unbook(p);
    schedule_retry(p);
}

/* The ids are known: the body for the workers, the first leg, then routing. */
static void ids_ready(fe_req_t *p)
{
    int rc = KVR_OK;
    if (!p->prompt.rewrite) {
        p->prompt.body = p->prompt.client_body;
        p->prompt.body_len = p->prompt.client_body_len;
    } else if ((rc = fe_build_forward_body(p)) != KVR_OK) {
        if (rc == KVR_ETOOBIG)
            req_fail(p, 400, "request body: more than %d top-level fields", FE_MAX_MEMBERS);
        else
            req_fail(p, 500, "out of memory");
        return;
    }
    fe_verdict_t v;
    fe_plan_first(p, &v); /* hook 1 */
    if (v.step != FE_STEP_GO) {
        apply(p, &v, NULL);
        return;
    }
    VERIFY(p);
    route_attempt(p);
}

/* The tokenize call's one end. */
static void tok_done(fe_req_t *p, const fe_tok_result_t *r)
{
    switch (r->st) {
    case FE_TOK_IDS:
        p->fe->tok_path[FE_TOKP_WORKER]++;
        if (!fe_set_tokens(p, r->ids, r->n)) {
            req_fail(p, 500, "out of memory");
            return;
        }
        p->phase = PH_START;
        ids_ready(p);
        return;
    case FE_TOK_AGAIN:
        schedule_retry(p);
        return;
    case FE_TOK_ANSWER: {
        struct evhttp_request *c = fe_client_take(p);
        if (c != NULL)
            kvr_reply_body(&p->fe->rep, c, r->status, r->ctype, r->body, r->len);
        req_finish(p);
        return;
    }
    case FE_TOK_FAIL:
        req_fail(p, r->status, "%s", r->body);
        return;
    }
}

/* Asks the next worker for p's ids (the timer exists first: a failure continues from it). */
static void tokenize(fe_req_t *p)
{
    if (!ensure_retry_ev(p)) {
        req_fail(p, 500, "out of memory");
        return;
    }
    p->phase = PH_TOKENIZE;
    fe_tokenize_start(p, tok_done);
}

/* ---------------------------------------------------------------------------------------- */
/* Requests: routing */

static bool was_tried(const fe_req_t *p, uint64_t id)
{
    for (unsigned i = 0; i < p->route.n_tried; i++)
        if (p->route.tried[i] == id)
            return true;
    return false;
}

static bool usable_worker(kvr_frontend_t *fe, uint64_t id)
{
    const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, id);
    return sp != NULL && sp->url[0] != '\0';
}

/* The allowed ids of this leg: the client's list, narrowed to the pinned worker when the pin
 * names no rank; NULL = no filter. Built from the request alone, never from the registry. */
static const uint64_t *leg_allowed(fe_req_t *p, size_t *n)
{
    bool pin_only = p->leg.pin->has && !p->leg.pin->has_rank;
    uint64_t pin = p->leg.pin->worker;
    *n = 0;
    if (!pin_only)
        return p->hints.has_allowed ? (*n = p->hints.n_allowed, p->hints.allowed) : NULL;
    p->route.pin_only = pin;
    bool in = !p->hints.has_allowed;
    for (size_t i = 0; i < p->hints.n_allowed && !in; i++)
        in = p->hints.allowed[i] == pin;
    *n = in ? 1 : 0;
    return &p->route.pin_only;
}

/* The workers this attempt must not be placed on (the router's tried set): those whose
 * upstream failed, and those without a url (a proxy cannot reach them). The tried list itself
 * when every worker has a url (no copy). */
static const uint64_t *attempt_excluded(fe_req_t *p, size_t *n, bool *oom)
{
    kvr_frontend_t *fe = p->fe;
    *oom = false;
    *n = p->route.n_tried;
    if (fe->n_urlless == 0)
        return p->route.tried;
    size_t cap = p->route.n_tried + fe->n_urlless;
    if (p->route.cap_scratch < cap) {
        uint64_t *s = realloc(p->route.scratch, cap * sizeof *s);
        if (s == NULL) {
            *oom = true;
            return NULL;
        }
        p->route.scratch = s;
        p->route.cap_scratch = cap;
    }
    memcpy(p->route.scratch, p->route.tried, p->route.n_tried * sizeof *p->route.scratch);
    memcpy(p->route.scratch + p->route.n_tried, fe->urlless,
           fe->n_urlless * sizeof *p->route.scratch);
    *n = cap;
    return p->route.scratch;
}

static void on_placed(void *arg, int rc, const kvr_route_res_t *res);
static void send_upstream(fe_req_t *p);

static void routed(fe_req_t *p, int rc, const kvr_route_res_t *res)
{
    fe_verdict_t v;
    if (rc != KVR_OK) {
        fe_leg_end_t e = {.how = FE_END_UNPLACED, .rc = rc};
        if (leg_ended(p, &e)) /* a prefill leg falls back */
            req_fail_route(p, rc, res);
        return;
    }
    p->route.handle = res->handle;
    p->route.rid_len = strlen(res->request_id);
    memcpy(p->route.rid, res->request_id, p->route.rid_len + 1);
    p->route.worker = res->worker;
    p->route.step_seen = 0; /* a new worker: its step clock, not the last one's */
    p->route.cached_tokens = res->cached_tokens;
    p->route.events_cached_tokens = res->events_cached_tokens;
    p->route.block_size = res->block_size;
    fe_plan_placed(p, res, &v); /* hook 2 */
    if (v.step != FE_STEP_GO) {
        apply(p, &v, NULL); /* it goes on by itself (a bootstrap pair, or a fallback) */
        return;
    }
    if (p->client.want_worker)
        fe_make_nvext(p, fe_plan_prefill_worker(p));
    VERIFY(p);
    send_upstream(p);
}

/* A chat with images: the placeholder tokens' positions are the model's (its image token id),
 * unknown here, so every block carries every image's hash. Two chats with the same text and
 * other images never share a block in the router's view (the reference's guarantee), at the
 * price of the text before the first image (see docs/serve.md). False on out of memory. */
static bool image_blocks(fe_req_t *p)
{
    kvr_route_req_t q = {.n_tokens = p->prompt.n_tokens,
                         .model = p->prompt.model,
                         .model_len = p->prompt.model_len};
    size_t n = kvr_router_n_blocks(p->fe->r, &q);
    if (n == 0)
        return true;
    if ((p->prompt.mm = malloc(n * sizeof *p->prompt.mm)) == NULL)
        return false;
    for (size_t i = 0; i < n; i++)
        p->prompt.mm[i] = (kvr_block_mm_t){(uint32_t)i, p->prompt.images, p->prompt.n_images};
    p->prompt.n_mm = n;
    return true;
}

/* Places p's current leg (queued when every eligible worker is busy). */
static void route_attempt(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    size_t n_allowed = 0, n_excluded = 0;
    bool oom = p->prompt.n_images > 0 && p->prompt.mm == NULL && !image_blocks(p);
    const uint64_t *allowed = leg_allowed(p, &n_allowed);
    const uint64_t *excluded = oom ? NULL : attempt_excluded(p, &n_excluded, &oom);
    if (oom) {
        req_fail(p, 500, "out of memory");
        return;
    }
    kvr_route_req_t q = {
        .tokens = p->prompt.tokens,
        .n_tokens = p->prompt.n_tokens,
        .update_state = true,
        .model = p->prompt.model,
        .model_len = p->prompt.model_len,
        .lora_name = p->hints.lora,
        .lora_name_len = p->hints.lora_len,
        .has_allowed = allowed != NULL,
        .allowed_ids = allowed,
        .n_allowed = n_allowed,
        .exclude_ids = excluded,
        .n_exclude = n_excluded,
        .has_pinned = p->leg.pin->has && p->leg.pin->has_rank,
        .pinned = {p->leg.pin->worker, p->leg.pin->rank},
        .priority_jump = p->hints.priority_jump,
        .session_id = p->hints.session_len > 0 ? p->hints.session : NULL,
        .session_id_len = p->hints.session_len,
        .session_close = p->hints.session_close,
        .mm = p->prompt.mm,
        .n_mm = p->prompt.n_mm,
        .has_expected_output_tokens = p->hints.has_eot,
        .expected_output_tokens = p->hints.eot,
    };
    q.pool = KVR_POOL_SERVE;
    if (p->leg.shape != NULL)
        p->leg.shape(&q); /* the leg's pool and overrides */
    /* borrowed while queued: tokens, lora, allowed and excluded ids live in p until it is
     * placed or cancelled (fe_req_finish) */
    kvr_place_t pl = {.q = &q, .copy = false, .done = on_placed, .arg = p};
    kvr_route_res_t res;
    p->phase = PH_START;
    int rc = kvr_sched_place(fe->sched, &pl, kvr_now_ms(), &res, &p->route.ticket);
    if (rc == KVR_OK && p->route.ticket != 0) {
        p->phase = PH_QUEUED;
        return;
    }
    routed(p, rc, &res);
}

static void on_placed(void *arg, int rc, const kvr_route_res_t *res)
{
    fe_req_t *p = arg;
    p->phase = PH_START;
    if (p->fe->closing) {
        req_fail(p, 503, "the router is shutting down");
        return;
    }
    if (res == NULL) {
        char msg[200];
        int code = kvr_fleet_wait_failed(p->fe->r, rc, msg, sizeof msg);
        req_fail(p, code, "%s", msg);
        return;
    }
    routed(p, rc, res);
}

/* ---------------------------------------------------------------------------------------- */
/* Requests: the upstream call */

/* The upstream failed before its first byte: retried elsewhere from the timer. */
static void attempt_failed(fe_req_t *p, up_kind_t kind)
{
    kvr_frontend_t *fe = p->fe;
    fe_up_count_error(fe, kind, p->route.worker.worker_id, true);
    unsigned n = p->route.attempts;
    snprintf(p->route.last_fail, sizeof p->route.last_fail,
             "%u upstream attempt%s failed, the last with %s on worker %llu", n,
             n == 1 ? "" : "s", UPK_NAMES[kind], (unsigned long long)p->route.worker.worker_id);
    if (p->up.pool != NULL)
        fe_worker_failed(fe, p->up.pool, kind);
    if (p->route.n_tried < FE_MAX_ATTEMPTS)
        p->route.tried[p->route.n_tried++] = p->route.worker.worker_id;
    unbook(p);
    fe_leg_end_t e = {.how = FE_END_FAILED};
    if (leg_ended(p, &e)) /* a bootstrap pair starts again from its prefill */
        schedule_retry(p);
}

/* The headers naming the workers that served p. */
static void add_worker_headers(const fe_req_t *p, struct evkeyvalq *h)
{
    char v[24];
    snprintf(v, sizeof v, "%llu", (unsigned long long)p->route.worker.worker_id);
    evhttp_add_header(h, "x-kvrouter-worker-id", v);
    snprintf(v, sizeof v, "%u", p->route.worker.dp_rank);
    evhttp_add_header(h, "x-kvrouter-dp-rank", v);
    const kvr_worker_t *pf = fe_plan_prefill_worker(p);
    if (pf != NULL) {
        snprintf(v, sizeof v, "%llu", (unsigned long long)pf->worker_id);
        evhttp_add_header(h, "x-kvrouter-prefill-worker-id", v);
    }
}

/* The SSE headers go to the client (once). */
static void start_reply(fe_req_t *p)
{
    if (p->client.reply_started || p->client.req == NULL)
        return;
    p->client.reply_started = true;
    struct evkeyvalq *h = evhttp_request_get_output_headers(p->client.req);
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    add_worker_headers(p, h);
    /* events are small writes: without this, Nagle holds one back until the client's
     * delayed ACK */
    struct bufferevent *bev = evhttp_connection_get_bufferevent(p->client.conn);
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    if (fd >= 0) {
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    evhttp_send_reply_start(p->client.req, 200, "OK");
}

/* A token arrived (the relay's on_token): first token and output blocks reported to the
 * router. */
static void mark_token(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    uint64_t now = kvr_now_ms();
    p->client.last_token_ns = kvr_now_ns();
    if (p->client.gen_tokens++ == 0)
        p->client.first_token_ns = p->client.last_token_ns;
    fe->st.stream_tokens++;
    if (!fe_req_booked(p))
        return; /* its worker was removed, and its booking with it */
    /* its worker's engine steps, told by whose tokens arrive: the clock the locality cost
     * reads (route time is kvr_now_ms() x 1000, the same monotonic clock) */
    (void)kvr_router_worker_token(kvr_sched_router(fe->sched), p->route.worker,
                                  &p->route.step_seen, p->client.last_token_ns / 1000);
    if (!p->route.first_token_sent) {
        p->route.first_token_sent = true;
        (void)kvr_sched_first_token(fe->sched, p->route.handle, now); /* the queue may move */
    }
    uint64_t bs = p->route.block_size ? p->route.block_size : fe->cfg.block_size;
    uint64_t total = p->prompt.n_tokens + p->client.gen_tokens;
    if (bs > 0 && total % bs == 1 % bs) {
        double decay = NAN;
        if (p->hints.has_eot) {
            double d = 1.0 - (double)p->client.gen_tokens /
                                 (double)(p->hints.eot ? p->hints.eot : 1);
            decay = d > 0 ? d : 0;
        }
        (void)kvr_sched_output_block(fe->sched, p->route.handle, decay, now);
    }
}

/* A client that does not read what it asked for is aborted like one that left, but not from
 * here: relay runs inside the upstream request's own callbacks, where the request cannot be
 * cancelled. retry_ev (made before the upstream call) continues in on_retry. */
static void check_client_backlog(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    size_t pending = fe_client_backlog(p);
    if (p->client.slow_abort || pending <= fe->cfg.frontend_max_client_buffer_bytes ||
        p->retry_ev == NULL)
        return;
    p->client.slow_abort = true;
    fe->st.slow_client_aborts++;
    kvr_log_limited(&fe->rl_slow, KVR_LOG_WARN, "request %.*s on worker %llu: the client does "
                    "not read its stream (%zu bytes pending > frontend_max_client_buffer_bytes "
                    "%llu): aborted", (int)p->route.rid_len, p->route.rid,
                    (unsigned long long)p->route.worker.worker_id, pending,
                    (unsigned long long)fe->cfg.frontend_max_client_buffer_bytes);
    static const struct timeval now = {0, 0};
    (void)evtimer_add(p->retry_ev, &now);
}

/* The deferred abort of a slow client, from the timer: closing its connection runs
 * on_client_close (upstream cancelled, booking freed, p freed). */
static void abort_slow_client(fe_req_t *p)
{
    if (p->client.req != NULL && p->client.conn != NULL) {
        evhttp_connection_free(p->client.conn);
        return;
    }
    req_finish(p);
}

/* Forwards the complete events held (all of it when final). */
static void relay(fe_req_t *p, bool final)
{
    struct evbuffer *out = p->fe->out;
    evbuffer_drain(out, evbuffer_get_length(out));
    fe_relay_events(p, final, out, mark_token);
    if (evbuffer_get_length(out) > 0 && p->client.req != NULL) {
        start_reply(p);
        evhttp_send_reply_chunk(p->client.req, out);
        if (!final)
            check_client_backlog(p);
    }
}

static void on_up_chunk(struct evhttp_request *up, void *arg)
{
    fe_req_t *p = arg;
    struct evbuffer *in = evhttp_request_get_input_buffer(up);
    if (p->client.slow_abort || p->client.kept != FE_KEEP_NONE) { /* nothing for this client */
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    evbuffer_add_buffer(p->up.sse, in);
    relay(p, false);
}

static int on_up_header(struct evhttp_request *up, void *arg)
{
    fe_req_t *p = arg;
    p->up.got_headers = true;
    p->up.code = evhttp_request_get_response_code(up);
    if (p->client.kept == FE_KEEP_TO_HEADERS) { /* the decode worker has it: closed from the
                                                    timer */
        evhttp_request_set_chunked_cb(up, NULL);
        schedule_retry(p);
        return 0;
    }
    if (p->up.pool != NULL)
        p->up.pool->consecutive_failures = 0;
    const char *ct = evhttp_find_header(evhttp_request_get_input_headers(up), "Content-Type");
    p->up.sse_mode = p->up.code == 200 && fe_leg_streams(p) && ct != NULL &&
                  strncasecmp(ct, "text/event-stream", 17) == 0;
    if (!p->up.sse_mode)
        evhttp_request_set_chunked_cb(up, NULL); /* the body accumulates for on_up_done */
    else /* relayed as it comes, never accumulated: a stream may be as long as it runs */
        evhttp_connection_set_max_body_size(evhttp_request_get_connection(up), -1);
    if (p->up.code >= 500)
        fe_up_count_error(p->fe, UPK_STATUS_5XX, p->route.worker.worker_id, false);
    if (p->up.code == 200 && !p->up.sse_mode && !p->route.first_token_sent && fe_req_booked(p)) {
        p->route.first_token_sent = true; /* a whole answer: its first token is behind it */
        (void)kvr_sched_first_token(p->fe->sched, p->route.handle, kvr_now_ms());
    }
    return 0;
}

/* The whole (non-SSE) answer, relayed with its status. */
/* usage.completion_tokens of a whole JSON answer (0 when absent): found by search, not parsed,
 * so no copy of the answer is made; the first occurrence is the usage's in an OpenAI answer
 * (choices carry text, never that key). */
static uint64_t completion_tokens(struct evbuffer *in)
{
    static const char key[] = "\"completion_tokens\"";
    struct evbuffer_ptr at = evbuffer_search(in, key, sizeof key - 1, NULL);
    if (at.pos < 0)
        return 0;
    char t[32];
    (void)evbuffer_ptr_set(in, &at, sizeof key - 1, EVBUFFER_PTR_ADD);
    ev_ssize_t n = evbuffer_copyout_from(in, &at, t, sizeof t - 1);
    if (n <= 0)
        return 0;
    t[n] = '\0';
    const char *c = t;
    while (*c == ' ' || *c == ':' || *c == '\t' || *c == '\n' || *c == '\r')
        c++;
    uint64_t v = 0;
    while (*c >= '0' && *c <= '9' && v < UINT64_MAX / 10)
        v = v * 10 + (uint64_t)(*c++ - '0');
    return v;
}

/* usage.prompt_tokens_details.cached_tokens of a whole answer into p->up (when there): the
 * answer is made contiguous only when the key is in it. */
static void answer_cached_tokens(fe_req_t *p, struct evbuffer *in)
{
    static const char key[] = "\"cached_tokens\"";
    if (evbuffer_search(in, key, sizeof key - 1, NULL).pos < 0)
        return;
    const char *b = (const char *)evbuffer_pullup(in, -1);
    uint64_t v;
    if (b != NULL && kvr_oai_usage_cached_tokens(b, evbuffer_get_length(in), &v)) {
        p->up.has_cached = true;
        p->up.cached = v;
    }
}

/* The index checks itself: what the engine found cached against what was predicted (an
 * aggregated request only: a disaggregated leg's cache holds transferred blocks). */
static void report_cached(fe_req_t *p)
{
    if (p->dis != NULL || !fe_req_booked(p))
        return;
    kvr_fleet_cached_report_t r = {.w = p->route.worker,
                                   .prompt_tokens = p->prompt.n_tokens,
                                   .predicted = p->route.events_cached_tokens,
                                   .asked = p->client.usage_asked,
                                   .has_report = p->up.has_cached,
                                   .reported = p->up.cached};
    kvr_fleet_report_cached(p->fe->fleet, &r);
}

/* The whole (non-SSE) answer in up relayed to the client with its status. */
static void reply_whole(fe_req_t *p, struct evhttp_request *up)
{
    kvr_frontend_t *fe = p->fe;
    struct evhttp_request *c = fe_client_take(p);
    if (c == NULL)
        return;
    struct evbuffer *in = evhttp_request_get_input_buffer(up);
    const char *ct = evhttp_find_header(evhttp_request_get_input_headers(up), "Content-Type");
    struct evkeyvalq *h = evhttp_request_get_output_headers(c);
    evhttp_add_header(h, "Content-Type", ct ? ct : "application/json");
    add_worker_headers(p, h);
    evbuffer_drain(fe->out, evbuffer_get_length(fe->out));
    size_t len = evbuffer_get_length(in);
    bool done = false;
    if (p->client.want_worker && p->up.code == 200 && len > 0) {
        const char *b = (const char *)evbuffer_pullup(in, -1);
        done = fe_inject_worker(p, b, len, fe->out);
        if (!done) {
            fe->st.inject_failed++;
            evbuffer_drain(fe->out, evbuffer_get_length(fe->out));
        }
    }
    if (!done)
        evbuffer_add_buffer(fe->out, in);
    kvr_reply_count(&fe->rep, p->up.code);
    evhttp_send_reply(c, p->up.code, NULL, fe->out);
}

/* The end of the SSE stream (with an error event first when it broke). */
static void end_stream(fe_req_t *p, const char *error)
{
    kvr_frontend_t *fe = p->fe;
    if (p->client.req == NULL)
        return;
    if (error != NULL) {
        kvr_json_writer_reset(&fe->w);
        kvr_oai_encode_error(&fe->w, error, NULL, 502);
        const char *j;
        size_t jl;
        evbuffer_drain(fe->out, evbuffer_get_length(fe->out));
        if (kvr_json_writer_finish(&fe->w, &j, &jl) == KVR_OK) {
            evbuffer_add(fe->out, KVR_OAI_SSE_PREFIX, sizeof KVR_OAI_SSE_PREFIX - 1);
            evbuffer_add(fe->out, j, jl);
            evbuffer_add(fe->out, KVR_OAI_SSE_SUFFIX, sizeof KVR_OAI_SSE_SUFFIX - 1);
        }
        evbuffer_add(fe->out, KVR_OAI_SSE_DONE, sizeof KVR_OAI_SSE_DONE - 1);
        start_reply(p);
        evhttp_send_reply_chunk(p->client.req, fe->out);
    }
    start_reply(p);
    struct evhttp_request *c = fe_client_take(p);
    fe->st.streams_ended++;
    evhttp_send_reply_end(c);
}

/* The leg's call broke after its first byte, or went silent before it (kind). */
static void up_broke(fe_req_t *p, up_kind_t kind)
{
    kvr_frontend_t *fe = p->fe;
    fe_leg_end_t e = {.how = FE_END_BROKEN, .kind = kind};
    if (!leg_ended(p, &e)) /* a prefill falls back */
        return;
    if (!p->up.got_headers) { /* accepted, then silent: maybe still generating; not retried */
        fe_up_count_error(fe, kind, p->route.worker.worker_id, true);
        fe_worker_failed(fe, p->up.pool, kind);
        req_fail(p, 504, "worker %llu sent nothing for frontend_upstream_timeout_ms (%llu ms)",
                 (unsigned long long)p->route.worker.worker_id,
                 (unsigned long long)fe->cfg.frontend_upstream_timeout_ms);
        return;
    }
    fe_up_count_error(fe, kind, p->route.worker.worker_id, false);
    if (kind == UPK_TOO_LARGE) {
        fe_worker_failed(fe, p->up.pool, kind);
        req_fail(p, 502, "worker %llu's answer exceeded frontend_max_answer_bytes (%llu bytes)",
                 (unsigned long long)p->route.worker.worker_id,
                 (unsigned long long)fe->cfg.frontend_max_answer_bytes);
        return;
    }
    char msg[160];
    snprintf(msg, sizeof msg, "worker %llu failed mid-response (%s)",
             (unsigned long long)p->route.worker.worker_id, UPK_NAMES[kind]);
    if (p->client.reply_started) {
        relay(p, true);
        end_stream(p, msg);
        req_finish(p);
    } else {
        req_fail(p, 502, "%s", msg);
    }
}

/* The leg's call answered in full (code): the client's answer, unless the planner has a
 * next leg for it (a prefill's answer). */
static void up_answered(fe_req_t *p, struct evhttp_request *up, int code)
{
    fe_leg_end_t e = {.how = FE_END_ANSWERED, .up = up, .code = code};
    if (!leg_ended(p, &e)) /* a prefill's answer gives the decode leg */
        return;
    uint64_t osl;
    if (p->up.sse_mode) {
        relay(p, true);
        osl = p->client.gen_tokens;
        end_stream(p, NULL);
    } else {
        osl = completion_tokens(evhttp_request_get_input_buffer(up));
        if (code == 200)
            answer_cached_tokens(p, evhttp_request_get_input_buffer(up));
        reply_whole(p, up);
    }
    if (code == 200) {
        fe_reqm_observe(p->fe, p, kvr_now_ns(), osl);
        report_cached(p);
    }
    req_finish(p);
}

/* The call of p, whose client left while it went on, ended (code; 0: failed). */
static void up_orphaned(fe_req_t *p, struct evhttp_request *up, int code)
{
    unbook(p);
    fe_leg_end_t e = {.how = FE_END_ORPHANED, .up = up, .code = code};
    if (leg_ended(p, &e)) /* a prefill's KV is released (the planner says FINISH) */
        req_finish(p);
}

static void on_up_done(struct evhttp_request *up, void *arg)
{
    fe_req_t *p = arg;
    p->up.req = NULL; /* libevent frees it after this call */
    fe_pool_release(p->up.uc);
    p->up.uc = NULL;
    VERIFY(p);
    if (p->client.slow_abort)
        return; /* retry_ev is pending: it closes the client */
    int code = up != NULL ? evhttp_request_get_response_code(up) : 0;
    if (p->client.kept != FE_KEEP_NONE) { /* its client left while the call went on */
        up_orphaned(p, up, code);
        return;
    }
    if (up != NULL && code != 0) {
        up_answered(p, up, code);
        return;
    }
    up_kind_t kind = up != NULL ? UPK_CONNECT : p->up.err_set ? p->up.err : UPK_EOF;
    if (!p->up.got_headers && kind != UPK_TIMEOUT)
        attempt_failed(p, kind);
    else
        up_broke(p, kind);
}

/* Sends p's current leg to its placed worker (route.worker). */
static void send_upstream(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, p->route.worker.worker_id);
    upool_t *u = sp != NULL ? fe_pool_for(fe, sp) : NULL;
    p->route.attempts++;
    p->up.pool = u;
    p->up.got_headers = p->up.err_set = p->up.sse_mode = p->up.has_cached = false;
    p->phase = PH_UPSTREAM;
    if (u == NULL || u->bad_url) {
        if (!ensure_retry_ev(p)) {
            req_fail(p, 500, "out of memory");
            return;
        }
        attempt_failed(p, UPK_NO_URL);
        return;
    }
    upconn_t *uc = ensure_retry_ev(p) ? fe_pool_acquire(fe, u, p->leg.silence_ms) : NULL;
    struct evhttp_request *up = uc ? evhttp_request_new(on_up_done, p) : NULL;
    if (up == NULL) {
        fe_pool_release(uc);
        req_fail(p, 500, "out of memory");
        return;
    }
    evhttp_request_set_header_cb(up, on_up_header);
    evhttp_request_set_chunked_cb(up, on_up_chunk);
    evhttp_request_set_error_cb(up, fe_on_up_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(up);
    char rank[16];
    snprintf(rank, sizeof rank, "%u", p->route.worker.dp_rank);
    evhttp_add_header(h, "Host", u->loc.host_hdr);
    evhttp_add_header(h, "Content-Type", "application/json");
    evhttp_add_header(h, "x-data-parallel-rank", rank);
    if (fe_leg_streams(p))
        evhttp_add_header(h, "Accept", "text/event-stream");
    fe_up_add_auth(fe, p->client.auth, h);
    if (p->leg.body != NULL)
        evbuffer_add(evhttp_request_get_output_buffer(up), p->leg.body, p->leg.body_len);
    else
        evbuffer_add(evhttp_request_get_output_buffer(up), p->prompt.body, p->prompt.body_len);
    char path[KVR_ADDR_BYTES + 32];
    snprintf(path, sizeof path, "%s%s", u->loc.base_path,
             p->client.ep == KVR_OAI_CHAT ? "/v1/chat/completions" : "/v1/completions");
    if (p->up.sse == NULL)
        p->up.sse = evbuffer_new();
    else
        evbuffer_drain(p->up.sse, evbuffer_get_length(p->up.sse));
    p->up.req = up;
    p->up.uc = uc;
    fe->st.forwarded++;
    if (p->route.attempts == 1)
        kvr_hist_observe(&fe->h_forward, (double)(kvr_now_ns() - p->client.arrival_ns) / 1e9);
    /* may call on_up_done before returning (a connection refused at once): p stays valid,
     * the failure continues from the timer */
    /* a whole answer is buffered: bounded (lifted in on_up_header for an event stream) */
    evhttp_connection_set_max_body_size(uc->conn, (ev_ssize_t)fe->cfg.frontend_max_answer_bytes);
    p->up.leg_sent = true; /* a pull decode leg: from here the decode worker may read the KV */
    VERIFY(p);
    if (evhttp_make_request(uc->conn, up, EVHTTP_REQ_POST, path) != 0 && p->up.req == up) {
        p->up.req = NULL;
        fe_pool_release(p->up.uc);
        p->up.uc = NULL;
        attempt_failed(p, UPK_CONNECT);
    }
}

/* The leg's retries are spent, or its pinned worker failed: a prefill leg falls back, any
 * other is answered 503. */
static void leg_spent(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    fe_leg_end_t e = {.how = FE_END_SPENT};
    if (!leg_ended(p, &e))
        return;
    if (p->route.attempts >= 1 + fe->cfg.frontend_max_retries)
        req_fail(p, 503, "no worker could serve this request (%s)", p->route.last_fail);
    else
        req_fail(p, 503, "the pinned worker cannot serve this request (%s)", p->route.last_fail);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    fe_req_t *p = arg;
    kvr_frontend_t *fe = p->fe;
    VERIFY(p);
    if (p->client.slow_abort) {
        abort_slow_client(p);
        return;
    }
    if (p->client.kept != FE_KEEP_NONE) { /* its decode worker answered after its client left */
        cancel_upstream(p);
        req_finish(p);
        return;
    }
    p->phase = PH_START;
    if (p->prompt.tokens == NULL && p->prompt.tok_body != NULL) {
        tokenize(p);
        return;
    }
    if (p->route.leg_pending) { /* the next leg of a disaggregated request, not a retry */
        p->route.leg_pending = false;
        route_attempt(p);
        return;
    }
    const fe_pin_t *pin = p->leg.pin;
    if (p->route.attempts >= 1 + fe->cfg.frontend_max_retries ||
        (pin->has && was_tried(p, pin->worker))) {
        leg_spent(p);
        return;
    }
    fe->st.retries++;
    route_attempt(p);
}

/* ---------------------------------------------------------------------------------------- */
/* Requests: arrival */

static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (*s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > max)
        return false;
    *out = (uint64_t)v;
    return true;
}

/* Copies what routing needs from the decoded request (the decoder's buffers are reused). */
static bool copy_routing(fe_req_t *p, const kvr_oai_request_t *rq)
{
    p->prompt.model_len = rq->model != NULL ? rq->model_len : 0;
    if ((p->prompt.model = malloc(p->prompt.model_len + 1)) == NULL)
        return false;
    memcpy(p->prompt.model, p->prompt.model_len ? rq->model : "", p->prompt.model_len);
    p->prompt.model[p->prompt.model_len] = '\0';
    if (rq->n_images > 0) {
        if ((p->prompt.images = malloc(rq->n_images * sizeof *p->prompt.images)) == NULL)
            return false;
        memcpy(p->prompt.images, rq->images, rq->n_images * sizeof *p->prompt.images);
        p->prompt.n_images = rq->n_images;
    }
    const kvr_oai_nvext_t *x = &rq->nvext;
    if (!rq->has_nvext)
        return true;
    if (x->lora_name != NULL) {
        if ((p->hints.lora = malloc(x->lora_name_len + 1)) == NULL)
            return false;
        memcpy(p->hints.lora, x->lora_name, x->lora_name_len);
        p->hints.lora[x->lora_name_len] = '\0';
        p->hints.lora_len = x->lora_name_len;
    }
    if (x->has_allowed_worker_ids) {
        p->hints.has_allowed = true;
        p->hints.n_allowed = x->n_allowed_worker_ids;
        p->hints.allowed = malloc((p->hints.n_allowed + 1) * sizeof *p->hints.allowed);
        if (p->hints.allowed == NULL)
            return false;
        if (p->hints.n_allowed)
            memcpy(p->hints.allowed, x->allowed_worker_ids,
                   p->hints.n_allowed * sizeof *p->hints.allowed);
    }
    if (x->has_backend_instance_id) {
        p->hints.worker.has = true;
        p->hints.worker.worker = x->backend_instance_id;
    }
    if (x->has_decode_worker_id) {
        p->hints.worker.has = true;
        p->hints.worker.worker = x->decode_worker_id;
    }
    if (x->has_prefill_worker_id) {
        p->hints.pf.has = true;
        p->hints.pf.worker = x->prefill_worker_id;
    }
    if (x->has_dp_rank) {
        p->hints.worker.has_rank = true;
        p->hints.worker.rank = x->dp_rank;
    }
    if (x->has_prefill_dp_rank) { /* as x-prefill-dp-rank (which overrides it) */
        p->hints.pf.has_rank = true;
        p->hints.pf.rank = x->prefill_dp_rank;
    }
    p->hints.priority_jump = x->has_priority_jump ? x->priority_jump : 0.0;
    p->hints.has_priority = x->has_priority;
    p->hints.priority = x->priority;
    p->hints.has_eot = x->has_expected_output_tokens;
    p->hints.eot = x->expected_output_tokens;
    p->client.want_worker = x->want_worker_id;
    if (x->session_id != NULL) { /* at most KVR_OAI_MAX_SESSION_BYTES (the decoder's limit) */
        memcpy(p->hints.session, x->session_id, x->session_id_len);
        p->hints.session_len = x->session_id_len;
        p->hints.session_close = x->session_close;
    }
    return true;
}

/* The pre-routing headers (they override nvext); false after answering 400. */
static bool read_headers(fe_req_t *p, struct evhttp_request *req)
{
    struct evkeyvalq *h = evhttp_request_get_input_headers(req);
    const char *wid = evhttp_find_header(h, "x-decode-instance-id");
    if (wid == NULL)
        wid = evhttp_find_header(h, "x-worker-instance-id");
    const char *pid = evhttp_find_header(h, "x-prefill-instance-id");
    const char *pdr = evhttp_find_header(h, "x-prefill-dp-rank");
    const char *dpr = evhttp_find_header(h, "x-dp-rank");
    if (dpr == NULL)
        dpr = evhttp_find_header(h, "x-data-parallel-rank");
    uint64_t v;
    if (wid != NULL) {
        if (!parse_u64(wid, UINT64_MAX, &v)) {
            kvr_reply_error(&p->fe->rep, req, 400, NULL,
                            "x-worker-instance-id: not an unsigned integer");
            return false;
        }
        p->hints.worker.has = true;
        p->hints.worker.worker = v;
    }
    if (dpr != NULL) {
        if (!parse_u64(dpr, UINT32_MAX, &v)) {
            kvr_reply_error(&p->fe->rep, req, 400, NULL,
                            "x-dp-rank: not an integer in [0, 4294967295]");
            return false;
        }
        p->hints.worker.has_rank = true;
        p->hints.worker.rank = (uint32_t)v;
    }
    if (pid != NULL) {
        if (!parse_u64(pid, UINT64_MAX, &v)) {
            kvr_reply_error(&p->fe->rep, req, 400, NULL,
                            "x-prefill-instance-id: not an unsigned integer");
            return false;
        }
        p->hints.pf.has = true;
        p->hints.pf.worker = v;
    }
    if (pdr != NULL) {
        if (!parse_u64(pdr, UINT32_MAX, &v)) {
            kvr_reply_error(&p->fe->rep, req, 400, NULL,
                            "x-prefill-dp-rank: not an integer in [0, 4294967295]");
            return false;
        }
        p->hints.pf.has_rank = true;
        p->hints.pf.rank = (uint32_t)v;
    }
    if (!p->hints.worker.has)
        p->hints.worker.has_rank = false; /* a rank means nothing without its worker */
    if (!p->hints.pf.has)
        p->hints.pf.has_rank = false;
    const char *sid = evhttp_find_header(h, "x-session-id");
    if (sid == NULL)
        sid = evhttp_find_header(h, "x-dynamo-session-id");
    if (sid != NULL) {
        size_t n = strlen(sid);
        if (n == 0 || n > KVR_OAI_MAX_SESSION_BYTES) {
            kvr_reply_error(&p->fe->rep, req, 400, NULL, "x-session-id: must be 1 to %d bytes",
                          KVR_OAI_MAX_SESSION_BYTES);
            return false;
        }
        memcpy(p->hints.session, sid, n + 1);
        p->hints.session_len = n;
    }
    const char *auth = p->fe->cfg.frontend_forward_authorization
                           ? evhttp_find_header(h, "Authorization") : NULL;
    if (auth != NULL && (p->client.auth = strdup(auth)) == NULL) {
        kvr_reply_error(&p->fe->rep, req, 500, NULL, "out of memory");
        return false;
    }
    return true;
}

/* A request for the decoded rq, answered (4xx/5xx) and NULL when its routing fields or
 * headers are refused or out of memory. Not linked yet. */
static fe_req_t *req_from_client(kvr_frontend_t *fe, struct evhttp_request *req,
                                 kvr_oai_endpoint_t ep, const kvr_oai_request_t *rq,
                                 const char *body, size_t len, uint64_t t0)
{
    fe_req_t *p = fe_req_new(fe, req, ep, t0);
    if (p == NULL) {
        kvr_reply_error(&fe->rep, req, 500, NULL, "out of memory");
        return NULL;
    }
    p->client.model_slot = fe_reqm_slot(fe, rq->model, rq->model_len);
    p->client.stream = rq->stream;
    p->client.usage_asked = !rq->stream || rq->include_usage;
    p->prompt.client_body = body;
    p->prompt.client_body_len = len;
    if (!copy_routing(p, rq)) {
        fe_req_free(p);
        kvr_reply_error(&fe->rep, req, 500, NULL, "out of memory");
        return NULL;
    }
    if (!read_headers(p, req)) {
        fe_req_free(p);
        return NULL;
    }
    if (p->hints.worker.has && p->hints.has_allowed) {
        bool in = false;
        for (size_t i = 0; i < p->hints.n_allowed && !in; i++)
            in = p->hints.allowed[i] == p->hints.worker.worker;
        if (!in) {
            fe_req_free(p);
            kvr_reply_error(&fe->rep, req, 503, NULL,
                            "the pinned worker is outside the request's filters");
            return NULL;
        }
    }
    return p;
}

/* The linked request's ids: given, cached, or asked of a worker. */
/* p's ids: given, cached, made in process (fe_inproc.c), or asked of a worker. */
static void get_ids(fe_req_t *p, bool ids_given, const kvr_oai_request_t *rq, const char *body,
                    size_t len)
{
    kvr_frontend_t *fe = p->fe;
    if (ids_given) {
        ids_ready(p);
        return;
    }
    size_t n;
    const uint32_t *cached = kvr_tokcache_get(&fe->cache, p->prompt.tok_key, &n);
    if (cached != NULL) {
        fe->tok_path[FE_TOKP_CACHE]++;
        if (!fe_set_tokens(p, cached, n)) {
            req_fail(p, 500, "out of memory");
            return;
        }
        ids_ready(p);
        return;
    }
    int status;
    char msg[512];
    switch (fe_inproc_ids(fe, rq, body, len, &n, &status, msg, sizeof msg)) {
    case FE_INPROC_IDS:
        kvr_tokcache_put(&fe->cache, p->prompt.tok_key, fe->tok_ids, n);
        if (!fe_set_tokens(p, fe->tok_ids, n)) {
            req_fail(p, 500, "out of memory");
            return;
        }
        ids_ready(p);
        return;
    case FE_INPROC_FAIL:
        req_fail(p, status, "%s", msg);
        return;
    case FE_INPROC_DECLINED:
        break;
    }
    tokenize(p);
}

static void h_generate(kvr_frontend_t *fe, struct evhttp_request *req, kvr_oai_endpoint_t ep)
{
    uint64_t t0 = kvr_now_ns();
    fe->st.requests[ep == KVR_OAI_CHAT]++;
    if (fe->closing) {
        kvr_reply_error(&fe->rep, req, 503, NULL, "the router is shutting down");
        return;
    }
    size_t len;
    const char *body = kvr_http_body(req, &len);
    kvr_oai_request_t rq;
    int rc = kvr_oai_decode(fe->dec, ep, body, len, &rq);
    if (rc != KVR_OK) {
        kvr_reply_error(&fe->rep, req, kvr_oai_http_status(rc), NULL,
                        "%s", kvr_oai_decoder_error(fe->dec));
        return;
    }
    fe_req_t *p = req_from_client(fe, req, ep, &rq, body, len, t0);
    if (p == NULL)
        return;
    bool ids_given = rq.prompt_kind == KVR_OAI_PROMPT_TOKENS;
    p->prompt.drop_prompt = ep == KVR_OAI_COMPLETIONS &&
                            !(rq.given_kind == KVR_OAI_PROMPT_TOKENS && !rq.nvext.has_token_data);
    p->prompt.rewrite = rq.has_nvext ||
                        (ep == KVR_OAI_CHAT && fe->cfg.frontend_chat_token_data) ||
                        p->prompt.drop_prompt ||
                        (!fe->cfg.frontend_trust_kv_transfer && fe_body_may_name_kvt(body, len));
    bool ok = ids_given ? fe_set_tokens(p, rq.tokens, rq.n_tokens) : fe_tokenize_body(p, &rq, body, len);
    if (!ok) {
        fe_req_free(p);
        kvr_reply_error(&fe->rep, req, 500, NULL, "out of memory");
        return;
    }
    fe_req_link(p);
    evhttp_connection_set_closecb(p->client.conn, on_client_close, p);
    get_ids(p, ids_given, &rq, body, len);
}

/* ---------------------------------------------------------------------------------------- */
/* Tick: clients that left before their first byte, pool upkeep */

static void sweep_clients(kvr_frontend_t *fe)
{
    fe_req_t *next;
    for (fe_req_t *p = fe->live; p != NULL; p = next) {
        next = p->next;
        if (p->client.reply_started || p->client.req == NULL)
            continue;
        if (kvr_http_client_gone(p->client.conn))
            evhttp_connection_free(p->client.conn); /* its close callback frees p */
    }
}

/* The workers registered before the front end began to observe the fleet. */
static void count_urlless(kvr_frontend_t *fe)
{
    uint64_t ids[FE_MAX_WORKERS];
    size_t n = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS);
    for (size_t i = 0; i < n && i < FE_MAX_WORKERS; i++)
        if (!usable_worker(fe, ids[i]))
            urlless_add(fe, ids[i]);
}

/* The workers registered before the front end: their models' tokenizers loaded (the ones
 * they name) and probed. */
static void probe_known_workers(kvr_frontend_t *fe)
{
    uint64_t ids[FE_MAX_WORKERS];
    size_t n = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS);
    for (size_t i = 0; i < n && i < FE_MAX_WORKERS; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, ids[i]);
        if (sp != NULL)
            fe_inproc_worker_added(fe, sp);
    }
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_frontend_t *fe = arg;
    sweep_clients(fe);
    fe_pool_upkeep(fe);
    fe_models_tick(fe);
    fe_disagg_tick(fe);
}

/* ---------------------------------------------------------------------------------------- */
/* Lifecycle */

static bool fe_handle(void *arg, struct evhttp_request *req, const char *path, bool get,
                      bool post)
{
    kvr_frontend_t *fe = arg;
    if (post && strcmp(path, "/v1/completions") == 0)
        h_generate(fe, req, KVR_OAI_COMPLETIONS);
    else if (post && strcmp(path, "/v1/chat/completions") == 0)
        h_generate(fe, req, KVR_OAI_CHAT);
    else if (get && strcmp(path, "/v1/models") == 0)
        fe_h_models(fe, req);
    else
        return false;
    return true;
}

kvr_frontend_t *kvr_frontend_new(struct event_base *base, kvr_http_host_t *host,
                                 kvr_fleet_t *fleet, const kvr_router_config_t *cfg,
                                 int *status, char *err, size_t err_len)
{
    kvr_frontend_t *fe = calloc(1, sizeof *fe);
    if (fe == NULL) {
        *status = KVR_ENOMEM;
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    fe->base = base;
    fe->host = host;
    fe->fleet = fleet;
    fe->sched = kvr_fleet_sched(fleet);
    fe->r = kvr_fleet_router(fleet);
    fe->cfg = *cfg;
    fe->rl_up = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    fe->rl_proto = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    fe->rl_slow = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    kvr_tokcache_init(&fe->cache, cfg->frontend_tokenize_cache_tokens);
    if (cfg->worker_api_key_file[0] != '\0') {
        char tok[KVR_SECRET_MAX];
        int rc = kvr_secret_read("worker_api_key_file", cfg->worker_api_key_file, tok, err,
                                 err_len);
        if (rc != KVR_OK) {
            free(fe);
            *status = rc;
            return NULL;
        }
        snprintf(fe->worker_auth, sizeof fe->worker_auth, "Bearer %s", tok);
    }
    kvr_json_writer_init(&fe->w);
    int rrc = kvr_reply_init(&fe->rep, &fe->w, &kvr_reply_openai);
    kvr_hist_init(&fe->h_forward, FORWARD_BUCKETS, N_FORWARD_BUCKETS);
    fe->models_at_ms = kvr_now_ms(); /* the first background round after FE_ADAPTERS_REFRESH_MS */
    size_t max_tokens = cfg->router_max_prompt_tokens < KVR_OAI_MAX_TOKENS
                            ? (size_t)cfg->router_max_prompt_tokens : KVR_OAI_MAX_TOKENS;
    kvr_oai_options_t oo = {.max_tokens = max_tokens,
                            .max_text_bytes = KVR_OAI_MAX_TEXT_BYTES,
                            .max_messages = KVR_OAI_MAX_MESSAGES,
                            .max_allowed_ids = KVR_OAI_MAX_ALLOWED_IDS};
    fe->max_tokens = max_tokens;
    fe->dec = kvr_oai_decoder_new(&oo);
    fe->out = evbuffer_new();
    fe->members = calloc(FE_MAX_MEMBERS, sizeof *fe->members);
    fe->tick = event_new(base, -1, EV_PERSIST, on_tick, fe);
    struct timeval tv = {0, FE_TICK_US};
    if (rrc != KVR_OK || fe->dec == NULL || fe->out == NULL || fe->members == NULL ||
        fe->tick == NULL ||
        fe_reqm_init(fe) != KVR_OK || fe_disagg_init(fe, leg_lost) != KVR_OK ||
        event_add(fe->tick, &tv) != 0) {
        kvr_frontend_free(fe);
        *status = KVR_ENOMEM;
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    int trc = fe_inproc_init(fe, err, err_len);
    if (trc != KVR_OK) {
        kvr_frontend_free(fe);
        *status = trc;
        return NULL;
    }
    count_urlless(fe);
    kvr_http_service_t svc = {.handle = fe_handle, .metrics = fe_metrics, .arg = fe};
    kvr_fleet_observer_t obs = {.added = fe_worker_added, .removed = fe_worker_removed,
                                .arg = fe};
    if (kvr_http_host_add_service(host, &svc) != KVR_OK ||
        kvr_fleet_observe(fleet, &obs) != KVR_OK) {
        kvr_frontend_free(fe);
        *status = KVR_EFULL;
        snprintf(err, err_len, "no room for another HTTP service or fleet observer");
        return NULL;
    }
    probe_known_workers(fe);
    *status = KVR_OK;
    return fe;
}

void kvr_frontend_close(kvr_frontend_t *fe)
{
    fe->closing = true; /* new requests and placements the queue still makes: 503 */
    while (fe->live != NULL) {
        fe_req_t *p = fe->live;
        cancel_upstream(p);
        if (p->client.req != NULL && p->client.reply_started) {
            end_stream(p, "the router is shutting down");
            req_finish(p);
        } else if (p->client.req != NULL) {
            req_fail(p, 503, "the router is shutting down");
        } else {
            req_finish(p);
        }
    }
    for (size_t i = 0; i < fe->n_waiters; i++)
        fe_models_answer(fe, fe->waiters[i]);
    fe->n_waiters = 0;
}

void kvr_frontend_free(kvr_frontend_t *fe)
{
    if (fe == NULL)
        return;
    if (fe->host != NULL)
        kvr_http_host_remove_service(fe->host, fe);
    if (fe->fleet != NULL)
        kvr_fleet_unobserve(fe->fleet, fe);
    kvr_frontend_close(fe);
    fe_disagg_free(fe);
    for (size_t i = 0; i < fe->n_pools; i++)
        fe_pool_free(fe->pools[i]);
    free(fe->pools);
    free(fe->waiters);
    if (fe->tick != NULL)
        event_free(fe->tick);
    kvr_tokcache_deinit(&fe->cache);
    fe_inproc_free(fe);
    kvr_oai_decoder_free(fe->dec);
    free(fe->tok_ids);
    if (fe->out != NULL)
        evbuffer_free(fe->out);
    kvr_reply_deinit(&fe->rep);
    kvr_json_writer_deinit(&fe->w);
    free(fe->members);
    free(fe->urlless);
    fe_reqm_free(fe);
    free(fe);
}
