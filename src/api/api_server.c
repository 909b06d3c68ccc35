/*
 * api_server.c: see api_server.h.
 *
 * Invariants: every evhttp request gets exactly one reply, except a queued one whose client
 * went away (its connection's close callback removes it from the queue and frees it; nothing
 * touches the request afterwards). A queued request owns copies of its tokens and strings.
 * Threads: everything here runs on the HTTP thread; the ingest thread is reached only through
 * kvr_ingest_* (synchronous commands and snapshots).
 * Cost: a route is one JSON decode (tokens streamed), one decision (core/router.c) and one
 * small JSON reply; no allocation once warm, but for queued requests.
 */
#include "api/api_server.h"
#include "api/api_int.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <math.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>

#include "core/endpoint.h"
#include "kvrouter/sched.h"
#include "http/access.h"
#include "http/http_guard.h"
#include "base/log.h"
#include "wire/api_json.h"
#include "wire/json_writer.h"
#include "wire/openai.h"
#include "wire/prom.h"

/* seconds: 2 us to 100 ms */
static const double OVERHEAD_BUCKETS[] = {2e-6, 5e-6,   1e-5, 2.5e-5, 5e-5,   1e-4, 2.5e-4, 5e-4,
                                          1e-3, 2.5e-3, 5e-3, 1e-2,   2.5e-2, 5e-2, 0.1};
#define N_OVERHEAD_BUCKETS (sizeof OVERHEAD_BUCKETS / sizeof OVERHEAD_BUCKETS[0])

/* ---------------------------------------------------------------------------------------- */
/* Replies */

void api_reply_text(kvr_api_server_t *s, struct evhttp_request *req, int code, const char *ctype,
                    const char *data, size_t len)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", ctype);
    evbuffer_add(s->out, data, len);
    if (code >= 500)
        s->http_errors_5xx++;
    else if (code >= 400)
        s->http_errors_4xx++;
    evhttp_send_reply(req, code, NULL, s->out);
}

void api_reply_writer(kvr_api_server_t *s, struct evhttp_request *req, int code)
{
    const char *data;
    size_t len;
    if (kvr_json_writer_finish(&s->w, &data, &len) != KVR_OK) {
        static const char oom[] = "{\"error\":{\"message\":\"response too large\","
                                  "\"type\":\"internal_error\",\"code\":500}}";
        api_reply_text(s, req, 500, "application/json", oom, sizeof oom - 1);
        return;
    }
    api_reply_text(s, req, code, "application/json", data, len);
}

void api_reply_error(kvr_api_server_t *s, struct evhttp_request *req, int code, const char *type,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

void api_reply_error(kvr_api_server_t *s, struct evhttp_request *req, int code, const char *type,
                     const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvr_json_writer_reset(&s->w);
    kvr_json_error(&s->w, msg, type, code);
    api_reply_writer(s, req, code);
}

/* The HTTP answer for a router status. */
void api_reply_status(kvr_api_server_t *s, struct evhttp_request *req, int rc, const char *detail)
{
    switch (rc) {
    case KVR_ENOWORKER:
        api_reply_error(s, req, 503, "service_unavailable", "no worker can serve this request%s%s",
                        detail ? ": " : "", detail ? detail : "");
        break;
    case KVR_ENOTALLOWED:
        api_reply_error(s, req, 503, "service_unavailable",
                        "the pinned worker is outside the request's filters");
        break;
    case KVR_ENOMODEL:
        api_reply_error(s, req, 404, "not_found_error", "%s",
                        detail ? detail : "no worker serves the request's model or adapter");
        break;
    case KVR_EBUSY:
        api_reply_error(s, req, 429, "rate_limit_exceeded", "every eligible worker is busy");
        break;
    case KVR_EQUEUEFULL:
        api_reply_error(s, req, 429, "rate_limit_exceeded", "the request queue is full");
        break;
    case KVR_EEXIST:
        api_reply_error(s, req, 409, "invalid_request_error", "request_id is already in flight");
        break;
    case KVR_EFULL:
        api_reply_error(s, req, 429, "rate_limit_exceeded", "too many requests in flight");
        break;
    case KVR_ETOOBIG:
        if (detail != NULL)
            api_reply_error(s, req, 413, "invalid_request_error", "%s", detail);
        else
            api_reply_error(s, req, 413, "invalid_request_error",
                            "prompt longer than router_max_prompt_tokens (%llu tokens)",
                            (unsigned long long)s->cfg.router_max_prompt_tokens);
        break;
    case KVR_ENOTFOUND:
        api_reply_error(s, req, 404, "not_found_error", "%s", detail ? detail : "not found");
        break;
    case KVR_EINVAL:
    case KVR_EPARSE:
    case KVR_ERANGE:
        api_reply_error(s, req, 400, "invalid_request_error", "%s",
                        detail ? detail : kvr_strerror(rc));
        break;
    default:
        api_reply_error(s, req, 500, "internal_error", "%s", kvr_strerror(rc));
        break;
    }
}

/* The body as one contiguous string (NUL not required by the decoders). */
static const char *body_of(struct evhttp_request *req, size_t *len)
{
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    *len = evbuffer_get_length(b);
    if (*len == 0)
        return "";
    return (const char *)evbuffer_pullup(b, -1);
}

/* ---------------------------------------------------------------------------------------- */
/* Routing */

static void route_req_from_api(kvr_route_req_t *q, const kvr_api_route_t *a)
{
    *q = (kvr_route_req_t){
        .tokens = a->tokens,
        .n_tokens = a->n_tokens,
        .request_id = a->has_request_id ? a->request_id : NULL,
        .request_id_len = a->has_request_id ? strlen(a->request_id) : 0,
        .update_state = a->update_state,
        .lora_name = a->lora_name,
        .lora_name_len = a->lora_name_len,
        .cache_namespace = a->cache_namespace,
        .cache_namespace_len = a->cache_namespace_len,
        .has_allowed = a->has_allowed,
        .allowed_ids = a->allowed_ids,
        .n_allowed = a->n_allowed,
        .has_pinned = a->has_pinned,
        .pinned = a->pinned,
        .priority_jump = a->priority_jump,
        .has_expected_output_tokens = a->has_expected_output_tokens,
        .expected_output_tokens = a->expected_output_tokens,
        .required_taints = a->required_taints,
        .n_required = a->n_required,
        .preferred_taints = a->preferred_taints,
        .n_preferred = a->n_preferred,
        .ovr = a->has_override ? &a->ovr : NULL,
        .has_assume_kv_reuse = a->has_assume_kv_reuse,
        .assume_kv_reuse = a->assume_kv_reuse,
        .has_track_prefill_tokens = a->has_track_prefill_tokens,
        .track_prefill_tokens = a->track_prefill_tokens,
        .model = a->model,
        .model_len = a->model_len,
        .mm = a->mm,
        .n_mm = a->n_mm,
        .session_id = a->session_id,
        .session_id_len = a->session_id_len,
        .session_close = a->session_close,
    };
}

static void observe(kvr_api_server_t *s, const kvr_route_res_t *res)
{
    kvr_hist_observe(&s->h_hash, (double)res->timing.hash_ns / 1e9);
    kvr_hist_observe(&s->h_lookup, (double)res->timing.lookup_ns / 1e9);
    kvr_hist_observe(&s->h_select, (double)res->timing.select_ns / 1e9);
    kvr_hist_observe(&s->h_total, (double)res->timing.total_ns / 1e9);
    if (res->overlap_blocks > 0)
        s->routes_with_overlap++;
}

/* A placement's fields, each key prefixed ("" or "prefill_"). */
static void write_choice(kvr_json_writer_t *w, const char *prefix, const kvr_route_res_t *res)
{
    static const char *const keys[] = {"request_id", "worker_id", "dp_rank", "overlap_blocks",
                                       "cached_tokens"};
    const uint64_t v[] = {0, res->worker.worker_id, res->worker.dp_rank, res->overlap_blocks,
                          res->cached_tokens};
    char key[48];
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        snprintf(key, sizeof key, "%s%s", prefix, keys[i]);
        kvr_json_key(w, key);
        if (i == 0)
            kvr_json_string(w, res->request_id);
        else
            kvr_json_u64(w, v[i]);
    }
}

