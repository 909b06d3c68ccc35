/*
 * api.c: the router's JSON API (see api.h).
 *
 * Invariants: every evhttp request gets exactly one reply, except a queued one whose client
 * went away (its connection's close callback removes it from the queue and frees it; nothing
 * touches the request afterwards). A queued request owns copies of its tokens and strings.
 * Threads: everything here runs on the HTTP thread; the ingest thread is reached only through
 * kvr_ingest_* (synchronous commands and snapshots).
 * Cost: a route is one JSON decode (tokens streamed), one decision (core/router.c) and one
 * small JSON reply; no allocation once warm, but for queued requests.
 */
#include "api/api.h"
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
#include "base/log.h"
#include "wire/api_json.h"
#include "wire/json_scan.h"
#include "wire/json_writer.h"
#include "wire/openai.h"
#include "wire/prom.h"
#include "wire/router_event_json.h"

/* seconds: 2 us to 100 ms */
static const double OVERHEAD_BUCKETS[] = {2e-6, 5e-6,   1e-5, 2.5e-5, 5e-5,   1e-4, 2.5e-4, 5e-4,
                                          1e-3, 2.5e-3, 5e-3, 1e-2,   2.5e-2, 5e-2, 0.1};
#define N_OVERHEAD_BUCKETS (sizeof OVERHEAD_BUCKETS / sizeof OVERHEAD_BUCKETS[0])

/* ---------------------------------------------------------------------------------------- */
/* Replies */

/* The HTTP answer for a router status. */
void api_reply_status(kvr_api_t *s, struct evhttp_request *req, int rc, const char *detail)
{
    switch (rc) {
    case KVR_ENOWORKER: {
        char why[200] = "";
        if (detail == NULL)
            kvr_fleet_why_none(s->fleet, why, sizeof why);
        if (detail == NULL && why[0] == '\0')
            detail = "its model, pool or filters leave no worker";
        kvr_reply_error(s->rep, req, 503, "service_unavailable", "no worker can serve this request: %s",
                        detail != NULL ? detail : why);
        break;
    }
    case KVR_ENOTALLOWED:
        kvr_reply_error(s->rep, req, 503, "service_unavailable",
                        "the pinned worker is outside the request's filters");
        break;
    case KVR_ENOMODEL:
        kvr_reply_error(s->rep, req, 404, "not_found_error", "%s",
                        detail ? detail : "no worker serves the request's model or adapter");
        break;
    case KVR_EBUSY:
        kvr_reply_error(s->rep, req, 429, "rate_limit_exceeded", "every eligible worker is busy");
        break;
    case KVR_EQUEUEFULL:
        kvr_reply_error(s->rep, req, 429, "rate_limit_exceeded", "the request queue is full");
        break;
    case KVR_EEXIST:
        kvr_reply_error(s->rep, req, 409, "invalid_request_error", "request_id is already in flight");
        break;
    case KVR_EFULL:
        kvr_reply_error(s->rep, req, 429, "rate_limit_exceeded", "too many requests in flight");
        break;
    case KVR_ETOOBIG:
        if (detail != NULL)
            kvr_reply_error(s->rep, req, 413, "invalid_request_error", "%s", detail);
        else
            kvr_reply_error(s->rep, req, 413, "invalid_request_error",
                            "prompt longer than router_max_prompt_tokens (%llu tokens)",
                            (unsigned long long)s->cfg.router_max_prompt_tokens);
        break;
    case KVR_ENOTFOUND:
        kvr_reply_error(s->rep, req, 404, "not_found_error", "%s", detail ? detail : "not found");
        break;
    case KVR_EINVAL:
    case KVR_EPARSE:
    case KVR_ERANGE:
        kvr_reply_error(s->rep, req, 400, "invalid_request_error", "%s",
                        detail ? detail : kvr_strerror(rc));
        break;
    default:
        kvr_reply_error(s->rep, req, 500, "internal_error", "%s", kvr_strerror(rc));
        break;
    }
}

/* The body as one contiguous string (NUL not required by the decoders). */
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

static void observe(kvr_api_t *s, const kvr_route_res_t *res)
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
    static const char *const keys[] = {"request_id",     "worker_id",     "dp_rank",
                                       "overlap_blocks", "cached_tokens", "predicted_blocks"};
    const uint64_t v[] = {0,
                          res->worker.worker_id,
                          res->worker.dp_rank,
                          res->overlap_blocks,
                          res->cached_tokens,
                          res->predicted_blocks};
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

static void reply_routed(kvr_api_t *s, struct evhttp_request *req,
                         const kvr_route_res_t *res, bool tagged)
{
    kvr_json_writer_t *w = s->w;
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    if (tagged) {
        kvr_json_key(w, "method");
        kvr_json_string(w, "new");
    }
    write_choice(w, "", res);
    kvr_json_end_object(w);
    kvr_reply_writer(s->rep, req, 200);
}

