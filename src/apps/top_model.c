/*
 * top_model.c: one refresh of `kvrouter top` (see top.h): the router's answers read into the
 * model. Cost: three small GETs, one short connection each, and a tree parse of each answer
 * (a /v1/stats answer holds the points since the last one: one or two; the first, all).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <yajl/yajl_tree.h>

#include "apps/top.h"
#include "base/grow.h"
#include "kvrouter.h"

/* ---- the link: GETs with the key ------------------------------------------------------------ */


/* GET path into l->resp (any status): KVR_OK, or KVR_EIO with why. The answer is read whole
 * (Connection: close) within timeout_ms. */
static int link_get(top_link_t *l, const char *path, char *why, size_t why_len)
{
    char err[200];
    int rc = kvr_http_get(&l->target, path, l->timeout_ms, TOP_MAX_BODY, &l->resp, err,
                          sizeof err);
    if (rc != KVR_OK) {
        snprintf(why, why_len, "GET %s: %s", path, err);
        return KVR_EIO;
    }
    if (l->resp.truncated) {
        snprintf(why, why_len, "GET %s: the answer is larger than %zu bytes", path, TOP_MAX_BODY);
        return KVR_EIO;
    }
    return KVR_OK;
}

/* ---- reading answers (yajl's tree) ---------------------------------------------------------- */

/* Printable ASCII of s into out[cap]: controls and non-ASCII become '?', so nothing a router
 * sends can move the cursor or change the terminal. */
static void sanitize(const char *s, char *out, size_t cap)
{
    size_t i = 0;
    for (; s != NULL && s[i] != '\0' && i + 1 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        out[i] = ch < 0x20 || ch >= 0x7f ? '?' : (char)ch;
    }
    out[i] = '\0';
}

static yajl_val jget(yajl_val obj, const char *key)
{
    const char *path[] = {key, NULL};
    return YAJL_IS_OBJECT(obj) ? yajl_tree_get(obj, path, yajl_t_any) : NULL;
}

/* A member's number; NAN when absent, null or not a number. */
static double jnum(yajl_val obj, const char *key)
{
    yajl_val v = jget(obj, key);
    return YAJL_IS_DOUBLE(v) ? YAJL_GET_DOUBLE(v) : NAN;
}

/* A member's string (or a number's text, for ids), sanitized; "" when absent. */
static void jstr(yajl_val obj, const char *key, char *out, size_t cap)
{
    yajl_val v = jget(obj, key);
    sanitize(YAJL_IS_STRING(v)   ? YAJL_GET_STRING(v)
             : YAJL_IS_NUMBER(v) ? YAJL_GET_NUMBER(v)
                                 : "",
             out, cap);
}

/* The array member key of an answer, or NULL with why. */
static yajl_val jarray(yajl_val root, const char *key, char *why, size_t why_len)
{
    yajl_val v = jget(root, key);
    if (YAJL_IS_ARRAY(v))
        return v;
    snprintf(why, why_len, "the answer has no \"%s\" array", key);
    return NULL;
}

/* The answer's body as a tree (NULL with why when it is not JSON). */
static yajl_val parse_body(const kvr_http_resp_t *r, char *why, size_t why_len)
{
    char perr[200] = "";
    yajl_val root = yajl_tree_parse(r->buf + r->body_at, perr, sizeof perr);
    if (root == NULL) {
        char clean[200];
        sanitize(perr, clean, sizeof clean);
        snprintf(why, why_len, "the answer is not JSON: %s", clean);
    }
    return root;
}

/* One rank of a worker of /v1/workers. */
static void decode_rank(yajl_val w, yajl_val rk, top_rank_t *r)
{
    memset(r, 0, sizeof *r);
    jstr(w, "worker_id", r->worker, sizeof r->worker);
    jstr(w, "role", r->role, sizeof r->role);
    jstr(w, "model", r->model, sizeof r->model);
    jstr(rk, "state", r->state, sizeof r->state);
    jstr(rk, "state_why", r->why, sizeof r->why);
    r->capacity = jnum(w, "total_kv_blocks");
    r->dp_rank = jnum(rk, "dp_rank");
    r->active = jnum(rk, "active_requests");
    r->prefill_tokens = jnum(rk, "active_prefill_tokens");
    r->blocks = jnum(rk, "active_blocks");
    r->indexed = jnum(rk, "index_blocks");
    r->step_ms = jnum(rk, "step_ms");
    yajl_val p = jget(rk, "prediction");
    r->prompt_tokens = jnum(p, "prompt_tokens");
    r->predicted = jnum(p, "predicted_cached_tokens");
    r->reported = jnum(p, "reported_cached_tokens");
}