static void reply_routed(kvr_api_server_t *s, struct evhttp_request *req,
                         const kvr_route_res_t *res, bool tagged)
{
    kvr_json_writer_t *w = &s->w;
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    if (tagged) {
        kvr_json_key(w, "method");
        kvr_json_string(w, "new");
    }
    write_choice(w, "", res);
    kvr_json_end_object(w);
    api_reply_writer(s, req, 200);
}

/* Every placement the scheduler booked or answered (both front doors): the histograms. */
static void on_sched_event(void *arg, const kvr_sched_event_t *ev)
{
    if (ev->kind == KVR_SCHED_ROUTED && ev->origin == KVR_SCHED_ORIGIN_LOCAL)
        observe(arg, ev->res);
}

static waiter_t *waiter_get(kvr_api_server_t *s)
{
    waiter_t *w = s->free_waiters;
    if (w != NULL) {
        s->free_waiters = w->next_free;
        return w;
    }
    if ((w = calloc(1, sizeof *w)) == NULL)
        return NULL;
    w->s = s;
    w->next_all = s->all_waiters;
    s->all_waiters = w;
    return w;
}

static void waiter_put(kvr_api_server_t *s, waiter_t *w)
{
    w->req = NULL;
    w->ticket = 0;
    w->next_free = s->free_waiters;
    s->free_waiters = w;
}

static void on_queued_close(struct evhttp_connection *conn, void *arg)
{
    (void)conn;
    waiter_t *w = arg;
    if (kvr_sched_cancel(w->s->sched, w->ticket))
        waiter_put(w->s, w);
}

/* A queued request left the queue: its client gets the outcome. */
static void on_queued_done(void *arg, int rc, const kvr_route_res_t *res)
{
    waiter_t *w = arg;
    kvr_api_server_t *s = w->s;
    struct evhttp_request *req = w->req;
    bool tagged = w->tagged;
    waiter_put(s, w);
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), NULL, NULL);
    if (res == NULL) {
        char msg[200];
        int code = kvr_api_wait_failed(s->r, rc, msg, sizeof msg);
        api_reply_error(s, req, code, code == 429 ? "rate_limit_exceeded" : "service_unavailable",
                        "%s", msg);
    } else if (rc == KVR_OK)
        reply_routed(s, req, res, tagged);
    else
        api_reply_status(s, req, rc,
                         rc == KVR_EINVAL || rc == KVR_ENOMODEL ? res->error_field : NULL);
}

/* Routes (or queues: a copy, answered by on_queued_done) a decoded request; replies unless it
 * was queued. */
static void route_and_reply(kvr_api_server_t *s, struct evhttp_request *req,
                            const kvr_route_req_t *q, bool tagged, uint32_t strict_priority)
{
    /* a placement answered later: one that may queue, or any with a remote indexer */
    bool later = q->update_state || kvr_sched_has_overlap_source(s->sched);
    waiter_t *w = later ? waiter_get(s) : NULL;
    kvr_place_t pl = {.q = q,
                      .strict_priority = strict_priority,
                      .copy = true,
                      .done = w != NULL ? on_queued_done : NULL,
                      .arg = w};
    kvr_route_res_t res;
    kvr_ticket_t ticket;
    int rc = kvr_sched_place(s->sched, &pl, kvr_now_ms(), &res, &ticket);
    if (rc == KVR_OK && ticket != 0) {
        *w = (waiter_t){
            .s = s, .req = req, .ticket = ticket, .tagged = tagged, .next_all = w->next_all};
        evhttp_connection_set_closecb(evhttp_request_get_connection(req), on_queued_close, w);
        return;
    }
    if (w != NULL)
        waiter_put(s, w);
    if (rc == KVR_OK)
        reply_routed(s, req, &res, tagged);
    else
        api_reply_status(s, req, rc,
                         rc == KVR_EINVAL || rc == KVR_ENOMODEL ? res.error_field : NULL);
}

/* A lifecycle call by request id: the JSON API's and the /router marks. */
static int apply_by_id(kvr_api_server_t *s, kvr_sched_kind_t kind, const char *id, size_t id_len,
                       double decay)
{
    kvr_sched_event_t ev = {.kind = kind, .id = id, .id_len = id_len, .decay_fraction = decay};
    return kvr_sched_apply(s->sched, &ev, kvr_now_ms());
}

/* POST /v1/route with "disagg": true: the prefill choice, then the decode choice, each as its
 * leg of a disaggregated request would be placed; booked (update_state) under request_id and
 * request_id + "-prefill", or not at all. Nothing is queued (busy: 429). Without a prefill
 * worker serving: the aggregated answer, or 503 with enforce_disagg. */
static void route_disagg(kvr_api_server_t *s, struct evhttp_request *req, const kvr_route_req_t *q)
{
    kvr_disagg_state_t st = kvr_router_disagg_state(s->r);
    if (st != KVR_DISAGG_ACTIVE) {
        if (s->cfg.enforce_disagg) {
            api_reply_error(s, req, 503, "service_unavailable",
                            "no prefill worker is serving (the prefill pool is %s) and "
                            "enforce_disagg is set",
                            kvr_disagg_state_name(st));
            return;
        }
        route_and_reply(s, req, q, false, 0);
        return;
    }
    char pid[KVR_API_MAX_REQUEST_ID_BYTES + 16];
    kvr_route_req_t pq = *q, dq = *q;
    kvr_route_req_prefill_leg(&pq);
    pq.has_pinned = false; /* pinned_worker names the decode worker */
    if (q->request_id != NULL) {
        int n = snprintf(pid, sizeof pid, "%.*s-prefill", (int)q->request_id_len, q->request_id);
        if (n > KVR_API_MAX_REQUEST_ID_BYTES) {
            api_reply_error(s, req, 400, "invalid_request_error",
                            "request_id: at most %d bytes with disagg (its prefill booking is "
                            "request_id-prefill)",
                            KVR_API_MAX_REQUEST_ID_BYTES - 8);
            return;
        }
        pq.request_id = pid;
        pq.request_id_len = (size_t)n;
    }
    if (q->ovr == NULL)
        kvr_route_req_decode_leg(&dq);
    else { /* the caller's overrides stand; the load options are the decode leg's */
        const kvr_select_override_t *keep = q->ovr;
        kvr_route_req_decode_leg(&dq);
        dq.ovr = keep;
    }
    kvr_route_res_t pres, dres;
    kvr_ticket_t ticket = 0;
    kvr_place_t pl = {.q = &pq, .copy = true};
    int rc = kvr_sched_place(s->sched, &pl, kvr_now_ms(), &pres, &ticket);
    if (rc == KVR_OK) {
        pl.q = &dq;
        rc = kvr_sched_place(s->sched, &pl, kvr_now_ms(), &dres, &ticket);
        if (rc != KVR_OK && q->update_state) /* nothing half-booked */
            (void)kvr_sched_release(s->sched, pres.handle, kvr_now_ms());
        if (rc != KVR_OK)
            pres = dres;
    }
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc,
                         rc == KVR_EINVAL || rc == KVR_ENOMODEL || rc == KVR_ENOWORKER
                             ? pres.error_field
                             : NULL);
        return;
    }
    kvr_json_writer_t *w = &s->w;
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    write_choice(w, "", &dres);
    kvr_json_key(w, "disagg");
    kvr_json_bool(w, true);
    write_choice(w, "prefill_", &pres);
    const kvr_worker_spec_t *sp = kvr_router_worker(s->r, pres.worker.worker_id);
    if (sp != NULL && sp->bootstrap_port != 0) {
        kvr_json_key(w, "bootstrap_port");
        kvr_json_u64(w, sp->bootstrap_port);
    }
    kvr_json_end_object(w);
    api_reply_writer(s, req, 200);
}

