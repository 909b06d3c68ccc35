/*
 * frontend.c: the OpenAI front end (see frontend.h for what it does and the policies).
 *
 * This file is the request state machine: decode, route (through the scheduler, kvrouter/sched.h:
 * a queued request is borrowed, not copied, and every lifecycle call goes by the booking's
 * handle), proxy, relay, retry, disconnect, slow clients; plus the tick and the lifecycle.
 * The other jobs have their own files, over frontend_int.h: fe_tokenize.c (ids from a
 * worker's /tokenize, cached), fe_body.c (the workers' body, the nvext naming the worker),
 * fe_relay.c (streamed answers to the client), fe_upstream.c (per-worker connection pools),
 * fe_models.c (GET /v1/models), fe_metrics.c, fe_disagg.c (disaggregated requests: their two
 * legs run through this state machine, p->pf_leg saying which one is current).
 *
 * Invariants: a request (fe_req_t) is in the live list from arrival until its client is
 * answered or gone. While it has an upstream call (up != NULL) it holds one busy pooled
 * connection (uc). Its client connection's close callback points at it until its last reply
 * is handed to libevent. It is booked in the router (booked) between a successful placement
 * and its free. Retries and failures continue from a zero-delay timer (retry_ev), never inside
 * the libevent call that reported them (which may run inside evhttp_make_request), so no
 * request is freed under a caller; connections are freed only by the tick, never inside their
 * own callbacks (libevent touches them after the callback returns).
 * libevent 2.1 lifetimes relied on: an upstream request is freed by libevent right after its
 * completion callback (after the error callback, before the completion callback with NULL, on
 * a failure), and without any callback by evhttp_cancel_request once its error callback is
 * cleared; a client request whose connection fails while a reply is still owed is detached
 * (its connection pointer becomes NULL) and is then ours to free, while one still attached
 * when its connection is freed is freed by libevent.
 * Memory: per request, its copies (ids, routing fields, bodies it had to rebuild); pooled
 * connections; the cache within its cap. Threads: the HTTP thread only.
 */
#include "frontend/frontend.h"
#include "http/http_conn.h"

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
#include "frontend/tokcache.h"
#include "base/log.h"
#include "base/secret.h"
#include "wire/api_json.h"
#include "wire/json_scan.h"
#include "wire/json_writer.h"
#include "wire/openai.h"
#include "wire/prom.h"

#include "frontend/frontend_int.h"

/* seconds: 5 us to 1 s */
static const double FORWARD_BUCKETS[] = {5e-6,   1e-5, 2.5e-5, 5e-5,   1e-4, 2.5e-4, 5e-4, 1e-3,
                                         2.5e-3, 5e-3, 1e-2,   2.5e-2, 5e-2, 0.1,    0.25, 1};
#define N_FORWARD_BUCKETS (sizeof FORWARD_BUCKETS / sizeof FORWARD_BUCKETS[0])

void fe_req_finish(fe_req_t *p);

/* The Authorization a worker gets: the client's when frontend_forward_authorization is on and
 * it sent one, else the router's own worker token, else none. */
void fe_add_upstream_auth(const fe_req_t *p, struct evkeyvalq *h)
{
    if (p->auth != NULL)
        evhttp_add_header(h, "Authorization", p->auth);
    else if (p->fe->worker_auth[0] != '\0')
        evhttp_add_header(h, "Authorization", p->fe->worker_auth);
}
static void end_stream(fe_req_t *p, const char *error);
void fe_route_attempt(fe_req_t *p);

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------------- */
/* Replies to clients */

static void count_reply(kvr_frontend_t *fe, int code)
{
    int k = code >= 200 && code < 600 ? code / 100 - 2 : 4;
    fe->st.replies[k]++;
}

void fe_send_body(kvr_frontend_t *fe, struct evhttp_request *req, int code, const char *ctype,
                  const char *data, size_t len)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", ctype);
    evbuffer_drain(fe->out, evbuffer_get_length(fe->out));
    evbuffer_add(fe->out, data, len);
    count_reply(fe, code);
    evhttp_send_reply(req, code, NULL, fe->out);
}

void fe_send_writer(kvr_frontend_t *fe, struct evhttp_request *req, int code)
{
    const char *data;
    size_t len;
    if (kvr_json_writer_finish(&fe->w, &data, &len) != KVR_OK) {
        static const char oom[] = "{\"error\":{\"message\":\"response too large\",\"type\":"
                                  "\"InternalServerError\",\"param\":null,\"code\":500}}";
        fe_send_body(fe, req, 500, "application/json", oom, sizeof oom - 1);
        return;
    }
    fe_send_body(fe, req, code, "application/json", data, len);
}

void fe_send_error(kvr_frontend_t *fe, struct evhttp_request *req, int code, const char *fmt,
                       ...) __attribute__((format(printf, 4, 5)));

void fe_send_error(kvr_frontend_t *fe, struct evhttp_request *req, int code, const char *fmt,
                       ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvr_json_writer_reset(&fe->w);
    kvr_oai_encode_error(&fe->w, msg, NULL, code);
    fe_send_writer(fe, req, code);
}

static const char *body_of(struct evhttp_request *req, size_t *len)
{
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    *len = evbuffer_get_length(b);
    if (*len == 0)
        return "";
    return (const char *)evbuffer_pullup(b, -1);
}

/* The request is about to get its last reply: nothing may reach it through its connection. */
struct evhttp_request *fe_client_take(fe_req_t *p)
{
    struct evhttp_request *c = p->client;
    if (c != NULL)
        evhttp_connection_set_closecb(p->client_conn, NULL, NULL);
    p->client = NULL;
    return c;
}

/* Answers with an error and frees the request. */
void fe_req_fail(fe_req_t *p, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fe_disagg_release(p, true); /* a bootstrap prefill would wait for a decode that won't come */
    fe_disagg_orphan(p);        /* a pulled prefill's KV would wait for its timeout (first:
                                   it reads the client's body) */
    struct evhttp_request *c = fe_client_take(p);
    if (c != NULL)
        fe_send_error(p->fe, c, code, "%s", msg);
    fe_req_finish(p);
}