/* /v1/workers into f (replacing what it held). */
static int decode_workers(void *into, yajl_val root, char *why, size_t why_len)
{
    top_fleet_t *f = into;
    yajl_val ws = jarray(root, "workers", why, why_len);
    if (ws == NULL)
        return KVR_EPARSE;
    jstr(root, "router_mode", f->mode, sizeof f->mode);
    jstr(root, "policy", f->policy, sizeof f->policy);
    f->n_ranks = 0;
    f->n_workers = YAJL_GET_ARRAY(ws)->len;
    for (size_t i = 0; i < f->n_workers; i++) {
        yajl_val w = YAJL_GET_ARRAY(ws)->values[i];
        yajl_val rs = jget(w, "ranks");
        size_t n = YAJL_IS_ARRAY(rs) ? YAJL_GET_ARRAY(rs)->len : 0;
        if (kvr_grow((void **)&f->ranks, &f->cap_ranks, f->n_ranks + n, TOP_MAX_RANKS,
                     sizeof *f->ranks) != KVR_OK) {
            snprintf(why, why_len, "the fleet holds more than %zu ranks", TOP_MAX_RANKS);
            return KVR_ENOMEM;
        }
        for (size_t k = 0; k < n; k++)
            decode_rank(w, YAJL_GET_ARRAY(rs)->values[k], &f->ranks[f->n_ranks++]);
    }
    return KVR_OK;
}

/* The members of a point (and of its "replicas" object) and where they go. */
static const struct {
    const char *key;
    int at;
    bool replicas;
} POINT_FIELDS[] = {
    {"t", P_T, false},
    {"decisions_per_s", P_DECISIONS, false},
    {"refusals_per_s", P_REFUSALS, false},
    {"in_flight", P_IN_FLIGHT, false},
    {"queue_pending", P_QUEUE, false},
    {"hit_ratio_predicted", P_HIT_PRED, false},
    {"hit_ratio_reported", P_HIT_REP, false},
    {"ttft_p50_ms", P_TTFT50, false},
    {"ttft_p99_ms", P_TTFT99, false},
    {"itl_p50_ms", P_ITL50, false},
    {"itl_p99_ms", P_ITL99, false},
    {"errors_per_s", P_ERRORS, false},
    {"kv_events_per_s", P_KV_EVENTS, false},
    {"kv_gaps", P_GAPS, false},
    {"peers", P_PEERS, true},
    {"sync_lag_p50_ms", P_LAG50, true},
    {"sync_lag_p99_ms", P_LAG99, true},
};

static void decode_point(yajl_val p, top_point_t *pt)
{
    yajl_val rep = jget(p, "replicas");
    for (size_t i = 0; i < sizeof POINT_FIELDS / sizeof POINT_FIELDS[0]; i++)
        pt->v[POINT_FIELDS[i].at] = jnum(POINT_FIELDS[i].replicas ? rep : p, POINT_FIELDS[i].key);
}

/* Appends pt, keeping the newest TOP_HIST. */
static void history_push(top_history_t *h, const top_point_t *pt)
{
    if (h->n == TOP_HIST) {
        memmove(h->pts, h->pts + 1, (TOP_HIST - 1) * sizeof h->pts[0]);
        h->n--;
    }
    h->pts[h->n++] = *pt;
}

/* Whether two start times name the same router process (an unknown one matches any). */
static bool same_start(double a, double b) { return !isfinite(a) || !isfinite(b) || a == b; }

/* /v1/stats into h: the points newer than those held (all of them after a restart). */
static int decode_stats(void *into, yajl_val root, char *why, size_t why_len)
{
    top_history_t *h = into;
    yajl_val pts = jarray(root, "points", why, why_len);
    if (pts == NULL)
        return KVR_EPARSE;
    double started = jnum(root, "started_ms");
    if (h->served && !same_start(started, h->started_ms)) /* another process: its history */
        h->n = 0;
    h->served = true;
    h->started_ms = started;
    h->now_ms = jnum(root, "now_ms");
    jstr(root, "version", h->version, sizeof h->version);
    for (size_t i = 0; i < YAJL_GET_ARRAY(pts)->len; i++) {
        top_point_t pt;
        decode_point(YAJL_GET_ARRAY(pts)->values[i], &pt);
        if (isfinite(pt.v[P_T]) && (h->n == 0 || pt.v[P_T] > h->pts[h->n - 1].v[P_T]))
            history_push(h, &pt);
    }
    return KVR_OK;
}