static void h_route(kvr_api_server_t *s, struct evhttp_request *req)
{
    size_t len;
    const char *body = body_of(req, &len);
    kvr_api_route_t a;
    int rc = kvr_api_decode_route(s->dec, body, len, &a);
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc, kvr_api_decoder_error(s->dec));
        return;
    }
    kvr_route_req_t q;
    route_req_from_api(&q, &a);
    if (a.disagg)
        route_disagg(s, req, &q);
    else
        route_and_reply(s, req, &q, false, 0);
}

/* POST /v1/requests/{id}/first_token|output_block, DELETE /v1/requests/{id} */
static void h_request(kvr_api_server_t *s, struct evhttp_request *req, const char *rest,
                      enum evhttp_cmd_type method)
{
    const char *slash = strchr(rest, '/');
    size_t id_len = slash ? (size_t)(slash - rest) : strlen(rest);
    char id[KVR_API_MAX_REQUEST_ID_BYTES * 3 + 1];
    if (id_len == 0 || id_len >= sizeof id) {
        api_reply_error(s, req, 400, "invalid_request_error", "request id: 1 to 256 bytes");
        return;
    }
    memcpy(id, rest, id_len);
    id[id_len] = '\0';
    char *decoded = evhttp_uridecode(id, 0, &id_len);
    if (decoded == NULL) {
        api_reply_error(s, req, 400, "invalid_request_error", "request id: bad percent-encoding");
        return;
    }
    const char *action = slash ? slash + 1 : "";
    int rc;
    if (method == EVHTTP_REQ_DELETE && *action == '\0') {
        rc = apply_by_id(s, KVR_SCHED_FREE, decoded, id_len, NAN);
    } else if (method == EVHTTP_REQ_POST && strcmp(action, "first_token") == 0) {
        rc = apply_by_id(s, KVR_SCHED_FIRST_TOKEN, decoded, id_len, NAN);
    } else if (method == EVHTTP_REQ_POST && strcmp(action, "output_block") == 0) {
        size_t len;
        const char *body = body_of(req, &len);
        kvr_api_output_block_t ob;
        rc = kvr_api_decode_output_block(s->dec, body, len, &ob);
        if (rc != KVR_OK) {
            free(decoded);
            api_reply_status(s, req, rc, kvr_api_decoder_error(s->dec));
            return;
        }
        rc = apply_by_id(s, KVR_SCHED_OUTPUT_BLOCK, decoded, id_len,
                         ob.has_decay_fraction ? ob.decay_fraction : NAN);
    } else {
        free(decoded);
        api_reply_error(s, req, 404, "not_found_error", "no such endpoint");
        return;
    }
    free(decoded);
    if (rc == KVR_ENOTFOUND) {
        api_reply_error(s, req, 404, "not_found_error", "unknown request id");
        return;
    }
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc, NULL);
        return;
    }
    kvr_json_writer_reset(&s->w);
    kvr_json_begin_object(&s->w);
    kvr_json_key(&s->w, "ok");
    kvr_json_bool(&s->w, true);
    kvr_json_end_object(&s->w);
    api_reply_writer(s, req, 200); /* the scheduler re-ran its queue: load went down */
}

static int ensure_rank_bufs(kvr_api_server_t *s)
{
    size_t n = kvr_router_n_ranks(s->r);
    if (n <= s->cap_ranks)
        return KVR_OK;
    size_t cap = n * 2;
    kvr_rank_score_t *sc = realloc(s->scores, cap * sizeof *sc);
    if (sc != NULL)
        s->scores = sc;
    kvr_load_projection_t *lp = realloc(s->loads, cap * sizeof *lp);
    if (lp != NULL)
        s->loads = lp;
    if (sc == NULL || lp == NULL)
        return KVR_ENOMEM;
    s->cap_ranks = cap;
    return KVR_OK;
}

static void query_req(kvr_route_req_t *q, const kvr_api_query_t *a)
{
    *q = (kvr_route_req_t){.tokens = a->tokens,
                           .n_tokens = a->n_tokens,
                           .lora_name = a->lora_name,
                           .lora_name_len = a->lora_name_len,
                           .cache_namespace = a->cache_namespace,
                           .cache_namespace_len = a->cache_namespace_len};
}

typedef int (*query_decode_fn)(kvr_api_decoder_t *, const char *, size_t, kvr_api_query_t *);

/* Decodes a /v1/query or /v1/loads body into q and sizes the per-rank buffers; on failure
 * replies and returns false. */
static bool prepare_query(kvr_api_server_t *s, struct evhttp_request *req, query_decode_fn decode,
                          kvr_route_req_t *q)
{
    size_t len;
    const char *body = body_of(req, &len);
    kvr_api_query_t a;
    int rc = decode(s->dec, body, len, &a);
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc, kvr_api_decoder_error(s->dec));
        return false;
    }
    query_req(q, &a);
    if ((rc = ensure_rank_bufs(s)) != KVR_OK) {
        api_reply_status(s, req, rc, NULL);
        return false;
    }
    return true;
}

static void h_query(kvr_api_server_t *s, struct evhttp_request *req)
{
    if (s->cfg.remote_indexer[0] != '\0') {
        api_reply_error(s, req, 409, "invalid_request_error",
                        "this router keeps no index: it routes with the overlaps of "
                        "remote_indexer %s (ask its POST /query)",
                        s->cfg.remote_indexer);
        return;
    }
    size_t n = 0;
    kvr_route_req_t q;
    if (!prepare_query(s, req, kvr_api_decode_query, &q))
        return;
    int rc = kvr_router_query(s->r, &q, s->scores, s->cap_ranks, &n);
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc, NULL);
        return;
    }
    kvr_json_writer_t *w = &s->w;
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    kvr_json_key(w, "block_size");
    kvr_json_u64(w, s->cfg.block_size);
    kvr_json_key(w, "scores");
    kvr_json_begin_array(w);
    for (size_t i = 0; i < n; i++) {
        const kvr_rank_score_t *sc = &s->scores[i];
        kvr_json_begin_object(w);
        kvr_json_key(w, "worker_id");
        kvr_json_u64(w, sc->worker.worker_id);
        kvr_json_key(w, "dp_rank");
        kvr_json_u64(w, sc->worker.dp_rank);
        kvr_json_key(w, "device_blocks");
        kvr_json_u64(w, sc->device_blocks);
        kvr_json_key(w, "host_blocks");
        kvr_json_u64(w, sc->host_blocks);
        kvr_json_key(w, "disk_blocks");
        kvr_json_u64(w, sc->disk_blocks);
        kvr_json_key(w, "cached_tokens");
        kvr_json_u64(w, sc->cached_tokens);
        kvr_json_end_object(w);
    }
    kvr_json_end_array(w);
    kvr_json_end_object(w);
    api_reply_writer(s, req, 200);
}