/* A routing status as the OpenAI error it is; frees the request. */
static void req_fail_route(fe_req_t *p, int rc, const kvr_route_res_t *res)
{
    switch (rc) {
    case KVR_ENOWORKER:
        if (p->n_tried > 0)
            fe_req_fail(p, 503, "no worker can serve this request (%s)", p->last_fail);
        else
            fe_req_fail(p, 503, "no worker can serve this request");
        return;
    case KVR_ENOTALLOWED:
        fe_req_fail(p, 503, "the pinned worker is outside the request's filters");
        return;
    case KVR_ENOMODEL:
        if (p->lora != NULL && res && res->error_field && strncmp(res->error_field, "lora", 4) == 0)
            fe_req_fail(p, 404, "no worker serves the LoRA adapter `%s` (lora_strict)", p->lora);
        else
            fe_req_fail(p, 404, "The model `%s` does not exist", p->model);
        return;
    case KVR_EBUSY:
        fe_req_fail(p, 429, "every eligible worker is busy");
        return;
    case KVR_EQUEUEFULL:
        fe_req_fail(p, 429, "the request queue is full");
        return;
    case KVR_EFULL:
        fe_req_fail(p, 429, "too many requests in flight");
        return;
    case KVR_ETOOBIG:
        fe_req_fail(p, 413, "prompt longer than router_max_prompt_tokens (%llu tokens)",
                    (unsigned long long)p->fe->cfg.router_max_prompt_tokens);
        return;
    case KVR_EINVAL:
    case KVR_EPARSE:
    case KVR_ERANGE:
        fe_req_fail(p, 400, "%s", res && res->error_field ? res->error_field : kvr_strerror(rc));
        return;
    default:
        fe_req_fail(p, 500, "routing failed: %s", kvr_strerror(rc));
        return;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Requests: lifecycle */

static void link_req(kvr_frontend_t *fe, fe_req_t *p)
{
    p->next = fe->live;
    if (fe->live)
        fe->live->prev = p;
    fe->live = p;
    fe->n_live++;
}

static void unlink_req(kvr_frontend_t *fe, fe_req_t *p)
{
    if (p->prev)
        p->prev->next = p->next;
    else
        fe->live = p->next;
    if (p->next)
        p->next->prev = p->prev;
    fe->n_live--;
}

/* The api server removed a worker, and the router its bookings: the requests still running
 * there drain from the engine but have nothing left to mark or free. */
static void fe_worker_removed(void *arg, uint64_t worker_id)
{
    kvr_frontend_t *fe = arg;
    for (fe_req_t *p = fe->live; p != NULL; p = p->next)
        if (p->booked && p->worker.worker_id == worker_id)
            p->booked = false;
    fe_disagg_worker_removed(fe, worker_id);
}

/* Drops the upstream call without any callback (the connection is closed: the worker sees
 * the disconnect and cancels its request). */
void fe_cancel_upstream(fe_req_t *p)
{
    if (p->up != NULL) {
        evhttp_request_set_error_cb(p->up, NULL);
        evhttp_request_set_chunked_cb(p->up, NULL);
        evhttp_cancel_request(p->up);
        p->up = NULL;
    }
    fe_pool_release(p->uc);
    p->uc = NULL;
}

/* Frees the router's booking (the queue may place something now). */
void fe_unbook(fe_req_t *p)
{
    if (!p->booked)
        return;
    p->booked = false;
    (void)kvr_sched_release(p->fe->sched, p->handle, kvr_now_ms()); /* re-runs the queue */
}

/* Releases everything; the client was answered or is gone. */
void fe_req_finish(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    fe_cancel_upstream(p);
    if (p->phase == PH_QUEUED)
        (void)kvr_sched_cancel(fe->sched, p->ticket);
    if (p->retry_ev != NULL)
        event_free(p->retry_ev);
    p->retry_ev = NULL;
    if (p->client != NULL) { /* never left unanswered */
        if (p->reply_started) {
            end_stream(p, "internal error: the request was dropped");
        } else {
            struct evhttp_request *c = fe_client_take(p);
            fe_send_error(fe, c, 500, "internal error: the request was dropped");
        }
    }
    fe_disagg_release(p, false); /* a bootstrap prefill call runs to its end on its own */
    unlink_req(fe, p);
    bool booked = p->booked;
    kvr_req_handle_t handle = p->handle;
    if (p->sse != NULL)
        evbuffer_free(p->sse);
    free(p->tokens);
    free(p->body_own);
    free(p->leg_body);
    free(p->kvt);
    free(p->rel_base);
    free(p->auth);
    free(p->tok_body);
    free(p->lora);
    free(p->model);
    free(p->images);
    free(p->mm);
    free(p->allowed);
    free(p->scratch);
    free(p);
    if (booked) /* last: the queue may place another request, which may call back here */
        (void)kvr_sched_release(fe->sched, handle, kvr_now_ms());
}

static void on_client_close(struct evhttp_connection *conn, void *arg)
{
    (void)conn;
    fe_req_t *p = arg;
    if (!p->slow_abort)
        p->fe->st.client_disconnects++;
    struct evhttp_request *c = p->client;
    p->client = NULL;
    if (!p->slow_abort && p->dmode == FD_PULL && p->up != NULL && (p->pf_leg || !p->got_headers)) {
        /* the call goes on: a prefill's until it answers (its KV is then released), a
         * decode's until the worker answers (it has then read the KV, and is closed) */
        evhttp_connection_set_closecb(p->client_conn, NULL, NULL);
        p->abandoned = true;
        (void)fe_disagg_keep_body(p); /* the client's body goes with it (out of memory: the
                                         release call is not made, and counted) */
        p->client_body = NULL;
        p->client_body_len = 0;
        kvr_http_release_orphan(c);
        return;
    }
    fe_cancel_upstream(p); /* first: nothing of ours may reach the client's buffers after this */
    fe_disagg_release(p, true);
    fe_disagg_orphan(p);
    kvr_http_release_orphan(c); /* http/http_conn.h */
    fe_req_finish(p);
}

static void on_retry(evutil_socket_t fd, short what, void *arg);

/* The timer failures continue from, made before the first upstream call (so that a failure
 * never needs an allocation). */
bool fe_ensure_retry_ev(fe_req_t *p)
{
    if (p->retry_ev == NULL)
        p->retry_ev = evtimer_new(p->fe->base, on_retry, p);
    return p->retry_ev != NULL;
}

/* Continues p from a zero-delay timer. */
void fe_schedule_retry(fe_req_t *p)
{
    static const struct timeval now = {0, 0};
    p->phase = PH_RETRY;
    (void)evtimer_add(p->retry_ev, &now);
}

/* ---------------------------------------------------------------------------------------- */
/* Requests: bodies */

bool fe_set_tokens(fe_req_t *p, const uint32_t *t, size_t n)
{
    free(p->tokens);
    p->tokens = malloc((n ? n : 1) * sizeof *t);
    if (p->tokens == NULL)
        return false;
    if (n)
        memcpy(p->tokens, t, n * sizeof *t);
    p->n_tokens = n;
    return true;
}

/* The ids are known: the body for the workers, then routing. */
void fe_ids_ready(fe_req_t *p)
{
    int rc = KVR_OK;
    if (!p->rewrite) {
        p->body = p->client_body;
        p->body_len = p->client_body_len;
    } else if ((rc = fe_build_forward_body(p)) != KVR_OK) {
        if (rc == KVR_ETOOBIG)
            fe_req_fail(p, 400, "request body: more than %d top-level fields", FE_MAX_MEMBERS);
        else
            fe_req_fail(p, 500, "out of memory");
        return;
    }
    if (fe_disagg_plan(p))
        fe_route_attempt(p);
}

/* ---------------------------------------------------------------------------------------- */
/* Requests: routing */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool was_tried(const fe_req_t *p, uint64_t id)
{
    for (unsigned i = 0; i < p->n_tried; i++)
        if (p->tried[i] == id)
            return true;
    return false;
}

static bool usable_worker(kvr_frontend_t *fe, uint64_t id)
{
    const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, id);
    return sp != NULL && sp->url[0] != '\0';
}

/* The allowed ids of this attempt: the client's list (or every registered worker, or the
 * pinned one) without the workers that failed and those without a url. NULL = no filter. */
static const uint64_t *attempt_allowed(fe_req_t *p, size_t *n, bool *oom)
{
    kvr_frontend_t *fe = p->fe;
    *oom = false;
    bool pf = p->pf_leg;
    uint64_t pin = pf ? p->pin_pf : p->pin_worker;
    bool pin_only =
        pf ? p->has_pin_pf && !p->has_pin_pf_rank : p->has_pin_worker && !p->has_pin_rank;
    if (!p->has_allowed && !pin_only && p->n_tried == 0 && fe->n_urlless == 0)
        return NULL;
    size_t cap = p->has_allowed || pin_only ? p->n_allowed + 1 : FE_MAX_WORKERS;
    if (p->cap_scratch < cap) {
        uint64_t *s = realloc(p->scratch, cap * sizeof *s);
        if (s == NULL) {
            *oom = true;
            return NULL;
        }
        p->scratch = s;
        p->cap_scratch = cap;
    }
    size_t m = 0;
    if (p->has_allowed) {
        for (size_t i = 0; i < p->n_allowed; i++)
            if (!pin_only || p->allowed[i] == pin)
                p->scratch[m++] = p->allowed[i];
    } else if (pin_only) {
        p->scratch[m++] = pin;
    } else {
        m = kvr_router_worker_ids(fe->r, p->scratch, FE_MAX_WORKERS);
        if (m > FE_MAX_WORKERS)
            m = FE_MAX_WORKERS;
        qsort(p->scratch, m, sizeof *p->scratch, cmp_u64);
    }
    size_t o = 0;
    for (size_t i = 0; i < m; i++) {
        uint64_t id = p->scratch[i];
        if (was_tried(p, id) || ((fe->n_urlless > 0 || p->n_tried > 0) && !usable_worker(fe, id)))
            continue;
        p->scratch[o++] = id;
    }
    *n = o;
    return p->scratch;
}

static void on_placed(void *arg, int rc, const kvr_route_res_t *res);
static void send_upstream(fe_req_t *p);

static void routed(fe_req_t *p, int rc, const kvr_route_res_t *res)
{
    if (rc != KVR_OK && p->pf_leg && (rc == KVR_ENOWORKER || rc == KVR_ENOTALLOWED)) {
        fe_disagg_fallback(p, p->n_tried > 0 ? p->last_fail : "no prefill worker can serve it");
        return;
    }
    if (rc != KVR_OK) {
        req_fail_route(p, rc, res);
        return;
    }
    p->booked = true;
    p->handle = res->handle;
    p->rid_len = strlen(res->request_id);
    memcpy(p->rid, res->request_id, p->rid_len + 1);
    p->worker = res->worker;
    p->step_seen = 0; /* a new worker: its step clock, not the last one's */
    p->cached_tokens = res->cached_tokens;
    p->block_size = res->block_size;
    if (!fe_disagg_placed(p, res))
        return; /* it goes on by itself (a bootstrap pair, or a fallback) */
    if (p->want_worker)
        fe_make_nvext(p);
    send_upstream(p);
}

/* A chat with images: the placeholder tokens' positions are the model's (its image token id),
 * unknown here, so every block carries every image's hash. Two chats with the same text and
 * other images never share a block in the router's view (the reference's guarantee), at the
 * price of the text before the first image (see docs/serve.md). False on out of memory. */
static bool image_blocks(fe_req_t *p)
{
    kvr_route_req_t q = {.n_tokens = p->n_tokens, .model = p->model, .model_len = p->model_len};
    size_t n = kvr_router_n_blocks(p->fe->r, &q);
    if (n == 0)
        return true;
    if ((p->mm = malloc(n * sizeof *p->mm)) == NULL)
        return false;
    for (size_t i = 0; i < n; i++)
        p->mm[i] = (kvr_block_mm_t){(uint32_t)i, p->images, p->n_images};
    p->n_mm = n;
    return true;
}

void fe_route_attempt(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    size_t n_allowed = 0;
    bool oom = p->n_images > 0 && p->mm == NULL && !image_blocks(p);
    const uint64_t *allowed = oom ? NULL : attempt_allowed(p, &n_allowed, &oom);
    if (oom) {
        fe_req_fail(p, 500, "out of memory");
        return;
    }
    kvr_route_req_t q = {
        .tokens = p->tokens,
        .n_tokens = p->n_tokens,
        .update_state = true,
        .model = p->model,
        .model_len = p->model_len,
        .lora_name = p->lora,
        .lora_name_len = p->lora_len,
        .has_allowed = allowed != NULL,
        .allowed_ids = allowed,
        .n_allowed = n_allowed,
        .has_pinned = p->has_pin_worker && p->has_pin_rank,
        .pinned = {p->pin_worker, p->pin_rank},
        .priority_jump = p->priority_jump,
        .session_id = p->session_len > 0 ? p->session : NULL,
        .session_id_len = p->session_len,
        .session_close = p->session_close,
        .mm = p->mm,
        .n_mm = p->n_mm,
        .has_expected_output_tokens = p->has_eot,
        .expected_output_tokens = p->eot,
    };
    fe_disagg_route_req(p, &q);
    /* borrowed while queued: tokens, lora and allowed ids live in p until it is placed or
     * cancelled (fe_req_finish) */
    kvr_place_t pl = {.q = &q, .copy = false, .done = on_placed, .arg = p};
    kvr_route_res_t res;
    p->phase = PH_START;
    int rc = kvr_sched_place(fe->sched, &pl, kvr_now_ms(), &res, &p->ticket);
    if (rc == KVR_OK && p->ticket != 0) {
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
        fe_req_fail(p, 503, "the router is shutting down");
        return;
    }
    if (res == NULL) {
        char msg[200];
        int code = kvr_fleet_wait_failed(p->fe->r, rc, msg, sizeof msg);
        fe_req_fail(p, code, "%s", msg);
        return;
    }
    routed(p, rc, res);
}

/* ---------------------------------------------------------------------------------------- */
/* Requests: the upstream call */

void fe_up_count_error(kvr_frontend_t *fe, up_kind_t kind, uint64_t worker_id, bool before)
{
    fe->st.upstream_errors[kind]++;
    kvr_log_limited(&fe->rl_up, KVR_LOG_WARN, "upstream %s on worker %llu (%s the first byte)",
                    UPK_NAMES[kind], (unsigned long long)worker_id, before ? "before" : "after");
}

void fe_on_up_error(enum evhttp_request_error err, void *arg)
{
    fe_req_t *p = arg;
    p->up_err_set = true;
    switch (err) {
    case EVREQ_HTTP_TIMEOUT:
        p->up_err = UPK_TIMEOUT; /* connected, then silent (a connect timeout is UPK_CONNECT) */
        break;
    case EVREQ_HTTP_EOF:
        p->up_err = UPK_EOF;
        break;
    case EVREQ_HTTP_DATA_TOO_LONG:
        p->up_err = UPK_TOO_LARGE;
        break;
    default:
        p->up_err = UPK_PROTOCOL;
        break;
    }
}

/* The upstream failed before its first byte: retried elsewhere from the timer. */
static void attempt_failed(fe_req_t *p, up_kind_t kind)
{
    kvr_frontend_t *fe = p->fe;
    fe_up_count_error(fe, kind, p->worker.worker_id, true);
    snprintf(p->last_fail, sizeof p->last_fail, "%u upstream attempt%s failed, the last with %s "
             "on worker %llu", p->attempts, p->attempts == 1 ? "" : "s", UPK_NAMES[kind],
             (unsigned long long)p->worker.worker_id);
    if (p->up_pool != NULL)
        fe_worker_failed(fe, p->up_pool, kind);
    if (p->n_tried < FE_MAX_ATTEMPTS)
        p->tried[p->n_tried++] = p->worker.worker_id;
    fe_unbook(p);
    if (p->dmode == FD_BOOTSTRAP && !p->pf_leg) { /* a new pair, a new room */
        fe_disagg_release(p, true);
        p->pf_leg = true;
        p->has_pf = false;
    }
    fe_schedule_retry(p);
}

void fe_start_reply(fe_req_t *p)
{
    if (p->reply_started || p->client == NULL)
        return;
    p->reply_started = true;
    struct evkeyvalq *h = evhttp_request_get_output_headers(p->client);
    char v[24];
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    snprintf(v, sizeof v, "%llu", (unsigned long long)p->worker.worker_id);
    evhttp_add_header(h, "x-kvrouter-worker-id", v);
    snprintf(v, sizeof v, "%u", p->worker.dp_rank);
    evhttp_add_header(h, "x-kvrouter-dp-rank", v);
    if (p->has_pf) {
        snprintf(v, sizeof v, "%llu", (unsigned long long)p->pf.worker_id);
        evhttp_add_header(h, "x-kvrouter-prefill-worker-id", v);
    }
    /* events are small writes: without this, Nagle holds one back until the client's
     * delayed ACK */
    struct bufferevent *bev = evhttp_connection_get_bufferevent(p->client_conn);
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    if (fd >= 0) {
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    evhttp_send_reply_start(p->client, 200, "OK");
}

void fe_mark_token(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    uint64_t now = kvr_now_ms();
    p->last_token_ns = mono_ns();
    if (p->gen_tokens++ == 0)
        p->first_token_ns = p->last_token_ns;
    fe->st.stream_tokens++;
    if (!p->booked)
        return; /* its worker was removed, and its booking with it */
    /* its worker's engine steps, told by whose tokens arrive: the clock the locality cost
     * reads (route time is kvr_now_ms() x 1000, the same monotonic clock) */
    (void)kvr_router_worker_token(kvr_sched_router(fe->sched), p->worker, &p->step_seen,
                                  p->last_token_ns / 1000);
    if (!p->first_token_sent) {
        p->first_token_sent = true;
        (void)kvr_sched_first_token(fe->sched, p->handle, now); /* the queue may move */
    }
    uint64_t bs = p->block_size ? p->block_size : fe->cfg.block_size;
    uint64_t total = p->n_tokens + p->gen_tokens;
    if (bs > 0 && total % bs == 1 % bs) {
        double decay = NAN;
        if (p->has_eot) {
            double d = 1.0 - (double)p->gen_tokens / (double)(p->eot ? p->eot : 1);
            decay = d > 0 ? d : 0;
        }
        (void)kvr_sched_output_block(fe->sched, p->handle, decay, now);
    }
}

static void on_up_chunk(struct evhttp_request *up, void *arg)
{
    fe_req_t *p = arg;
    struct evbuffer *in = evhttp_request_get_input_buffer(up);
    if (p->slow_abort || p->abandoned) { /* nothing more for this client */
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    evbuffer_add_buffer(p->sse, in);
    fe_relay(p, false);
}

static int on_up_header(struct evhttp_request *up, void *arg)
{
    fe_req_t *p = arg;
    p->got_headers = true;
    p->up_code = evhttp_request_get_response_code(up);
    if (p->abandoned && !p->pf_leg) { /* the decode worker has it: closed from the timer */
        evhttp_request_set_chunked_cb(up, NULL);
        fe_schedule_retry(p);
        return 0;
    }
    if (p->up_pool != NULL)
        p->up_pool->consecutive_failures = 0;
    const char *ct = evhttp_find_header(evhttp_request_get_input_headers(up), "Content-Type");
    p->sse_mode = p->up_code == 200 && fe_leg_streams(p) && ct != NULL &&
                  strncasecmp(ct, "text/event-stream", 17) == 0;
    if (!p->sse_mode)
        evhttp_request_set_chunked_cb(up, NULL); /* the body accumulates for on_up_done */
    else /* relayed as it comes, never accumulated: a stream may be as long as it runs */
        evhttp_connection_set_max_body_size(evhttp_request_get_connection(up), -1);
    if (p->up_code >= 500)
        fe_up_count_error(p->fe, UPK_STATUS_5XX, p->worker.worker_id, false);
    if (p->up_code == 200 && !p->sse_mode && !p->first_token_sent && p->booked) {
        p->first_token_sent = true; /* a whole answer: its first token is behind it */
        (void)kvr_sched_first_token(p->fe->sched, p->handle, kvr_now_ms());
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

void fe_reply_whole(fe_req_t *p, struct evhttp_request *up)
{
    kvr_frontend_t *fe = p->fe;
    struct evhttp_request *c = fe_client_take(p);
    if (c == NULL)
        return;
    struct evbuffer *in = evhttp_request_get_input_buffer(up);
    const char *ct = evhttp_find_header(evhttp_request_get_input_headers(up), "Content-Type");
    struct evkeyvalq *h = evhttp_request_get_output_headers(c);
    char v[24];
    evhttp_add_header(h, "Content-Type", ct ? ct : "application/json");
    snprintf(v, sizeof v, "%llu", (unsigned long long)p->worker.worker_id);
    evhttp_add_header(h, "x-kvrouter-worker-id", v);
    snprintf(v, sizeof v, "%u", p->worker.dp_rank);
    evhttp_add_header(h, "x-kvrouter-dp-rank", v);
    if (p->has_pf) {
        snprintf(v, sizeof v, "%llu", (unsigned long long)p->pf.worker_id);
        evhttp_add_header(h, "x-kvrouter-prefill-worker-id", v);
    }
    evbuffer_drain(fe->out, evbuffer_get_length(fe->out));
    size_t len = evbuffer_get_length(in);
    bool done = false;
    if (p->want_worker && p->up_code == 200 && len > 0) {
        const char *b = (const char *)evbuffer_pullup(in, -1);
        done = fe_inject_worker(p, b, len, fe->out);
        if (!done) {
            fe->st.inject_failed++;
            evbuffer_drain(fe->out, evbuffer_get_length(fe->out));
        }
    }
    if (!done)
        evbuffer_add_buffer(fe->out, in);
    count_reply(fe, p->up_code);
    evhttp_send_reply(c, p->up_code, NULL, fe->out);
}

/* The end of the SSE stream (with an error event first when it broke). */
static void end_stream(fe_req_t *p, const char *error)
{
    kvr_frontend_t *fe = p->fe;
    if (p->client == NULL)
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
        fe_start_reply(p);
        evhttp_send_reply_chunk(p->client, fe->out);
    }
    fe_start_reply(p);
    struct evhttp_request *c = fe_client_take(p);
    fe->st.replies[4]++;
    evhttp_send_reply_end(c);
}

static void on_up_done(struct evhttp_request *up, void *arg)
{
    fe_req_t *p = arg;
    kvr_frontend_t *fe = p->fe;
    p->up = NULL; /* libevent frees it after this call */
    fe_pool_release(p->uc);
    p->uc = NULL;
    if (p->slow_abort)
        return; /* retry_ev is pending: it closes the client */
    int code = up != NULL ? evhttp_request_get_response_code(up) : 0;
    if (p->abandoned) { /* its client left during the prefill call (pull) */
        fe_disagg_abandoned(p, up, code);
        return;
    }
    if (up == NULL || code == 0) {
        up_kind_t kind = up != NULL ? UPK_CONNECT : p->up_err_set ? p->up_err : UPK_EOF;
        if (!p->got_headers && kind != UPK_TIMEOUT) {
            attempt_failed(p, kind);
            return;
        }
        if (p->pf_leg) { /* a prefill that broke after its first byte, or went silent */
            fe_up_count_error(fe, kind, p->worker.worker_id, !p->got_headers);
            fe_worker_failed(fe, p->up_pool, kind);
            char why[96];
            snprintf(why, sizeof why, "%s on prefill worker %llu", UPK_NAMES[kind],
                     (unsigned long long)p->worker.worker_id);
            fe_unbook(p);
            fe_disagg_fallback(p, why);
            return;
        }
        if (!p->got_headers) { /* accepted, then silent: maybe still generating; not retried */
            fe_up_count_error(fe, kind, p->worker.worker_id, true);
            fe_worker_failed(fe, p->up_pool, kind);
            fe_req_fail(p, 504,
                        "worker %llu sent nothing for frontend_upstream_timeout_ms (%llu ms)",
                        (unsigned long long)p->worker.worker_id,
                        (unsigned long long)fe->cfg.frontend_upstream_timeout_ms);
            return;
        }
        fe_up_count_error(fe, kind, p->worker.worker_id, false);
        if (kind == UPK_TOO_LARGE) {
            fe_worker_failed(fe, p->up_pool, kind);
            fe_req_fail(p, 502,
                        "worker %llu's answer exceeded frontend_max_answer_bytes (%llu bytes)",
                        (unsigned long long)p->worker.worker_id,
                        (unsigned long long)fe->cfg.frontend_max_answer_bytes);
            return;
        }
        char msg[160];
        snprintf(msg, sizeof msg, "worker %llu failed mid-response (%s)",
                 (unsigned long long)p->worker.worker_id, UPK_NAMES[kind]);
        if (p->reply_started) {
            fe_relay(p, true);
            end_stream(p, msg);
            fe_req_finish(p);
        } else {
            fe_req_fail(p, 502, "%s", msg);
        }
        return;
    }
    if (p->pf_leg) { /* the prefill's whole answer: the decode leg next */
        fe_disagg_prefill_done(p, up, code);
        return;
    }
    uint64_t osl;
    if (p->sse_mode) {
        fe_relay(p, true);
        osl = p->gen_tokens;
        end_stream(p, NULL);
    } else {
        osl = completion_tokens(evhttp_request_get_input_buffer(up));
        fe_reply_whole(p, up);
    }
    if (code == 200)
        fe_reqm_observe(fe, p, mono_ns(), osl);
    fe_req_finish(p);
}

static void send_upstream(fe_req_t *p)
{
    kvr_frontend_t *fe = p->fe;
    const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, p->worker.worker_id);
    upool_t *u = sp != NULL ? fe_pool_for(fe, sp) : NULL;
    p->attempts++;
    p->up_pool = u;
    p->got_headers = p->up_err_set = p->sse_mode = false;
    p->phase = PH_UPSTREAM;
    if (u == NULL || u->bad_url) {
        if (!fe_ensure_retry_ev(p)) {
            fe_req_fail(p, 500, "out of memory");
            return;
        }
        attempt_failed(p, UPK_NO_URL);
        return;
    }
    uint64_t silence = p->pf_leg ? fe->cfg.frontend_prefill_timeout_ms
                                 : fe->cfg.frontend_upstream_timeout_ms;
    upconn_t *uc = fe_ensure_retry_ev(p) ? fe_pool_acquire(fe, u, silence) : NULL;
    struct evhttp_request *up = uc ? evhttp_request_new(on_up_done, p) : NULL;
    if (up == NULL) {
        fe_pool_release(uc);
        fe_req_fail(p, 500, "out of memory");
        return;
    }
    evhttp_request_set_header_cb(up, on_up_header);
    evhttp_request_set_chunked_cb(up, on_up_chunk);
    evhttp_request_set_error_cb(up, fe_on_up_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(up);
    char rank[16];
    snprintf(rank, sizeof rank, "%u", p->worker.dp_rank);
    evhttp_add_header(h, "Host", u->loc.host_hdr);
    evhttp_add_header(h, "Content-Type", "application/json");
    evhttp_add_header(h, "x-data-parallel-rank", rank);
    if (fe_leg_streams(p))
        evhttp_add_header(h, "Accept", "text/event-stream");
    fe_add_upstream_auth(p, h);
    if (p->leg_body != NULL)
        evbuffer_add(evhttp_request_get_output_buffer(up), p->leg_body, p->leg_body_len);
    else
        evbuffer_add(evhttp_request_get_output_buffer(up), p->body, p->body_len);
    char path[KVR_ADDR_BYTES + 32];
    snprintf(path, sizeof path, "%s%s", u->loc.base_path,
             p->ep == KVR_OAI_CHAT ? "/v1/chat/completions" : "/v1/completions");
    if (p->sse == NULL)
        p->sse = evbuffer_new();
    else
        evbuffer_drain(p->sse, evbuffer_get_length(p->sse));
    p->up = up;
    p->uc = uc;
    fe->st.forwarded++;
    if (p->attempts == 1)
        kvr_hist_observe(&fe->h_forward, (double)(mono_ns() - p->arrival_ns) / 1e9);
    /* may call on_up_done before returning (a connection refused at once): p stays valid,
     * the failure continues from the timer */
    /* a whole answer is buffered: bounded (lifted in on_up_header for an event stream) */
    evhttp_connection_set_max_body_size(uc->conn, (ev_ssize_t)fe->cfg.frontend_max_answer_bytes);
    if (!p->pf_leg && p->dmode == FD_PULL)
        p->d_sent = true; /* from here a client that leaves closes the decode worker's call */
    if (evhttp_make_request(uc->conn, up, EVHTTP_REQ_POST, path) != 0 && p->up == up) {
        p->up = NULL;
        fe_pool_release(p->uc);
        p->uc = NULL;
        attempt_failed(p, UPK_CONNECT);
    }
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    fe_req_t *p = arg;
    kvr_frontend_t *fe = p->fe;
    if (p->slow_abort) {
        fe_abort_slow_client(p);
        return;
    }
    if (p->abandoned) { /* its decode worker answered after its client left */
        fe_cancel_upstream(p);
        fe_req_finish(p);
        return;
    }
    p->phase = PH_START;
    if (p->tokens == NULL && p->tok_body != NULL) {
        fe_start_tokenize(p);
        return;
    }
    if (p->leg_switch) { /* the next leg of a disaggregated request, not a retry */
        p->leg_switch = false;
        fe_route_attempt(p);
        return;
    }
    if (p->pf_leg && (p->attempts >= 1 + fe->cfg.frontend_max_retries ||
                      (p->has_pin_pf && was_tried(p, p->pin_pf)))) {
        fe_disagg_fallback(p, p->last_fail);
        return;
    }
    if (p->attempts >= 1 + fe->cfg.frontend_max_retries) {
        fe_req_fail(p, 503, "no worker could serve this request (%s)", p->last_fail);
        return;
    }
    if (p->has_pin_worker && was_tried(p, p->pin_worker)) {
        fe_req_fail(p, 503, "the pinned worker cannot serve this request (%s)", p->last_fail);
        return;
    }
    fe->st.retries++;
    fe_route_attempt(p);
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
    p->model_len = rq->model != NULL ? rq->model_len : 0;
    if ((p->model = malloc(p->model_len + 1)) == NULL)
        return false;
    memcpy(p->model, p->model_len ? rq->model : "", p->model_len);
    p->model[p->model_len] = '\0';
    if (rq->n_images > 0) {
        if ((p->images = malloc(rq->n_images * sizeof *p->images)) == NULL)
            return false;
        memcpy(p->images, rq->images, rq->n_images * sizeof *p->images);
        p->n_images = rq->n_images;
    }
    const kvr_oai_nvext_t *x = &rq->nvext;
    if (!rq->has_nvext)
        return true;
    if (x->lora_name != NULL) {
        if ((p->lora = malloc(x->lora_name_len + 1)) == NULL)
            return false;
        memcpy(p->lora, x->lora_name, x->lora_name_len);
        p->lora[x->lora_name_len] = '\0';
        p->lora_len = x->lora_name_len;
    }
    if (x->has_allowed_worker_ids) {
        p->has_allowed = true;
        p->n_allowed = x->n_allowed_worker_ids;
        if ((p->allowed = malloc((p->n_allowed + 1) * sizeof *p->allowed)) == NULL)
            return false;
        if (p->n_allowed)
            memcpy(p->allowed, x->allowed_worker_ids, p->n_allowed * sizeof *p->allowed);
    }
    if (x->has_backend_instance_id) {
        p->has_pin_worker = true;
        p->pin_worker = x->backend_instance_id;
    }
    if (x->has_decode_worker_id) {
        p->has_pin_worker = true;
        p->pin_worker = x->decode_worker_id;
    }
    if (x->has_prefill_worker_id) {
        p->has_pin_pf = true;
        p->pin_pf = x->prefill_worker_id;
    }
    if (x->has_dp_rank) {
        p->has_pin_rank = true;
        p->pin_rank = x->dp_rank;
    }
    p->priority_jump = x->has_priority_jump ? x->priority_jump : 0.0;
    p->has_priority = x->has_priority;
    p->priority = x->priority;
    p->has_eot = x->has_expected_output_tokens;
    p->eot = x->expected_output_tokens;
    p->want_worker = x->want_worker_id;
    if (x->session_id != NULL) { /* at most KVR_OAI_MAX_SESSION_BYTES (the decoder's limit) */
        memcpy(p->session, x->session_id, x->session_id_len);
        p->session_len = x->session_id_len;
        p->session_close = x->session_close;
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
            fe_send_error(p->fe, req, 400, "x-worker-instance-id: not an unsigned integer");
            return false;
        }
        p->has_pin_worker = true;
        p->pin_worker = v;
    }
    if (dpr != NULL) {
        if (!parse_u64(dpr, UINT32_MAX, &v)) {
            fe_send_error(p->fe, req, 400, "x-dp-rank: not an integer in [0, 4294967295]");
            return false;
        }
        p->has_pin_rank = true;
        p->pin_rank = (uint32_t)v;
    }
    if (pid != NULL) {
        if (!parse_u64(pid, UINT64_MAX, &v)) {
            fe_send_error(p->fe, req, 400, "x-prefill-instance-id: not an unsigned integer");
            return false;
        }
        p->has_pin_pf = true;
        p->pin_pf = v;
    }
    if (pdr != NULL) {
        if (!parse_u64(pdr, UINT32_MAX, &v)) {
            fe_send_error(p->fe, req, 400, "x-prefill-dp-rank: not an integer in [0, 4294967295]");
            return false;
        }
        p->has_pin_pf_rank = true;
        p->pin_pf_rank = (uint32_t)v;
    }
    if (!p->has_pin_worker)
        p->has_pin_rank = false; /* a rank means nothing without its worker */
    if (!p->has_pin_pf)
        p->has_pin_pf_rank = false;
    const char *sid = evhttp_find_header(h, "x-session-id");
    if (sid == NULL)
        sid = evhttp_find_header(h, "x-dynamo-session-id");
    if (sid != NULL) {
        size_t n = strlen(sid);
        if (n == 0 || n > KVR_OAI_MAX_SESSION_BYTES) {
            fe_send_error(p->fe, req, 400, "x-session-id: must be 1 to %d bytes",
                          KVR_OAI_MAX_SESSION_BYTES);
            return false;
        }
        memcpy(p->session, sid, n + 1);
        p->session_len = n;
    }
    const char *auth = p->fe->cfg.frontend_forward_authorization
                           ? evhttp_find_header(h, "Authorization") : NULL;
    if (auth != NULL && (p->auth = strdup(auth)) == NULL) {
        fe_send_error(p->fe, req, 500, "out of memory");
        return false;
    }
    return true;
}

static void req_free_unlinked(fe_req_t *p)
{
    free(p->tokens);
    free(p->auth);
    free(p->tok_body);
    free(p->lora);
    free(p->model);
    free(p->images);
    free(p->mm);
    free(p->allowed);
    free(p);
}

static void h_generate(kvr_frontend_t *fe, struct evhttp_request *req, kvr_oai_endpoint_t ep)
{
    uint64_t t0 = mono_ns();
    fe->st.requests[ep == KVR_OAI_CHAT]++;
    if (fe->closing) {
        fe_send_error(fe, req, 503, "the router is shutting down");
        return;
    }
    size_t len;
    const char *body = body_of(req, &len);
    kvr_oai_request_t rq;
    int rc = kvr_oai_decode(fe->dec, ep, body, len, &rq);
    if (rc != KVR_OK) {
        fe_send_error(fe, req, kvr_oai_http_status(rc), "%s", kvr_oai_decoder_error(fe->dec));
        return;
    }
    fe_req_t *p = calloc(1, sizeof *p);
    if (p == NULL) {
        fe_send_error(fe, req, 500, "out of memory");
        return;
    }
    p->fe = fe;
    p->client = req;
    p->client_conn = evhttp_request_get_connection(req);
    p->ep = ep;
    p->arrival_ns = t0;
    p->model_slot = fe_reqm_slot(fe, rq.model, rq.model_len);
    p->stream = rq.stream;
    p->client_body = body;
    p->client_body_len = len;
    if (!copy_routing(p, &rq)) {
        req_free_unlinked(p);
        fe_send_error(fe, req, 500, "out of memory");
        return;
    }
    if (!read_headers(p, req)) {
        req_free_unlinked(p);
        return;
    }
    if (p->has_pin_worker && p->has_allowed) {
        bool in = false;
        for (size_t i = 0; i < p->n_allowed && !in; i++)
            in = p->allowed[i] == p->pin_worker;
        if (!in) {
            req_free_unlinked(p);
            fe_send_error(fe, req, 503, "the pinned worker is outside the request's filters");
            return;
        }
    }
    bool ids_given = rq.prompt_kind == KVR_OAI_PROMPT_TOKENS;
    p->drop_prompt = ep == KVR_OAI_COMPLETIONS &&
                     !(rq.given_kind == KVR_OAI_PROMPT_TOKENS && !rq.nvext.has_token_data);
    p->rewrite = rq.has_nvext || ep == KVR_OAI_CHAT || p->drop_prompt ||
                 (!fe->cfg.frontend_trust_kv_transfer && fe_body_may_name_kvt(body, len));
    bool ok = ids_given ? fe_set_tokens(p, rq.tokens, rq.n_tokens) : fe_tokenize_body(p, &rq);
    if (!ok) {
        req_free_unlinked(p);
        fe_send_error(fe, req, 500, "out of memory");
        return;
    }
    link_req(fe, p);
    evhttp_connection_set_closecb(p->client_conn, on_client_close, p);
    if (ids_given) {
        fe_ids_ready(p);
        return;
    }
    size_t n_cached;
    const uint32_t *cached = kvr_tokcache_get(&fe->cache, p->tok_key, &n_cached);
    if (cached != NULL) {
        if (!fe_set_tokens(p, cached, n_cached)) {
            fe_req_fail(p, 500, "out of memory");
            return;
        }
        fe_ids_ready(p);
        return;
    }
    fe_start_tokenize(p);
}

/* ---------------------------------------------------------------------------------------- */
/* Tick: clients that left before their first byte, pool upkeep */

static void sweep_clients(kvr_frontend_t *fe)
{
    fe_req_t *next;
    for (fe_req_t *p = fe->live; p != NULL; p = next) {
        next = p->next;
        if (p->reply_started || p->client == NULL)
            continue;
        if (kvr_http_client_gone(p->client_conn))
            evhttp_connection_free(p->client_conn); /* its close callback frees p */
    }
}

static void count_urlless(kvr_frontend_t *fe)
{
    uint64_t ids[FE_MAX_WORKERS];
    size_t n = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS), m = 0;
    if (n > FE_MAX_WORKERS)
        n = FE_MAX_WORKERS;
    for (size_t i = 0; i < n; i++)
        m += !usable_worker(fe, ids[i]);
    fe->n_urlless = m;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_frontend_t *fe = arg;
    sweep_clients(fe);
    fe_pool_upkeep(fe);
    count_urlless(fe);
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
    if (fe->dec == NULL || fe->out == NULL || fe->members == NULL || fe->tick == NULL ||
        fe_reqm_init(fe) != KVR_OK || fe_disagg_init(fe) != KVR_OK ||
        event_add(fe->tick, &tv) != 0) {
        kvr_frontend_free(fe);
        *status = KVR_ENOMEM;
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    count_urlless(fe);
    kvr_http_service_t svc = {.handle = fe_handle, .metrics = fe_metrics, .arg = fe};
    if (kvr_http_host_add_service(host, &svc) != KVR_OK ||
        kvr_fleet_observe(fleet, fe_worker_removed, fe) != KVR_OK) {
        kvr_frontend_free(fe);
        *status = KVR_EFULL;
        snprintf(err, err_len, "no room for another HTTP service or fleet observer");
        return NULL;
    }
    *status = KVR_OK;
    return fe;
}

void kvr_frontend_close(kvr_frontend_t *fe)
{
    fe->closing = true; /* new requests and placements the queue still makes: 503 */
    while (fe->live != NULL) {
        fe_req_t *p = fe->live;
        fe_cancel_upstream(p);
        if (p->client != NULL && p->reply_started) {
            end_stream(p, "the router is shutting down");
            fe_req_finish(p);
        } else if (p->client != NULL) {
            fe_req_fail(p, 503, "the router is shutting down");
        } else {
            fe_req_finish(p);
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
        kvr_fleet_unobserve(fe->fleet, fe_worker_removed, fe);
    kvr_frontend_close(fe);
    fe_disagg_free(fe);
    for (size_t i = 0; i < fe->n_pools; i++)
        fe_pool_free(fe->pools[i]);
    free(fe->pools);
    free(fe->waiters);
    if (fe->tick != NULL)
        event_free(fe->tick);
    kvr_tokcache_deinit(&fe->cache);
    kvr_oai_decoder_free(fe->dec);
    free(fe->tok_ids);
    if (fe->out != NULL)
        evbuffer_free(fe->out);
    kvr_json_writer_deinit(&fe->w);
    free(fe->members);
    fe_reqm_free(fe);
    free(fe);
}