/* Every placement the scheduler booked or answered (both front doors): the histograms. */
#define EXPLAIN_RANKS 16 /* ranks a decision's log line lists (the rest counted) */

/* At log level debug: one line per decision (the reference's routing logs): the choice, the
 * prompt, and each rank's terms and why it was or was not a candidate. Rate-limited. */
static void log_decision(kvr_api_t *s, const kvr_sched_event_t *ev)
{
    kvr_rank_explain_t ex[EXPLAIN_RANKS];
    size_t n = kvr_router_last_explain(s->r, ex, EXPLAIN_RANKS);
    char ranks[EXPLAIN_RANKS * 144 + 64] = "";
    size_t used = 0;
    for (size_t i = 0; i < n && i < EXPLAIN_RANKS && used < sizeof ranks; i++)
        used += (size_t)snprintf(ranks + used, sizeof ranks - used,
                                 "%s %llu/%u %s overlap %.1f prefill %.1f (step wait %.1f, "
                                 "memory %.1f) decode %.1f cost %.1f",
                                 i ? ";" : "", (unsigned long long)ex[i].worker.worker_id,
                                 ex[i].worker.dp_rank, ex[i].why, ex[i].overlap_blocks,
                                 ex[i].prefill_blocks, ex[i].step_wait_blocks,
                                 ex[i].memory_blocks, ex[i].decode_blocks, ex[i].cost);
    if (n > EXPLAIN_RANKS && used < sizeof ranks)
        snprintf(ranks + used, sizeof ranks - used, "; %zu more ranks", n - EXPLAIN_RANKS);
    const kvr_route_res_t *res = ev->res;
    size_t blocks = ev->booking != NULL ? ev->booking->n_seq : 0;
    kvr_log_limited(&s->rl_decisions, KVR_LOG_DEBUG,
                    "decision %s: worker %llu rank %u, prompt %zu blocks, overlap %u blocks "
                    "(%llu tokens cached); ranks:%s%s",
                    res->request_id, (unsigned long long)res->worker.worker_id,
                    res->worker.dp_rank, blocks, res->overlap_blocks,
                    (unsigned long long)res->cached_tokens, n > 0 ? ranks : " (load-only pick)",
                    "");
}

static void on_sched_event(void *arg, const kvr_sched_event_t *ev)
{
    kvr_api_t *s = arg;
    if (ev->kind == KVR_SCHED_ROUTED && ev->origin == KVR_SCHED_ORIGIN_LOCAL) {
        observe(s, ev->res);
        if (kvr_log_enabled(KVR_LOG_DEBUG))
            log_decision(s, ev);
    }
}

/* {"level": "NAME"} (strict JSON, the one member): NAME into out; false when it is not that. */
static bool read_level(const char *b, size_t n, char *out, size_t cap)
{
    size_t i = kvr_json_skip_ws(b, n, 0);
    if (i >= n || b[i] != '{')
        return false;
    kvr_json_iter_t it;
    kvr_json_member_t m;
    kvr_json_object_begin(&it, b, n, i, KVR_JSON_STRICT);
    bool got = false;
    int rc;
    while ((rc = kvr_json_object_next(&it, &m)) == 1) {
        size_t len = m.val_end - m.val;
        if (got || !kvr_json_key_is(b, &m, "level") || len < 2 || len - 2 >= cap ||
            b[m.val] != '"')
            return false;
        memcpy(out, b + m.val + 1, len - 2);
        out[len - 2] = '\0';
        got = true;
    }
    return rc == 0 && got && kvr_json_skip_ws(b, n, it.close + 1) == n;
}

/* GET /v1/log-level, POST /v1/log-level {"level": "debug|info|warn|error"} (admin plane): the
 * level in force; debug also turns on the decisions' breakdown (log_decision). */
static void h_log_level(kvr_api_t *s, struct evhttp_request *req, bool post)
{
    if (post) {
        size_t len;
        const char *body = kvr_http_body(req, &len);
        char level[16] = "";
        kvr_log_level_t lv;
        if (!read_level(body, len, level, sizeof level) || kvr_log_level_parse(level, &lv) != 0) {
            kvr_reply_error(s->rep, req, 400, "invalid_request_error",
                            "level: must be {\"level\": \"debug|info|warn|error\"}");
            return;
        }
        kvr_log_set_level(lv);
        kvr_router_set_explain(s->r, lv == KVR_LOG_DEBUG);
        kvr_log(KVR_LOG_WARN, "log level set to %s (POST /v1/log-level)", level);
    }
    kvr_json_writer_reset(s->w);
    kvr_json_begin_object(s->w);
    kvr_json_key(s->w, "level");
    kvr_json_string(s->w, kvr_log_level_name(kvr_log_get_level()));
    kvr_json_end_object(s->w);
    kvr_reply_writer(s->rep, req, 200);
}

static waiter_t *waiter_get(kvr_api_t *s)
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