static void write_loads(kvr_json_writer_t *w, const kvr_load_projection_t *lp, size_t n)
{
    kvr_json_begin_array(w);
    for (size_t i = 0; i < n; i++) {
        kvr_json_begin_object(w);
        kvr_json_key(w, "worker_id");
        kvr_json_u64(w, lp[i].worker.worker_id);
        kvr_json_key(w, "dp_rank");
        kvr_json_u64(w, lp[i].worker.dp_rank);
        kvr_json_key(w, "potential_prefill_tokens");
        kvr_json_u64(w, lp[i].potential_prefill_tokens);
        kvr_json_key(w, "potential_decode_blocks");
        kvr_json_u64(w, lp[i].potential_decode_blocks);
        kvr_json_key(w, "active_requests");
        kvr_json_u64(w, lp[i].active_requests);
        kvr_json_end_object(w);
    }
    kvr_json_end_array(w);
}

static void h_loads(kvr_api_server_t *s, struct evhttp_request *req)
{
    size_t n = 0;
    kvr_route_req_t q;
    if (!prepare_query(s, req, kvr_api_decode_loads, &q))
        return;
    int rc = kvr_router_loads(s->r, &q, s->loads, s->cap_ranks, &n);
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc, NULL);
        return;
    }
    kvr_json_writer_reset(&s->w);
    kvr_json_begin_object(&s->w);
    kvr_json_key(&s->w, "loads");
    write_loads(&s->w, s->loads, n);
    kvr_json_end_object(&s->w);
    api_reply_writer(s, req, 200);
}

/* ---------------------------------------------------------------------------------------- */
/* Workers */

static void write_worker(kvr_api_server_t *s, const kvr_worker_spec_t *sp)
{
    kvr_json_writer_t *w = &s->w;
    kvr_json_begin_object(w);
    kvr_json_key(w, "worker_id");
    kvr_json_u64(w, sp->worker_id);
    kvr_json_key(w, "url");
    kvr_json_string(w, sp->url);
    kvr_json_key(w, "events");
    kvr_json_string(w, sp->events);
    kvr_json_key(w, "replay");
    kvr_json_string(w, sp->replay);
    kvr_json_key(w, "dp_size");
    kvr_json_u64(w, sp->dp_size);
    kvr_json_key(w, "dp_start");
    kvr_json_u64(w, sp->dp_start);
    kvr_json_key(w, "fenced");
    kvr_json_bool(w, kvr_router_fenced(s->r, sp->worker_id));
    kvr_json_key(w, "eagle");
    kvr_json_bool(w, sp->eagle);
    kvr_json_key(w, "model");
    kvr_json_string(w, sp->model);
    kvr_json_key(w, "block_size");
    kvr_json_u64(w, sp->block_size ? sp->block_size : s->cfg.block_size);
    kvr_json_key(w, "total_kv_blocks"); /* given, or learnt from its /metrics; null: unknown */
    if (sp->total_kv_blocks != 0)
        kvr_json_u64(w, sp->total_kv_blocks);
    else
        kvr_json_null(w);
    kvr_json_key(w, "loras");
    kvr_json_string(w, sp->loras);
    kvr_json_key(w, "learned_loras");
    kvr_json_string(w, kvr_router_learned_loras(s->r, sp->worker_id));
    kvr_json_key(w, "role");
    kvr_json_string(w, kvr_worker_role_name(sp->role));
    if (sp->bootstrap_port != 0) {
        kvr_json_key(w, "bootstrap_host");
        kvr_json_string(w, sp->bootstrap_host);
        kvr_json_key(w, "bootstrap_port");
        kvr_json_u64(w, sp->bootstrap_port);
    }
    kvr_json_key(w, "taints");
    kvr_json_begin_array(w);
    for (size_t t = 0; t < sp->n_taints; t++)
        kvr_json_string(w, sp->taints[t]);
    kvr_json_end_array(w);
    kvr_json_key(w, "ranks");
    kvr_json_begin_array(w);
    for (uint32_t d = 0; d < sp->dp_size; d++) {
        kvr_worker_t wk = {sp->worker_id, sp->dp_start + d};
        kvr_rank_status_t st = {0};
        (void)kvr_router_rank_status(s->r, wk, &st);
        kvr_load_snapshot_t ls;
        kvr_load_snapshot(kvr_router_load(s->r), wk, &ls);
        kvr_json_begin_object(w);
        kvr_json_key(w, "dp_rank");
        kvr_json_u64(w, wk.dp_rank);
        kvr_json_key(w, "index_state");
        kvr_json_string(w, api_index_state(s, sp, &st));
        kvr_json_key(w, "index_blocks");
        kvr_json_u64(w, st.index_blocks);
        kvr_json_key(w, "last_seq");
        if (st.started)
            kvr_json_u64(w, st.last_seq);
        else
            kvr_json_null(w);
        kvr_json_key(w, "batches");
        kvr_json_u64(w, st.batches);
        kvr_json_key(w, "events_applied");
        kvr_json_u64(w, st.events_applied);
        kvr_json_key(w, "events_rejected");
        kvr_json_u64(w, st.events_rejected);
        kvr_json_key(w, "gaps");
        kvr_json_u64(w, st.gaps);
        kvr_json_key(w, "gaps_lost");
        kvr_json_u64(w, st.gaps_lost);
        kvr_json_key(w, "replayed");
        kvr_json_u64(w, st.replayed);
        kvr_json_key(w, "restarts");
        kvr_json_u64(w, st.restarts);
        kvr_json_key(w, "undecodable");
        kvr_json_u64(w, st.undecodable);
        kvr_json_key(w, "block_size_mismatches");
        kvr_json_u64(w, st.block_size_mismatches);
        kvr_json_key(w, "eagle_mismatches");
        kvr_json_u64(w, st.eagle_mismatches);
        kvr_json_key(w, "events_disconnects");
        kvr_json_u64(w, st.disconnects);
        kvr_json_key(w, "batches_rank_out_of_range");
        kvr_json_u64(w, st.rank_out_of_range);
        if (st.engine_block_size) {
            kvr_json_key(w, "engine_block_size");
            kvr_json_u64(w, st.engine_block_size);
        }
        kvr_json_key(w, "active_requests");
        kvr_json_u64(w, ls.active_requests);
        kvr_json_key(w, "active_prefill_tokens");
        kvr_json_u64(w, ls.active_prefill_tokens);
        kvr_json_key(w, "active_blocks");
        kvr_json_u64(w, ls.active_blocks);
        uint64_t steps = 0;
        double step_ms = 0;
        (void)kvr_router_step_mean(s->r, wk, &steps, &step_ms);
        kvr_json_key(w, "steps_timed"); /* engine steps seen end (streamed tokens) */
        kvr_json_u64(w, steps);
        kvr_json_key(w, "step_ms"); /* their weighted mean: null until one is timed */
        if (steps > 0)
            kvr_json_double(w, step_ms);
        else
            kvr_json_null(w);
        kvr_json_end_object(w);
    }
    kvr_json_end_array(w);
    kvr_json_end_object(w);
}