static int decode_routers(void *into, yajl_val root, char *why, size_t why_len)
{
    top_replicas_t *r = into;
    yajl_val rs = jarray(root, "routers", why, why_len);
    if (rs == NULL)
        return KVR_EPARSE;
    jstr(root, "self", r->self, sizeof r->self);
    jstr(root, "nats", r->nats, sizeof r->nats);
    r->peers = YAJL_GET_ARRAY(rs)->len;
    r->lag_max_ms = NAN;
    for (size_t i = 0; i < r->peers; i++) {
        double lag = jnum(YAJL_GET_ARRAY(rs)->values[i], "sync_lag_ms");
        if (isfinite(lag) && !(lag <= r->lag_max_ms))
            r->lag_max_ms = lag;
    }
    return KVR_OK;
}

/* ---- one refresh ---------------------------------------------------------------------------- */


typedef int (*top_decode_fn)(void *into, yajl_val root, char *why, size_t why_len);

/* Records a failure of GET path (status 0: no answer), with the router's own error message
 * when its answer carries one. */
static void fail(top_t *t, const char *path, const char *why)
{
    top_problem_t *p = &t->problem;
    p->failed = true;
    p->status = t->link.resp.status;
    snprintf(p->path, sizeof p->path, "%s", path);
    snprintf(p->why, sizeof p->why, "%s", why);
}

/* The router's error message of a non-200 answer ({"error": {"message": ...}}), or "". */
static void error_message(const kvr_http_resp_t *r, char *out, size_t cap)
{
    char ignored[8];
    out[0] = '\0';
    yajl_val root = r->body_at != 0 ? parse_body(r, ignored, sizeof ignored) : NULL;
    jstr(jget(root, "error"), "message", out, cap);
    yajl_tree_free(root);
}

/* GET path and decode a 200 answer into `into`. 1: decoded; 0: another status (not recorded
 * when it is `quiet`, e.g. a 404 of an optional endpoint); -1: failed (recorded). */
static int fetch(top_t *t, const char *path, int quiet, top_decode_fn decode, void *into)
{
    char why[300];
    if (link_get(&t->link, path, why, sizeof why) != KVR_OK) {
        t->link.resp.status = 0;
        fail(t, path, why);
        return -1;
    }
    int st = t->link.resp.status;
    if (st != 200) {
        if (st == quiet)
            return 0;
        error_message(&t->link.resp, why, sizeof why);
        fail(t, path, why);
        return -1;
    }
    yajl_val root = parse_body(&t->link.resp, why, sizeof why);
    int rc = root != NULL ? decode(into, root, why, sizeof why) : KVR_EPARSE;
    yajl_tree_free(root);
    if (rc != KVR_OK) {
        fail(t, path, why);
        return -1;
    }
    return 1;
}

/* One refresh: workers, stats since the newest point held, routers when they answer. False
 * (t->problem says why) when the router could not be read. */
bool top_refresh(top_t *t)
{
    memset(&t->problem, 0, sizeof t->problem);
    if (fetch(t, "/v1/workers", -1, decode_workers, &t->fleet) != 1)
        return false;
    char path[64] = "/v1/stats";
    if (t->hist.n > 0)
        snprintf(path, sizeof path, "/v1/stats?since=%.0f", t->hist.pts[t->hist.n - 1].v[P_T]);
    double started = t->hist.started_ms;
    if (fetch(t, path, 404, decode_stats, &t->hist) < 0)
        return false;
    if (t->hist.served && !same_start(started, t->hist.started_ms))
        t->reps.asked = ROUTERS_ASK; /* a restarted router may have NATS now */
    if (t->reps.asked != ROUTERS_NO) {
        int rc = fetch(t, "/v1/routers", 404, decode_routers, &t->reps);
        if (rc < 0)
            return false;
        t->reps.asked = rc == 1 ? ROUTERS_YES : ROUTERS_NO;
    }
    t->last_ok = time(NULL);
    return true;
}

void top_model_free(top_t *t)
{
    kvr_http_resp_free(&t->link.resp);
    free(t->fleet.ranks);
    t->fleet.ranks = NULL;
}