static void waiter_put(kvr_api_t *s, waiter_t *w)
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
    kvr_api_t *s = w->s;
    struct evhttp_request *req = w->req;
    bool tagged = w->tagged;
    waiter_put(s, w);
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), NULL, NULL);
    if (res == NULL) {
        char msg[200];
        int code = kvr_fleet_wait_failed(s->r, rc, msg, sizeof msg);
        kvr_reply_error(s->rep, req, code, code == 429 ? "rate_limit_exceeded" : "service_unavailable",
                        "%s", msg);
    } else if (rc == KVR_OK)
        reply_routed(s, req, res, tagged);
    else
        api_reply_status(s, req, rc,
                         rc == KVR_EINVAL || rc == KVR_ENOMODEL ? res->error_field : NULL);
}

/* Routes (or queues: a copy, answered by on_queued_done) a decoded request; replies unless it
 * was queued. */
static void route_and_reply(kvr_api_t *s, struct evhttp_request *req,
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
static int apply_by_id(kvr_api_t *s, kvr_sched_kind_t kind, const char *id, size_t id_len,
                       double decay)
{
    kvr_sched_event_t ev = {.kind = kind, .id = id, .id_len = id_len, .decay_fraction = decay};
    return kvr_sched_apply(s->sched, &ev, kvr_now_ms());
}

/* POST /v1/route with "disagg": true: the prefill choice, then the decode choice, each as its
 * leg of a disaggregated request would be placed; booked (update_state) under request_id and
 * request_id + "-prefill", or not at all. Nothing is queued (busy: 429). Without a prefill
 * worker serving: the aggregated answer, or 503 with enforce_disagg. */
static void route_disagg(kvr_api_t *s, struct evhttp_request *req, const kvr_route_req_t *q,
                         uint32_t strict_priority)
{
    kvr_disagg_state_t st = kvr_router_disagg_state(s->r);
    if (st != KVR_DISAGG_ACTIVE) {
        if (s->cfg.enforce_disagg) {
            kvr_reply_error(s->rep, req, 503, "service_unavailable",
                            "no prefill worker is serving (the prefill pool is %s) and "
                            "enforce_disagg is set",
                            kvr_disagg_state_name(st));
            return;
        }
        route_and_reply(s, req, q, false, strict_priority);
        return;
    }
    char pid[KVR_API_MAX_REQUEST_ID_BYTES + 16];
    kvr_route_req_t pq = *q, dq = *q;
    kvr_route_req_prefill_leg(&pq);
    pq.has_pinned = false; /* pinned_worker names the decode worker */
    if (q->request_id != NULL) {
        int n = snprintf(pid, sizeof pid, "%.*s-prefill", (int)q->request_id_len, q->request_id);
        if (n > KVR_API_MAX_REQUEST_ID_BYTES) {
            kvr_reply_error(s->rep, req, 400, "invalid_request_error",
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
    kvr_place_t pl = {.q = &pq, .strict_priority = strict_priority, .copy = true};
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
    kvr_json_writer_t *w = s->w;
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
    kvr_reply_writer(s->rep, req, 200);
}

static void h_route(kvr_api_t *s, struct evhttp_request *req)
{
    size_t len;
    const char *body = kvr_http_body(req, &len);
    kvr_api_route_t a;
    int rc = kvr_api_decode_route(s->dec, body, len, &a);
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc, kvr_api_decoder_error(s->dec));
        return;
    }
    kvr_route_req_t q;
    route_req_from_api(&q, &a);
    if (a.disagg)
        route_disagg(s, req, &q, a.strict_priority);
    else
        route_and_reply(s, req, &q, false, a.strict_priority);
}

static void json_double_or_null(kvr_json_writer_t *w, bool known, double x)
{
    if (known)
        kvr_json_double(w, x);
    else
        kvr_json_null(w);
}

static void write_busy(kvr_json_writer_t *w, const char *model, const kvr_busy_threshold_t *t)
{
    kvr_json_begin_object(w);
    kvr_json_key(w, "model");
    kvr_json_string(w, model);
    kvr_json_key(w, "active_prefill_tokens_threshold");
    json_double_or_null(w, t->has_prefill_tokens, t->prefill_tokens);
    kvr_json_key(w, "active_decode_blocks_threshold");
    json_double_or_null(w, t->has_decode_frac, t->decode_frac);
    kvr_json_end_object(w);
}

static void write_busy_models(kvr_api_t *s)
{
    const char *models[KVR_BUSY_MAX_MODELS];
    kvr_busy_threshold_t th[KVR_BUSY_MAX_MODELS];
    size_t n = kvr_router_busy_models(s->r, models, th, KVR_BUSY_MAX_MODELS);
    kvr_json_begin_array(s->w);
    for (size_t i = 0; i < n && i < KVR_BUSY_MAX_MODELS; i++)
        write_busy(s->w, models[i], &th[i]);
    kvr_json_end_array(s->w);
}

/* POST /busy_threshold (admin): a model's busy thresholds set, or read back when the body
 * gives neither; GET: every model with its own. The reference's endpoint and shapes. */
static void h_busy(kvr_api_t *s, struct evhttp_request *req, bool post)
{
    if (!post) {
        kvr_json_writer_reset(s->w);
        kvr_json_begin_object(s->w);
        kvr_json_key(s->w, "thresholds");
        write_busy_models(s);
        kvr_json_end_object(s->w);
        kvr_reply_writer(s->rep, req, 200);
        return;
    }
    size_t len;
    const char *body = kvr_http_body(req, &len);
    kvr_api_busy_t a;
    int rc = kvr_api_decode_busy(s->dec, body, len, &a);
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc, kvr_api_decoder_error(s->dec));
        return;
    }
    kvr_busy_threshold_t set = {.has_prefill_tokens = a.has_prefill_tokens,
                                .prefill_tokens = a.prefill_tokens,
                                .has_decode_frac = a.has_decode_frac,
                                .decode_frac = a.decode_frac},
                         now;
    rc = kvr_router_busy_threshold(s->r, a.model, a.model_len, &set, &now);
    if (rc == KVR_EFULL) {
        kvr_reply_error(s->rep, req, 409, "invalid_request_error",
                        "busy thresholds are kept for at most %d models", KVR_BUSY_MAX_MODELS);
        return;
    }
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc, "busy thresholds: a value is not a finite number >= 0");
        return;
    }
    if (a.has_prefill_tokens || a.has_decode_frac) {
        kvr_log(KVR_LOG_INFO, "busy thresholds of model '%.*s' set: prefill tokens %g, decode "
                "blocks %g of capacity (unset: -1)", (int)a.model_len, a.model,
                now.has_prefill_tokens ? now.prefill_tokens : -1.0,
                now.has_decode_frac ? now.decode_frac : -1.0);
        kvr_sched_dispatch(s->sched, kvr_now_ms(), KVR_SCHED_BY_EVENT); /* a raise frees work */
    }
    kvr_json_writer_reset(s->w);
    char model[KVR_MODEL_BYTES];
    snprintf(model, sizeof model, "%.*s", (int)a.model_len, a.model);
    write_busy(s->w, model, &now);
    kvr_reply_writer(s->rep, req, 200);
}