static void h_workers_get(kvr_api_server_t *s, struct evhttp_request *req)
{
    api_sync_rank_status(s); /* the ingest thread's latest snapshot, not the last tick's copy */
    uint64_t ids[4096];
    size_t n = kvr_router_worker_ids(s->r, ids, 4096);
    kvr_json_writer_reset(&s->w);
    kvr_json_begin_object(&s->w);
    kvr_json_key(&s->w, "block_size");
    kvr_json_u64(&s->w, s->cfg.block_size);
    kvr_json_key(&s->w, "workers");
    kvr_json_begin_array(&s->w);
    for (size_t i = 0; i < n && i < 4096; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(s->r, ids[i]);
        if (sp != NULL)
            write_worker(s, sp);
    }
    kvr_json_end_array(&s->w);
    kvr_json_key(&s->w, "disagg"); /* the prefill pool (docs/disagg.md) */
    kvr_json_begin_object(&s->w);
    kvr_json_key(&s->w, "state");
    kvr_json_string(&s->w, kvr_disagg_state_name(kvr_router_disagg_state(s->r)));
    kvr_json_key(&s->w, "prefill_workers");
    kvr_json_u64(&s->w, kvr_router_n_role(s->r, KVR_ROLE_PREFILL, false));
    kvr_json_key(&s->w, "prefill_workers_serving");
    kvr_json_u64(&s->w, kvr_router_n_role(s->r, KVR_ROLE_PREFILL, true));
    kvr_json_key(&s->w, "enforce_disagg");
    kvr_json_bool(&s->w, s->cfg.enforce_disagg);
    kvr_json_end_object(&s->w);
    if (s->index_origin[0] != '\0') {
        kvr_json_key(&s->w, "index_origin");
        kvr_json_string(&s->w, s->index_origin);
    }
    const char *k, *v;
    for (size_t i = 0; i < s->n_ext; i++)
        if (s->ext[i].detail != NULL && s->ext[i].detail(s->ext[i].arg, &k, &v)) {
            kvr_json_key(&s->w, k);
            kvr_json_string(&s->w, v);
        }
    kvr_json_end_object(&s->w);
    api_reply_writer(s, req, 200);
}

static void h_workers_post(kvr_api_server_t *s, struct evhttp_request *req)
{
    size_t len;
    const char *body = body_of(req, &len);
    kvr_api_worker_t a;
    int rc = kvr_api_decode_worker(s->dec, body, len, &a);
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc, kvr_api_decoder_error(s->dec));
        return;
    }
    kvr_worker_spec_t sp;
    char err[256] = "";
    rc = kvr_api_worker_to_spec(&sp, &a, err, sizeof err);
    if (rc == KVR_OK)
        rc = kvr_api_server_add_worker(s, &sp, err, sizeof err);
    if (rc == KVR_EEXIST) {
        api_reply_error(s, req, 409, "invalid_request_error", "%s", err);
        return;
    }
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc == KVR_EFULL ? KVR_EINVAL : rc, err);
        return;
    }
    kvr_json_writer_reset(&s->w);
    write_worker(s, &sp);
    api_reply_writer(s, req, 201);
}

static void h_workers_delete(kvr_api_server_t *s, struct evhttp_request *req, const char *idtext)
{
    char *end;
    unsigned long long id = strtoull(idtext, &end, 10);
    if (*idtext == '\0' || *end != '\0' || *idtext == '-') {
        api_reply_error(s, req, 400, "invalid_request_error", "worker id: not an unsigned integer");
        return;
    }
    if (kvr_api_server_remove_worker(s, id) != KVR_OK) {
        api_reply_error(s, req, 404, "not_found_error", "unknown worker %llu", id);
        return;
    }
    kvr_json_writer_reset(&s->w);
    kvr_json_begin_object(&s->w);
    kvr_json_key(&s->w, "removed");
    kvr_json_u64(&s->w, id);
    kvr_json_end_object(&s->w);
    api_reply_writer(s, req, 200);
}

kvr_router_t *kvr_api_server_router(const kvr_api_server_t *s) { return s->r; }

void kvr_api_server_set_index_origin(kvr_api_server_t *s, const char *origin)
{
    snprintf(s->index_origin, sizeof s->index_origin, "%s", origin ? origin : "");
}

int kvr_api_server_remove_worker(kvr_api_server_t *s, uint64_t id)
{
    if (kvr_router_remove_worker(s->r, id) != KVR_OK)
        return KVR_ENOWORKER;
    if (s->g != NULL)
        (void)kvr_ingest_remove_worker(s->g, id);
    api_remove_probe(s, id);
    for (size_t i = 0; i < s->n_ext; i++)
        if (s->ext[i].worker_removed != NULL)
            s->ext[i].worker_removed(s->ext[i].arg, id);
    kvr_log(KVR_LOG_INFO, "worker %llu removed", (unsigned long long)id);
    kvr_sched_dispatch(s->sched, kvr_now_ms(), KVR_SCHED_BY_EVENT);
    return KVR_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Dump, health, metrics */

typedef struct dump_ctx {
    kvr_json_writer_t *w;
} dump_ctx_t;

static int dump_event(void *ud, const kvr_event_t *ev)
{
    kvr_json_writer_t *w = ((dump_ctx_t *)ud)->w;
    static const char *const tiers[] = {"device", "host_pinned", "disk", "external"};
    kvr_json_begin_object(w);
    kvr_json_key(w, "worker_id");
    kvr_json_u64(w, ev->worker.worker_id);
    kvr_json_key(w, "dp_rank");
    kvr_json_u64(w, ev->worker.dp_rank);
    kvr_json_key(w, "storage_tier");
    kvr_json_string(w, tiers[ev->tier & 3]);
    kvr_json_key(w, "event_id");
    kvr_json_u64(w, ev->event_id);
    if (ev->kind == KVR_EV_STORED) {
        kvr_json_key(w, "stored");
        kvr_json_begin_object(w);
        kvr_json_key(w, "parent_hash");
        if (ev->has_parent)
            kvr_json_u64(w, ev->parent_ext);
        else
            kvr_json_null(w);
        kvr_json_key(w, "blocks");
        kvr_json_begin_array(w);
        for (size_t i = 0; i < ev->n_blocks; i++) {
            kvr_json_begin_object(w);
            kvr_json_key(w, "block_hash");
            kvr_json_u64(w, ev->blocks[i].ext);
            kvr_json_key(w, "tokens_hash");
            kvr_json_u64(w, ev->blocks[i].lbh);
            kvr_json_end_object(w);
        }
        kvr_json_end_array(w);
        kvr_json_end_object(w);
    } else {
        kvr_json_key(w, "removed");
        kvr_json_begin_object(w);
        kvr_json_key(w, "block_hashes");
        kvr_json_begin_array(w);
        for (size_t i = 0; i < ev->n_removed; i++)
            kvr_json_u64(w, ev->removed[i]);
        kvr_json_end_array(w);
        kvr_json_end_object(w);
    }
    kvr_json_end_object(w);
    return kvr_json_writer_status(w) == KVR_OK ? 0 : 1;
}

int kvr_api_wait_failed(const kvr_router_t *r, int rc, char *msg, size_t msg_len)
{
    const kvr_router_config_t *c = kvr_router_config(r);
    if (rc == KVR_ENOWORKER) {
        snprintf(msg, msg_len,
                 "no worker ready: waited min_initial_workers_wait_ms (%llu ms) for "
                 "min_initial_workers (%u; %zu ready)",
                 (unsigned long long)c->min_initial_workers_wait_ms, c->min_initial_workers,
                 kvr_router_n_ready(r));
        return 503;
    }
    snprintf(msg, msg_len, "queued longer than router_queue_timeout_ms (%llu ms)",
             (unsigned long long)c->router_queue_timeout_ms);
    return 429;
}

const char *api_index_state(const kvr_api_server_t *s, const kvr_worker_spec_t *sp,
                            const kvr_rank_status_t *st)
{
    if (s->g == NULL) {
        const kvr_router_config_t *c = kvr_router_config(s->r);
        if (c->router_mode == KVR_MODE_APPROX)
            return "approximate";
        if (c->remote_indexer[0] != '\0')
            return "remote";
        if (!kvr_config_uses_index(c))
            return "not_indexed";
    }
    return sp->events[0] ? kvr_rank_state_name(st->state) : "no_events";
}

/* The index's replayable events: from the ingest thread in kv mode; in approximate mode the
 * index is the router's own, written on this thread, so it is walked here. */
/* GET /v1/index/snapshot: the index of every exact rank with its cursor, in the warm-restart
 * format (wire/index_snapshot.h), for a replica joining the fleet. */
static void h_index_snapshot(kvr_api_server_t *s, struct evhttp_request *req)
{
    if (s->g == NULL) {
        api_reply_error(s, req, 404, "not_found_error",
                        "this router keeps no index fed by KV events (router_mode kv only)");
        return;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    char err[300] = "";
    kvr_ingest_snap_report_t rep;
    int rc = kvr_ingest_save_mem(s->g, &buf, &len, &rep, err, sizeof err);
    if (rc != KVR_OK) {
        api_reply_error(s, req, 500, "internal_error", "%s", err);
        return;
    }
    kvr_log(KVR_LOG_INFO, "index snapshot served: %u exact ranks (%u not exact, left out), "
            "%llu events, %zu bytes", rep.ranks, rep.ranks_skipped,
            (unsigned long long)rep.events, len);
    api_reply_text(s, req, 200, "application/octet-stream", (const char *)buf, len);
    free(buf);
}

static void h_dump(kvr_api_server_t *s, struct evhttp_request *req)
{
    kvr_index_t *approx_ix = NULL;
    if (s->g == NULL) {
        const kvr_router_config_t *c = kvr_router_config(s->r);
        approx_ix = c->router_mode == KVR_MODE_APPROX ? kvr_router_index(s->r) : NULL;
        if (approx_ix == NULL) {
            api_reply_error(s, req, 404, "not_found_error",
                            "this router keeps no prefix index (%s)",
                            c->router_mode == KVR_MODE_KV ? "overlap_score_credit is 0"
                                                          : "router_mode is not kv or approx");
            return;
        }
    }
    kvr_json_writer_reset(&s->w);
    kvr_json_begin_object(&s->w);
    kvr_json_key(&s->w, "block_size");
    kvr_json_u64(&s->w, s->cfg.block_size);
    kvr_json_key(&s->w, "events");
    kvr_json_begin_array(&s->w);
    dump_ctx_t d = {&s->w};
    int rc = approx_ix != NULL ? kvr_index_dump(approx_ix, dump_event, &d)
                               : kvr_ingest_dump(s->g, dump_event, &d);
    kvr_json_end_array(&s->w);
    kvr_json_end_object(&s->w);
    if (rc != KVR_OK) {
        api_reply_error(s, req, 500, "internal_error", "dump failed: %s", kvr_strerror(rc));
        return;
    }
    api_reply_writer(s, req, 200);
}

/* 200 "OK", then a "key: value" line per extension detail (e.g. "nats: disconnected"). */
static void h_health(kvr_api_server_t *s, struct evhttp_request *req)
{
    char body[1024] = "OK\n";
    size_t len = 3;
    const char *k, *v;
    if (s->index_origin[0] != '\0')
        len += (size_t)snprintf(body + len, sizeof body - len, "index: %s\n", s->index_origin);
    for (size_t i = 0; i < s->n_ext; i++)
        if (s->ext[i].detail != NULL && s->ext[i].detail(s->ext[i].arg, &k, &v) &&
            len < sizeof body)
            len += (size_t)snprintf(body + len, sizeof body - len, "%s: %s\n", k, v);
    api_reply_text(s, req, 200, "text/plain", body, len < sizeof body ? len : sizeof body - 1);
}

/* Ready when at least one worker is registered and not fenced, the start-up wait for
 * min_initial_workers is over, and the load tracker has room for a local request. */
static void h_ready(kvr_api_server_t *s, struct evhttp_request *req)
{
    size_t up = kvr_router_n_ready(s->r);
    if (up == 0) {
        api_reply_error(s, req, 503, "service_unavailable", "no healthy worker registered");
        return;
    }
    if (!kvr_sched_warm(s->sched)) {
        api_reply_error(s, req, 503, "service_unavailable",
                        "waiting for min_initial_workers (%u; %zu ready)",
                        kvr_router_config(s->r)->min_initial_workers, up);
        return;
    }
    kvr_load_stats_t ls;
    kvr_load_stats(kvr_router_load(s->r), &ls);
    if (ls.live_requests - ls.peer_requests >= ls.max_requests) {
        api_reply_error(s, req, 503, "service_unavailable",
                        "%llu requests in flight (router_max_requests): every new request "
                        "is refused until some end",
                        (unsigned long long)(ls.live_requests - ls.peer_requests));
        return;
    }
    const char *why;
    for (size_t i = 0; i < s->n_ext; i++)
        if (s->ext[i].ready != NULL && !s->ext[i].ready(s->ext[i].arg, &why)) {
            api_reply_error(s, req, 503, "service_unavailable", "%s", why);
            return;
        }
    api_reply_text(s, req, 200, "text/plain", "ready\n", 6);
}

/* ---------------------------------------------------------------------------------------- */
/* POST /router: the reference's tagged requests */

static void h_router(kvr_api_server_t *s, struct evhttp_request *req)
{
    size_t len, n = 0;
    const char *body = body_of(req, &len);
    kvr_api_router_t a;
    int rc = kvr_api_decode_router(s->dec, body, len, &a);
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc, kvr_api_decoder_error(s->dec));
        return;
    }
    kvr_route_req_t q = {.tokens = a.tokens,
                         .n_tokens = a.n_tokens,
                         .update_state = true,
                         .lora_name = a.lora_name,
                         .lora_name_len = a.lora_name_len,
                         .mm = a.mm,
                         .n_mm = a.n_mm,
                         .cache_namespace = a.cache_namespace,
                         .cache_namespace_len = a.cache_namespace_len,
                         .priority_jump = a.priority_jump,
                         .required_taints = a.required_taints,
                         .n_required = a.n_required,
                         .preferred_taints = a.preferred_taints,
                         .n_preferred = a.n_preferred,
                         .request_id = a.has_request_id ? a.request_id : NULL,
                         .request_id_len = a.has_request_id ? strlen(a.request_id) : 0};
    kvr_json_writer_t *w = &s->w;
    switch (a.method) {
    case KVR_API_ROUTER_NEW:
        route_and_reply(s, req, &q, true, a.strict_priority);
        return;
    case KVR_API_ROUTER_POTENTIAL_LOADS:
        if ((rc = ensure_rank_bufs(s)) == KVR_OK)
            rc = kvr_router_loads(s->r, &q, s->loads, s->cap_ranks, &n);
        if (rc != KVR_OK) {
            api_reply_status(s, req, rc, NULL);
            return;
        }
        kvr_json_writer_reset(w);
        kvr_json_begin_object(w);
        kvr_json_key(w, "method");
        kvr_json_string(w, "potential_loads");
        kvr_json_key(w, "loads");
        write_loads(w, s->loads, n);
        kvr_sched_stats_t ss;
        kvr_sched_stats(s->sched, &ss);
        if (ss.queue_on) {
            const kvr_queue_stats_t qs = ss.queue;
            kvr_json_key(w, "pending_count");
            kvr_json_u64(w, qs.pending);
            kvr_json_key(w, "pending_isl_tokens");
            kvr_json_u64(w, qs.pending_isl_tokens);
        }
        kvr_json_end_object(w);
        api_reply_writer(s, req, 200);
        return;
    case KVR_API_ROUTER_MARK_PREFILL:
    case KVR_API_ROUTER_MARK_FREE: {
        bool prefill = a.method == KVR_API_ROUTER_MARK_PREFILL;
        size_t idl = a.has_request_id ? strlen(a.request_id) : 0;
        rc = apply_by_id(s, prefill ? KVR_SCHED_FIRST_TOKEN : KVR_SCHED_FREE, a.request_id, idl,
                         NAN);
        kvr_json_writer_reset(w);
        kvr_json_begin_object(w);
        kvr_json_key(w, "method");
        kvr_json_string(w, prefill ? "prefill_marked" : "free_marked");
        kvr_json_key(w, "success");
        kvr_json_bool(w, rc == KVR_OK);
        kvr_json_end_object(w);
        api_reply_writer(s, req, 200);
        return;
    }
    }
    api_reply_error(s, req, 400, "invalid_request_error", "unknown method");
}