/* POST /v1/requests/{id}/first_token|output_block, DELETE /v1/requests/{id} */
static void h_request(kvr_api_t *s, struct evhttp_request *req, const char *rest,
                      enum evhttp_cmd_type method)
{
    const char *slash = strchr(rest, '/');
    size_t id_len = slash ? (size_t)(slash - rest) : strlen(rest);
    char id[KVR_API_MAX_REQUEST_ID_BYTES * 3 + 1];
    if (id_len == 0 || id_len >= sizeof id) {
        kvr_reply_error(s->rep, req, 400, "invalid_request_error", "request id: 1 to 256 bytes");
        return;
    }
    memcpy(id, rest, id_len);
    id[id_len] = '\0';
    char *decoded = evhttp_uridecode(id, 0, &id_len);
    if (decoded == NULL) {
        kvr_reply_error(s->rep, req, 400, "invalid_request_error", "request id: bad percent-encoding");
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
        const char *body = kvr_http_body(req, &len);
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
        kvr_reply_error(s->rep, req, 404, "not_found_error", "no such endpoint");
        return;
    }
    free(decoded);
    if (rc == KVR_ENOTFOUND) {
        kvr_reply_error(s->rep, req, 404, "not_found_error", "unknown request id");
        return;
    }
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc, NULL);
        return;
    }
    kvr_json_writer_reset(s->w);
    kvr_json_begin_object(s->w);
    kvr_json_key(s->w, "ok");
    kvr_json_bool(s->w, true);
    kvr_json_end_object(s->w);
    kvr_reply_writer(s->rep, req, 200); /* the scheduler re-ran its queue: load went down */
}