/* ---------------------------------------------------------------------------------------- */
/* Dispatch */

/* 401 in OpenAI's shape (code "invalid_api_key") with the Bearer challenge. */
static void reply_unauthorized(kvr_api_server_t *s, struct evhttp_request *req, const char *msg)
{
    s->unauthorized++;
    kvr_json_writer_t *w = &s->w;
    kvr_json_writer_reset(w);
    (void)kvr_oai_encode_auth_error(w, msg);
    evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
    api_reply_writer(s, req, 401);
}

/* The extensions, in order: true when one answered. */
static bool ext_handle(kvr_api_server_t *s, struct evhttp_request *req, const char *path,
                       bool get, bool post)
{
    for (size_t i = 0; i < s->n_ext; i++)
        if (s->ext[i].handle != NULL && s->ext[i].handle(s->ext[i].arg, req, path, get, post))
            return true;
    return false;
}

static void serve(kvr_api_server_t *s, struct evhttp_request *req, bool on_admin)
{
    s->http_requests++;
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    const char *uri = evhttp_request_get_uri(req);
    const struct evhttp_uri *parsed = evhttp_request_get_evhttp_uri(req);
    const char *path = parsed ? evhttp_uri_get_path(parsed) : uri;
    if (path == NULL)
        path = "/";
    bool get = m == EVHTTP_REQ_GET, post = m == EVHTTP_REQ_POST, del = m == EVHTTP_REQ_DELETE;
    char why[200];
    const char *auth = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    int verdict = kvr_access_check(&s->access, kvr_access_class(path, get, post, del), on_admin,
                                   auth, why, sizeof why);
    if (verdict == 401) {
        reply_unauthorized(s, req, why);
        return;
    }
    if (verdict != 0) {
        api_reply_error(s, req, verdict, "not_found_error", "%s", why);
        return;
    }
    if (post && strcmp(path, "/v1/route") == 0)
        h_route(s, req);
    else if (strncmp(path, "/v1/requests/", 13) == 0 && (post || del))
        h_request(s, req, path + 13, m);
    else if (post && strcmp(path, "/v1/query") == 0)
        h_query(s, req);
    else if (post && strcmp(path, "/v1/loads") == 0)
        h_loads(s, req);
    else if (get && strcmp(path, "/v1/workers") == 0)
        h_workers_get(s, req);
    else if (post && strcmp(path, "/v1/workers") == 0)
        h_workers_post(s, req);
    else if (del && strncmp(path, "/v1/workers/", 12) == 0)
        h_workers_delete(s, req, path + 12);
    else if (get && strcmp(path, "/v1/dump") == 0)
        h_dump(s, req);
    else if (get && strcmp(path, "/v1/index/snapshot") == 0)
        h_index_snapshot(s, req);
    else if (get && strcmp(path, "/health") == 0)
        h_health(s, req);
    else if (get && strcmp(path, "/ready") == 0)
        h_ready(s, req);
    else if (get && strcmp(path, "/metrics") == 0)
        api_h_metrics(s, req);
    else if (post && strcmp(path, "/router") == 0)
        h_router(s, req);
    else if (ext_handle(s, req, path, get, post))
        ; /* the front end answers */
    else
        api_reply_error(s, req, 404, "not_found_error", "no endpoint %s %s",
                        get    ? "GET"
                        : post ? "POST"
                        : del  ? "DELETE"
                               : "?",
                        path);
}

static void on_request(struct evhttp_request *req, void *arg) { serve(arg, req, false); }
static void on_admin_request(struct evhttp_request *req, void *arg) { serve(arg, req, true); }

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_api_server_t *s = arg;
    uint64_t now = kvr_now_ms();
    api_sync_rank_status(s);
    api_warn_silent_ranks(s, now);
    kvr_sched_tick(s->sched, now); /* expiry, then the queue */
    if (now - s->last_probe_ms >= s->cfg.health_interval_ms) {
        s->last_probe_ms = now;
        api_probe_all(s);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Creation */

/* One listener: an evhttp under a guard (http/http_guard.h) listening on host:port. */
static int open_listener(kvr_api_server_t *s, const char *name, const char *host, uint16_t port,
                         kvr_http_handler_fn fn, struct evhttp **http, uint16_t *bound)
{
    const kvr_router_config_t *c = &s->cfg;
    kvr_http_limits_t lim = {.max_connections = c->http_max_connections,
                             .max_header_bytes = c->http_max_header_bytes,
                             .max_body_bytes = c->http_max_body_bytes,
                             .header_timeout_ms = c->http_header_timeout_ms,
                             .body_timeout_ms = c->http_body_timeout_ms,
                             .idle_timeout_ms = c->http_idle_timeout_ms};
    *http = evhttp_new(s->base);
    if (*http == NULL)
        return KVR_ENOMEM;
    evhttp_set_allowed_methods(*http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_DELETE);
    kvr_http_guard_t *g = kvr_http_guard_new(s->base, *http, name, &lim, fn, s);
    if (g == NULL)
        return KVR_ENOMEM;
    s->guards[s->n_guards++] = g;
    return kvr_http_guard_listen(g, host, port, bound);
}

kvr_api_server_t *kvr_api_server_new(struct event_base *base, kvr_sched_t *sched, kvr_ingest_t *g,
                                     const kvr_router_config_t *cfg, int *status, char *err,
                                     size_t err_len)
{
    kvr_api_server_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    s->base = base;
    s->sched = sched;
    s->r = kvr_sched_router(sched);
    s->g = g;
    s->cfg = *cfg;
    s->rl_health = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    s->rl_silent = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(60000, 8);
    s->rl_cap = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(60000, 8);
    kvr_json_writer_init(&s->w);
    kvr_prom_init(&s->prom);
    kvr_hist_init(&s->h_hash, OVERHEAD_BUCKETS, N_OVERHEAD_BUCKETS);
    kvr_hist_init(&s->h_lookup, OVERHEAD_BUCKETS, N_OVERHEAD_BUCKETS);
    kvr_hist_init(&s->h_select, OVERHEAD_BUCKETS, N_OVERHEAD_BUCKETS);
    kvr_hist_init(&s->h_total, OVERHEAD_BUCKETS, N_OVERHEAD_BUCKETS);
    kvr_api_options_t ao = {.max_tokens = cfg->router_max_prompt_tokens < KVR_API_MAX_TOKENS
                                              ? cfg->router_max_prompt_tokens
                                              : KVR_API_MAX_TOKENS};
    s->dec = kvr_api_decoder_new(&ao);
    s->out = evbuffer_new();
    s->probes = calloc(MAX_PROBES, sizeof *s->probes);
    if (kvr_sched_observe(sched, on_sched_event, s) != KVR_OK) {
        snprintf(err, err_len, "the scheduler has no room for another observer");
        kvr_api_server_free(s);
        *status = KVR_EFULL;
        return NULL;
    }
    if (s->dec == NULL || s->out == NULL || s->probes == NULL) {
        snprintf(err, err_len, "out of memory");
        kvr_api_server_free(s);
        *status = KVR_ENOMEM;
        return NULL;
    }
    int rc = kvr_access_init(&s->access, cfg, err, err_len);
    if (rc != KVR_OK) {
        kvr_api_server_free(s);
        *status = rc;
        return NULL;
    }
    /* evhttp's header parsing is quadratic in the header's size (a 40 MB header held the HTTP
     * thread for 7 s): the guard refuses a head at http_max_header_bytes */
    rc = open_listener(s, "client", cfg->bind, (uint16_t)cfg->http_port, on_request, &s->http,
                       &s->port);
    if (rc == KVR_OK && cfg->admin_port.set) {
        rc = open_listener(s, "admin", cfg->admin_bind, (uint16_t)cfg->admin_port.v,
                           on_admin_request, &s->admin_http, &s->admin_port);
        if (rc != KVR_OK)
            snprintf(err, err_len, "admin_port: cannot listen on %s:%u (in use, or a bad "
                     "address)", cfg->admin_bind, (unsigned)cfg->admin_port.v);
    } else if (rc != KVR_OK) {
        snprintf(err, err_len, "http_port: cannot listen on %s:%u (in use, or a bad address)",
                 cfg->bind, cfg->http_port);
    }
    if (rc != KVR_OK) {
        kvr_api_server_free(s);
        *status = rc == KVR_ENOMEM ? rc : KVR_EIO;
        return NULL;
    }
    s->tick = event_new(base, -1, EV_PERSIST, on_tick, s);
    struct timeval tv = {0, 100000};
    if (s->tick == NULL || event_add(s->tick, &tv) != 0) {
        kvr_api_server_free(s);
        *status = KVR_ENOMEM;
        return NULL;
    }
    *status = KVR_OK;
    return s;
}

void kvr_api_server_free(kvr_api_server_t *s)
{
    if (s == NULL)
        return;
    if (s->tick)
        event_free(s->tick);
    for (size_t i = 0; s->probes != NULL && i < s->n_all; i++) {
        if (s->probes[i]->conn != NULL)
            evhttp_connection_free(s->probes[i]->conn);
        if (s->probes[i]->cap_conn != NULL)
            evhttp_connection_free(s->probes[i]->cap_conn);
        free(s->probes[i]);
    }
    if (s->sched != NULL)
        kvr_sched_unobserve(s->sched, on_sched_event, s);
    while (s->all_waiters != NULL) { /* queued ones stay in the scheduler, answered by nobody */
        waiter_t *w = s->all_waiters;
        if (w->req != NULL)
            evhttp_connection_set_closecb(evhttp_request_get_connection(w->req), NULL, NULL);
        if (w->ticket != 0)
            (void)kvr_sched_cancel(s->sched, w->ticket);
        s->all_waiters = w->next_all;
        free(w);
    }
    if (s->http)
        evhttp_free(s->http); /* its connections' filters still use their guard */
    if (s->admin_http)
        evhttp_free(s->admin_http);
    for (size_t i = 0; i < s->n_guards; i++)
        kvr_http_guard_free(s->guards[i]);
    if (s->out)
        evbuffer_free(s->out);
    kvr_api_decoder_free(s->dec);
    kvr_json_writer_deinit(&s->w);
    kvr_prom_deinit(&s->prom);
    free(s->probes);
    free(s->scores);
    free(s->loads);
    free(s);
}

uint16_t kvr_api_server_port(const kvr_api_server_t *s) { return s->port; }
uint16_t kvr_api_server_admin_port(const kvr_api_server_t *s) { return s->admin_port; }

void kvr_api_server_drain(kvr_api_server_t *s)
{
    for (size_t i = 0; i < s->n_guards; i++)
        kvr_http_guard_drain(s->guards[i]);
}

uint64_t kvr_api_server_busy(const kvr_api_server_t *s)
{
    uint64_t n = 0;
    for (size_t i = 0; i < s->n_guards; i++)
        n += kvr_http_guard_busy(s->guards[i]);
    return n;
}

int kvr_api_server_add_worker(kvr_api_server_t *s, const kvr_worker_spec_t *w, char *err,
                              size_t err_len)
{
    int rc = kvr_router_add_worker(s->r, w, err, err_len);
    if (rc != KVR_OK)
        return rc;
    if (s->g != NULL && w->events[0] != '\0' && s->cfg.use_kv_events &&
        s->cfg.router_mode == KVR_MODE_KV) {
        rc = kvr_ingest_subscribe(s->g, w, err, err_len);
        if (rc != KVR_OK) {
            (void)kvr_router_remove_worker(s->r, w->worker_id);
            return rc;
        }
    }
    if (w->url[0] != '\0' && s->n_all < MAX_PROBES) {
        probe_t *pr = calloc(1, sizeof *pr);
        if (pr != NULL) {
            pr->s = s;
            pr->worker_id = w->worker_id;
            /* keep live probes first: the first dead one moves to the end */
            s->probes[s->n_all++] = s->probes[s->n_probes];
            s->probes[s->n_probes++] = pr;
        }
    }
    kvr_log(KVR_LOG_INFO, "worker %llu registered (ranks %u..%u%s%s%s%s)",
            (unsigned long long)w->worker_id, w->dp_start, w->dp_start + w->dp_size - 1,
            w->events[0] ? ", events " : "", w->events, w->url[0] ? ", url " : "", w->url);
    kvr_sched_dispatch(s->sched, kvr_now_ms(), KVR_SCHED_BY_EVENT);
    return KVR_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Services for the OpenAI front end */

void kvr_api_server_reply(kvr_api_server_t *s, struct evhttp_request *req, int code,
                          const char *ctype, const char *data, size_t len)
{
    api_reply_text(s, req, code, ctype, data, len);
}

int kvr_api_server_add_extension(kvr_api_server_t *s, const kvr_api_extension_t *ext)
{
    if (s->n_ext == KVR_API_MAX_EXTENSIONS)
        return KVR_EFULL;
    s->ext[s->n_ext++] = *ext;
    return KVR_OK;
}

void kvr_api_server_remove_extension(kvr_api_server_t *s, void *arg)
{
    for (size_t i = 0; i < s->n_ext; i++)
        if (s->ext[i].arg == arg) {
            memmove(&s->ext[i], &s->ext[i + 1], (s->n_ext - i - 1) * sizeof s->ext[0]);
            s->n_ext--;
            return;
        }
}