static int ensure_rank_bufs(kvr_api_t *s)
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
static bool prepare_query(kvr_api_t *s, struct evhttp_request *req, query_decode_fn decode,
                          kvr_route_req_t *q)
{
    size_t len;
    const char *body = kvr_http_body(req, &len);
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

static void h_query(kvr_api_t *s, struct evhttp_request *req)
{
    if (s->cfg.remote_indexer[0] != '\0') {
        kvr_reply_error(s->rep, req, 409, "invalid_request_error",
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
    kvr_json_writer_t *w = s->w;
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
        kvr_json_key(w, "predicted_blocks");
        kvr_json_u64(w, sc->predicted_blocks);
        kvr_json_end_object(w);
    }
    kvr_json_end_array(w);
    kvr_json_end_object(w);
    kvr_reply_writer(s->rep, req, 200);
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

static void h_loads(kvr_api_t *s, struct evhttp_request *req)
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
    kvr_json_writer_reset(s->w);
    kvr_json_begin_object(s->w);
    kvr_json_key(s->w, "loads");
    write_loads(s->w, s->loads, n);
    kvr_json_end_object(s->w);
    kvr_reply_writer(s->rep, req, 200);
}

/* ---------------------------------------------------------------------------------------- */
/* Workers */

/* The rank's predictions against its engine's reports (fleet/drift.h); null when the router
 * does not check them (no KV events here, or prediction_drift_window 0). */
static void put_prediction(kvr_api_t *s, kvr_json_writer_t *w, kvr_worker_t wk)
{
    kvr_json_key(w, "prediction");
    const kvr_drift_t *d = kvr_fleet_drift(s->fleet);
    if (d == NULL) {
        kvr_json_null(w);
        return;
    }
    kvr_drift_view_t v;
    (void)kvr_drift_view(d, wk, &v);
    kvr_json_begin_object(w);
    kvr_json_key(w, "drifting");
    kvr_json_bool(w, v.drifting);
    kvr_json_key(w, "accuracy");
    kvr_json_double(w, v.accuracy);
    kvr_json_key(w, "window_answers");
    kvr_json_u64(w, v.window_samples);
    kvr_json_key(w, "window_agreeing");
    kvr_json_u64(w, v.window_agreeing);
    kvr_json_key(w, "mean_error_tokens");
    kvr_json_double(w, v.mean_error);
    kvr_json_key(w, "mean_abs_error_tokens");
    kvr_json_double(w, v.mean_abs_error);
    kvr_json_key(w, "routed");
    kvr_json_string(w, kvr_router_rank_approximate(s->r, wk) ? "approximate" : "events");
    kvr_json_key(w, "drifting_for_ms");
    if (v.drifting)
        kvr_json_u64(w, kvr_now_ms() - v.drifting_since_ms);
    else
        kvr_json_null(w);
    kvr_json_key(w, "compared");
    kvr_json_u64(w, v.compared);
    kvr_json_key(w, "agreed");
    kvr_json_u64(w, v.agreed);
    kvr_json_key(w, "flagged");
    kvr_json_u64(w, v.flagged);
    kvr_json_key(w, "recovered");
    kvr_json_u64(w, v.recovered);
    kvr_json_key(w, "prompt_tokens"); /* of the answers whose engine reported cached tokens */
    kvr_json_u64(w, v.tokens.prompt);
    kvr_json_key(w, "predicted_cached_tokens");
    kvr_json_u64(w, v.tokens.predicted_cached);
    kvr_json_key(w, "reported_cached_tokens");
    kvr_json_u64(w, v.tokens.reported_cached);
    kvr_json_end_object(w);
}

/* A rank's engine steps as its step clock has learnt them (timed from streamed tokens): what
 * the locality cost prices a busy rank's running step with. */
static void step_model_members(kvr_json_writer_t *w, const kvr_router_t *r, kvr_worker_t wk)
{
    kvr_step_model_t m = {0};
    (void)kvr_router_step_model(r, wk, &m);
    kvr_json_key(w, "steps_timed");
    kvr_json_u64(w, m.steps);
    kvr_json_key(w, "step_ms");
    json_double_or_null(w, m.steps > 0, m.mean_ms);
    kvr_json_key(w, "decode_step_ms");
    json_double_or_null(w, m.decode_steps > 0, m.decode_ms);
    kvr_json_key(w, "prefill_steps_timed");
    kvr_json_u64(w, m.prefill_steps);
    kvr_json_key(w, "prefill_ms_per_1k_tokens");
    json_double_or_null(w, m.has_slope, m.prefill_ms_per_1k);
}

static void write_worker(kvr_api_t *s, const kvr_worker_spec_t *sp)
{
    kvr_json_writer_t *w = s->w;
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
    kvr_json_key(w, "tokenizer");
    if (sp->tokenizer[0] != '\0')
        kvr_json_string(w, sp->tokenizer);
    else
        kvr_json_null(w);
    kvr_json_key(w, "role");
    kvr_json_string(w, kvr_worker_role_name(sp->role));
    if (sp->bootstrap_port != 0) {
        kvr_json_key(w, "bootstrap_host");
        kvr_json_string(w, sp->bootstrap_host);
        kvr_json_key(w, "bootstrap_port");
        kvr_json_u64(w, sp->bootstrap_port);
    }
    kvr_json_key(w, "health");
    kvr_json_begin_object(w);
    kvr_json_key(w, "probe_failures"); /* consecutive failed GET /health */
    kvr_json_u64(w, kvr_fleet_probe_failures(s->fleet, sp->worker_id));
    kvr_json_end_object(w);
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
        char why[256];
        kvr_json_key(w, "state"); /* the one word to show: health, drift, index state */
        kvr_json_string(w, kvr_fleet_rank_state(s->fleet, sp, wk, &st, why, sizeof why));
        kvr_json_key(w, "state_why");
        kvr_json_string(w, why);
        kvr_json_key(w, "index_state");
        kvr_json_string(w, kvr_fleet_index_state(s->fleet, sp, &st));
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
        put_prediction(s, w, wk);
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
        step_model_members(w, s->r, wk);
        kvr_json_end_object(w);
    }
    kvr_json_end_array(w);
    kvr_json_end_object(w);
}

/* A service's detail as a member of GET /v1/workers. */
static void detail_member(void *arg, const char *key, const char *value)
{
    kvr_json_key(arg, key);
    kvr_json_string(arg, value);
}

static void h_workers_get(kvr_api_t *s, struct evhttp_request *req)
{
    kvr_fleet_sync(s->fleet); /* the ingest thread's latest snapshot, not the last tick's copy */
    uint64_t ids[4096];
    size_t n = kvr_router_worker_ids(s->r, ids, 4096);
    kvr_json_writer_reset(s->w);
    kvr_json_begin_object(s->w);
    kvr_json_key(s->w, "block_size");
    kvr_json_u64(s->w, s->cfg.block_size);
    kvr_json_key(s->w, "router_mode"); /* in force: kv with use_kv_events false reads approx */
    kvr_json_string(s->w, kvr_config_mode_name(&s->cfg));
    kvr_json_key(s->w, "policy");
    kvr_json_string(s->w, kvr_config_policy_name(&s->cfg));
    kvr_json_key(s->w, "session_ttl_secs"); /* 0: no sticky sessions */
    kvr_json_u64(s->w, s->cfg.session_ttl_secs);
    kvr_json_key(s->w, "workers");
    kvr_json_begin_array(s->w);
    for (size_t i = 0; i < n && i < 4096; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(s->r, ids[i]);
        if (sp != NULL)
            write_worker(s, sp);
    }
    kvr_json_end_array(s->w);
    kvr_json_key(s->w, "disagg"); /* the prefill pool (docs/disagg.md) */
    kvr_json_begin_object(s->w);
    kvr_json_key(s->w, "state");
    kvr_json_string(s->w, kvr_disagg_state_name(kvr_router_disagg_state(s->r)));
    kvr_json_key(s->w, "prefill_workers");
    kvr_json_u64(s->w, kvr_router_n_role(s->r, KVR_ROLE_PREFILL, false));
    kvr_json_key(s->w, "prefill_workers_serving");
    kvr_json_u64(s->w, kvr_router_n_role(s->r, KVR_ROLE_PREFILL, true));
    kvr_json_key(s->w, "enforce_disagg");
    kvr_json_bool(s->w, s->cfg.enforce_disagg);
    kvr_json_end_object(s->w);
    kvr_json_key(s->w, "busy_thresholds"); /* models with their own (POST /busy_threshold) */
    write_busy_models(s);
    const char *origin = kvr_fleet_index_origin(s->fleet);
    if (origin[0] != '\0') {
        kvr_json_key(s->w, "index_origin");
        kvr_json_string(s->w, origin);
    }
    kvr_http_host_details(s->host, detail_member, s->w);
    kvr_json_end_object(s->w);
    kvr_reply_writer(s->rep, req, 200);
}

static void h_workers_post(kvr_api_t *s, struct evhttp_request *req)
{
    size_t len;
    const char *body = kvr_http_body(req, &len);
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
        rc = kvr_fleet_add_worker(s->fleet, &sp, err, sizeof err);
    if (rc == KVR_EEXIST) {
        kvr_reply_error(s->rep, req, 409, "invalid_request_error", "%s", err);
        return;
    }
    if (rc != KVR_OK) {
        api_reply_status(s, req, rc == KVR_EFULL ? KVR_EINVAL : rc, err);
        return;
    }
    kvr_json_writer_reset(s->w);
    write_worker(s, &sp);
    kvr_reply_writer(s->rep, req, 201);
}

static void h_workers_delete(kvr_api_t *s, struct evhttp_request *req, const char *idtext)
{
    char *end;
    unsigned long long id = strtoull(idtext, &end, 10);
    if (*idtext == '\0' || *end != '\0' || *idtext == '-') {
        kvr_reply_error(s->rep, req, 400, "invalid_request_error", "worker id: not an unsigned integer");
        return;
    }
    if (kvr_fleet_remove_worker(s->fleet, id) != KVR_OK) {
        kvr_reply_error(s->rep, req, 404, "not_found_error", "unknown worker %llu", id);
        return;
    }
    kvr_json_writer_reset(s->w);
    kvr_json_begin_object(s->w);
    kvr_json_key(s->w, "removed");
    kvr_json_u64(s->w, id);
    kvr_json_end_object(s->w);
    kvr_reply_writer(s->rep, req, 200);
}

/* ---------------------------------------------------------------------------------------- */
/* Dump, health, metrics */

typedef struct dump_ctx {
    kvr_json_writer_t *w;
} dump_ctx_t;

static int dump_event(void *ud, const kvr_event_t *ev)
{
    return kvr_dump_event_encode(((dump_ctx_t *)ud)->w, ev) == KVR_OK ? 0 : 1;
}

/* The index's replayable events: from the ingest thread in kv mode; in approximate mode the
 * index is the router's own, written on this thread, so it is walked here. */
/* GET /v1/index/snapshot: the index of every exact rank with its cursor, in the warm-restart
 * format (wire/index_snapshot.h), for a replica joining the fleet. */
static void h_index_snapshot(kvr_api_t *s, struct evhttp_request *req)
{
    if (s->g == NULL) {
        kvr_reply_error(s->rep, req, 404, "not_found_error",
                        "this router keeps no index fed by KV events (router_mode kv only)");
        return;
    }
    if (kvr_fleet_index_loading(s->fleet)) { /* never make a joining peer wait on a joiner */
        kvr_reply_error(s->rep, req, 503, "service_unavailable",
                        "this router is still loading its own index from a peer; ask another");
        return;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    char err[300] = "";
    kvr_ingest_snap_report_t rep;
    int rc = kvr_ingest_save_mem(s->g, &buf, &len, &rep, err, sizeof err);
    if (rc != KVR_OK) {
        kvr_reply_error(s->rep, req, 500, "internal_error", "%s", err);
        return;
    }
    kvr_log(KVR_LOG_INFO, "index snapshot served: %u exact ranks (%u not exact, left out), "
            "%llu events, %zu bytes", rep.ranks, rep.ranks_skipped,
            (unsigned long long)rep.events, len);
    kvr_reply_body(s->rep, req, 200, "application/octet-stream", (const char *)buf, len);
    free(buf);
}

static void h_dump(kvr_api_t *s, struct evhttp_request *req)
{
    kvr_index_t *approx_ix = NULL;
    if (s->g == NULL) {
        const kvr_router_config_t *c = kvr_router_config(s->r);
        approx_ix = c->router_mode == KVR_MODE_APPROX ? kvr_router_index(s->r) : NULL;
        if (approx_ix == NULL) {
            kvr_reply_error(s->rep, req, 404, "not_found_error",
                            "this router keeps no prefix index (%s)",
                            c->remote_indexer[0] != '\0'
                                ? "its index is the remote indexer's (remote_indexer): GET that "
                                  "indexer's /dump"
                            : c->router_mode == KVR_MODE_KV ? "overlap_score_credit is 0"
                                                            : "router_mode is not kv or approx");
            return;
        }
    }
    kvr_json_writer_reset(s->w);
    kvr_json_begin_object(s->w);
    kvr_json_key(s->w, "block_size");
    kvr_json_u64(s->w, s->cfg.block_size);
    kvr_json_key(s->w, "events");
    kvr_json_begin_array(s->w);
    dump_ctx_t d = {s->w};
    int rc = approx_ix != NULL ? kvr_index_dump(approx_ix, dump_event, &d)
                               : kvr_ingest_dump(s->g, dump_event, &d);
    kvr_json_end_array(s->w);
    kvr_json_end_object(s->w);
    if (rc != KVR_OK) {
        kvr_reply_error(s->rep, req, 500, "internal_error", "dump failed: %s", kvr_strerror(rc));
        return;
    }
    kvr_reply_writer(s->rep, req, 200);
}

typedef struct health_body {
    char text[1024];
    size_t len;
} health_body_t;

static void health_line(void *arg, const char *key, const char *value)
{
    health_body_t *b = arg;
    if (b->len < sizeof b->text)
        b->len += (size_t)snprintf(b->text + b->len, sizeof b->text - b->len, "%s: %s\n", key,
                                   value);
}

/* 200 "OK", then a "key: value" line per service detail (e.g. "nats: disconnected"). */
static void h_health(kvr_api_t *s, struct evhttp_request *req)
{
    health_body_t b = {"OK\n", 3};
    const char *origin = kvr_fleet_index_origin(s->fleet);
    if (origin[0] != '\0')
        health_line(&b, "index", origin);
    kvr_http_host_details(s->host, health_line, &b);
    kvr_reply_body(s->rep, req, 200, "text/plain", b.text,
                   b.len < sizeof b.text ? b.len : sizeof b.text - 1);
}

/* Ready when at least one worker is registered and not fenced, the start-up wait for
 * min_initial_workers is over, and the load tracker has room for a local request. */
static void h_ready(kvr_api_t *s, struct evhttp_request *req)
{
    size_t up = kvr_router_n_ready(s->r);
    if (up == 0) {
        kvr_reply_error(s->rep, req, 503, "service_unavailable", "no healthy worker registered");
        return;
    }
    if (kvr_fleet_index_loading(s->fleet)) {
        kvr_reply_error(s->rep, req, 503, "service_unavailable",
                        "loading the index from a peer (requests are served cold meanwhile)");
        return;
    }
    if (!kvr_sched_warm(s->sched)) {
        kvr_reply_error(s->rep, req, 503, "service_unavailable",
                        "waiting for min_initial_workers (%u; %zu ready)",
                        kvr_router_config(s->r)->min_initial_workers, up);
        return;
    }
    kvr_load_stats_t ls;
    kvr_load_stats(kvr_router_load(s->r), &ls);
    if (ls.live_requests - ls.peer_requests >= ls.max_requests) {
        kvr_reply_error(s->rep, req, 503, "service_unavailable",
                        "%llu requests in flight (router_max_requests): every new request "
                        "is refused until some end",
                        (unsigned long long)(ls.live_requests - ls.peer_requests));
        return;
    }
    const char *why;
    if (!kvr_http_host_ready(s->host, &why)) {
        kvr_reply_error(s->rep, req, 503, "service_unavailable", "%s", why);
        return;
    }
    kvr_reply_body(s->rep, req, 200, "text/plain", "ready\n", 6);
}

/* ---------------------------------------------------------------------------------------- */
/* POST /router: the reference's tagged requests */

static void h_router(kvr_api_t *s, struct evhttp_request *req)
{
    size_t len, n = 0;
    const char *body = kvr_http_body(req, &len);
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
    kvr_json_writer_t *w = s->w;
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
        kvr_reply_writer(s->rep, req, 200);
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
        kvr_reply_writer(s->rep, req, 200);
        return;
    }
    }
    kvr_reply_error(s->rep, req, 400, "invalid_request_error", "unknown method");
}

/* ---------------------------------------------------------------------------------------- */
/* Dispatch */

/* The router API's endpoints; false: not one of them (the next service may answer). */
static bool handle(void *arg, struct evhttp_request *req, const char *path, bool get, bool post)
{
    kvr_api_t *s = arg;
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    bool del = m == EVHTTP_REQ_DELETE;
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
    else if ((get || post) && strcmp(path, "/v1/log-level") == 0)
        h_log_level(s, req, post);
    else if ((get || post) && strcmp(path, "/busy_threshold") == 0)
        h_busy(s, req, post);
    else if (post && strcmp(path, "/router") == 0)
        h_router(s, req);
    else
        return false;
    return true;
}

/* ---------------------------------------------------------------------------------------- */
/* Creation */

kvr_api_t *kvr_api_new(kvr_http_host_t *host, kvr_fleet_t *fleet,
                       const kvr_router_config_t *cfg, int *status, char *err, size_t err_len)
{
    kvr_api_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        snprintf(err, err_len, "out of memory");
        *status = KVR_ENOMEM;
        return NULL;
    }
    s->host = host;
    s->fleet = fleet;
    s->rep = kvr_http_host_reply(host);
    s->w = s->rep->w;
    s->sched = kvr_fleet_sched(fleet);
    s->r = kvr_fleet_router(fleet);
    s->g = kvr_fleet_ingest(fleet);
    s->cfg = *cfg;
    kvr_prom_init(&s->prom);
    kvr_hist_init(&s->h_hash, OVERHEAD_BUCKETS, N_OVERHEAD_BUCKETS);
    kvr_hist_init(&s->h_lookup, OVERHEAD_BUCKETS, N_OVERHEAD_BUCKETS);
    kvr_hist_init(&s->h_select, OVERHEAD_BUCKETS, N_OVERHEAD_BUCKETS);
    kvr_hist_init(&s->h_total, OVERHEAD_BUCKETS, N_OVERHEAD_BUCKETS);
    kvr_api_options_t ao = {.max_tokens = cfg->router_max_prompt_tokens < KVR_API_MAX_TOKENS
                                              ? cfg->router_max_prompt_tokens
                                              : KVR_API_MAX_TOKENS,
                            .max_allowed_ids = KVR_API_MAX_ALLOWED_IDS};
    s->dec = kvr_api_decoder_new(&ao);
    if (s->dec == NULL) {
        snprintf(err, err_len, "out of memory");
        kvr_api_free(s);
        *status = KVR_ENOMEM;
        return NULL;
    }
    if (kvr_sched_observe(s->sched, on_sched_event, s) != KVR_OK) {
        snprintf(err, err_len, "the scheduler has no room for another observer");
        kvr_api_free(s);
        *status = KVR_EFULL;
        return NULL;
    }
    s->observing = true;
    s->rl_decisions = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(1000, 200);
    kvr_router_set_explain(s->r, kvr_log_enabled(KVR_LOG_DEBUG)); /* --log-level debug */
    kvr_http_service_t svc = {.handle = handle, .metrics = api_metrics, .arg = s};
    if (kvr_http_host_add_service(host, &svc) != KVR_OK) {
        snprintf(err, err_len, "the HTTP host has no room for another service");
        kvr_api_free(s);
        *status = KVR_EFULL;
        return NULL;
    }
    *status = KVR_OK;
    return s;
}

void kvr_api_free(kvr_api_t *s)
{
    if (s == NULL)
        return;
    kvr_http_host_remove_service(s->host, s);
    if (s->observing)
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
    kvr_api_decoder_free(s->dec);
    kvr_prom_deinit(&s->prom);
    free(s->scores);
    free(s->loads);
    free(s);
}
