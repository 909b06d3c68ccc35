/*
 * ui.c: the live view's service (see ui.h): the sampler's timer, GET /ui, GET /v1/stats.
 * Invariants: the history only grows by the timer (one reading a second, ui_history.h); a
 * reply is written whole from the history, nothing else.
 * Ownership: owns its history (one allocation) and its exposition buffer (reused).
 * Threads: the loop's. Cost: a sample is one exposition text and one pass over it (measured
 * by kvr_ui_sample_seconds_total); a full /v1/stats answer is ~300 bytes a point.
 */
#include "ui/ui.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "base/clock.h"
#include "base/log.h"
#include "kvrouter.h"
#include "ui/ui_history.h"
#include "ui/ui_reading.h"
#include "wire/json_writer.h"
#include "wire/prom.h"

#define SAMPLE_MS 1000

/* The page, compiled in from src/ui/page.html (CMakeLists.txt writes ui_page_data.c). */
extern const unsigned char kvr_ui_page[];
extern const size_t kvr_ui_page_len;

struct kvr_ui {
    kvr_http_host_t *host;
    kvr_fleet_t *fleet;
    kvr_reply_t *rep;
    kvr_router_config_t cfg;
    struct event *tick;
    kvr_prom_t text;         /* the exposition, reused */
    kvr_ui_history_t *hist;
    uint64_t started_ms;     /* unix ms */
    uint64_t last_t_ms;      /* the last reading's t */
    uint64_t samples;
    double sample_seconds;   /* spent sampling, in total */
    kvr_ratelimit_t rl_skip; /* malformed exposition lines (a bug if ever) */
};

static uint64_t wall_ms(void) { return kvr_wall_ns() / 1000000u; }

/* ---------------------------------------------------------------------------------------- */
/* The sampler */

static void sample(kvr_ui_t *u)
{
    double t0 = kvr_now_s();
    kvr_prom_reset(&u->text);
    kvr_http_host_exposition(u->host, &u->text);
    /* a point's t is wall time (shown to people, and the `since` of pollers), kept rising
     * when the wall clock steps back, so the history never stalls and no poller misses a
     * point */
    uint64_t t = wall_ms();
    if (u->hist->n_readings > 0 && t <= u->last_t_ms)
        t = u->last_t_ms + 1;
    u->last_t_ms = t;
    kvr_ui_reading_t r;
    kvr_ui_reading_parse(u->text.buf, u->text.len, t, &r);
    if (r.skipped > 0)
        kvr_log_limited(&u->rl_skip, KVR_LOG_WARN,
                        "live view: %zu lines of the router's own /metrics text did not parse",
                        r.skipped);
    (void)kvr_ui_history_add(u->hist, &r); /* t always later: never false here */
    u->samples++;
    u->sample_seconds += kvr_now_s() - t0;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sample(arg);
}

/* ---------------------------------------------------------------------------------------- */
/* GET /v1/stats */

/* A figure, or null when it cannot be known (NaN). */
static void num(kvr_json_writer_t *w, const char *key, double v)
{
    kvr_json_key(w, key);
    if (isfinite(v))
        kvr_json_double(w, v);
    else
        kvr_json_null(w);
}

static void write_pools(kvr_json_writer_t *w, const kvr_ui_point_t *p)
{
    static const char *const names[KVR_UI_POOLS] = {"prefill", "decode"};
    kvr_json_key(w, "pools");
    kvr_json_begin_object(w);
    for (int k = 0; k < KVR_UI_POOLS; k++) {
        if (!p->pool_seen[k])
            continue;
        kvr_json_key(w, names[k]);
        kvr_json_begin_object(w);
        num(w, "decisions_per_s", p->pool_decisions_per_s[k]);
        num(w, "hit_ratio_predicted", p->pool_hit_predicted[k]);
        kvr_json_end_object(w);
    }
    kvr_json_end_object(w);
}

static void write_replicas(kvr_json_writer_t *w, const kvr_ui_point_t *p)
{
    kvr_json_key(w, "replicas");
    if (!p->has_replicas) {
        kvr_json_null(w);
        return;
    }
    kvr_json_begin_object(w);
    num(w, "peers", p->peers);
    num(w, "sync_lag_p50_ms", p->sync_lag_p50_ms);
    num(w, "sync_lag_p99_ms", p->sync_lag_p99_ms);
    num(w, "sync_events_per_s", p->sync_events_per_s);
    num(w, "sync_lost", p->sync_lost);
    kvr_json_end_object(w);
}

static void write_point(kvr_json_writer_t *w, const kvr_ui_point_t *p)
{
    kvr_json_begin_object(w);
    kvr_json_key(w, "t");
    kvr_json_u64(w, p->t_ms);
    num(w, "decisions_per_s", p->decisions_per_s);
    num(w, "refusals_per_s", p->refusals_per_s);
    num(w, "in_flight", p->in_flight);
    num(w, "queue_pending", p->queue_pending);
    num(w, "hit_ratio_predicted", p->hit_predicted);
    num(w, "hit_ratio_reported", p->hit_reported);
    num(w, "ttft_p50_ms", p->ttft_p50_ms);
    num(w, "ttft_p99_ms", p->ttft_p99_ms);
    num(w, "itl_p50_ms", p->itl_p50_ms);
    num(w, "itl_p99_ms", p->itl_p99_ms);
    num(w, "errors_per_s", p->errors_per_s);
    num(w, "kv_events_per_s", p->kv_events_per_s);
    num(w, "kv_gaps", p->kv_gaps);
    write_pools(w, p);
    write_replicas(w, p);
    kvr_json_end_object(w);
}

static void write_router(kvr_ui_t *u, kvr_json_writer_t *w)
{
    kvr_router_t *r = kvr_fleet_router(u->fleet);
    uint64_t ids[4096];
    size_t n = kvr_router_worker_ids(r, ids, 4096), ranks = 0;
    for (size_t i = 0; i < n && i < 4096; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(r, ids[i]);
        ranks += sp != NULL ? sp->dp_size : 0;
    }
    kvr_json_key(w, "router");
    kvr_json_begin_object(w);
    kvr_json_key(w, "mode");
    kvr_json_string(w, kvr_config_mode_name(&u->cfg));
    kvr_json_key(w, "policy");
    kvr_json_string(w, kvr_config_policy_name(&u->cfg));
    kvr_json_key(w, "block_size");
    kvr_json_u64(w, u->cfg.block_size);
    kvr_json_key(w, "workers");
    kvr_json_u64(w, n);
    kvr_json_key(w, "ranks");
    kvr_json_u64(w, ranks);
    kvr_json_end_object(w);
}

/* ?since=T: T unix ms; false (with the reply sent) when malformed. */
static bool parse_since(kvr_ui_t *u, struct evhttp_request *req, uint64_t *since)
{
    *since = 0;
    const char *q = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
    if (q == NULL)
        return true;
    struct evkeyvalq kv;
    if (evhttp_parse_query_str(q, &kv) != 0) {
        kvr_reply_error(u->rep, req, 400, "invalid_request_error", "query: not a query string");
        return false;
    }
    const char *v = evhttp_find_header(&kv, "since");
    bool ok = true;
    if (v != NULL) {
        char *end;
        errno = 0;
        unsigned long long t = strtoull(v, &end, 10);
        ok = *v >= '0' && *v <= '9' && *end == '\0' && errno == 0;
        *since = ok ? (uint64_t)t : 0;
    }
    evhttp_clear_headers(&kv);
    if (!ok)
        kvr_reply_error(u->rep, req, 400, "invalid_request_error",
                        "since: not a time in unix milliseconds (a point's t)");
    return ok;
}

static void h_stats(kvr_ui_t *u, struct evhttp_request *req)
{
    uint64_t since;
    if (!parse_since(u, req, &since))
        return;
    kvr_json_writer_t *w = u->rep->w;
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    kvr_json_key(w, "version");
    kvr_json_string(w, KVR_VERSION_STRING);
    kvr_json_key(w, "now_ms");
    kvr_json_u64(w, wall_ms());
    kvr_json_key(w, "started_ms");
    kvr_json_u64(w, u->started_ms);
    kvr_json_key(w, "interval_ms");
    kvr_json_u64(w, SAMPLE_MS);
    kvr_json_key(w, "window_points");
    kvr_json_u64(w, KVR_UI_POINTS);
    kvr_json_key(w, "ratio_window_s");
    kvr_json_u64(w, KVR_UI_RATIO_S);
    write_router(u, w);
    kvr_json_key(w, "points");
    kvr_json_begin_array(w);
    for (size_t i = 0; i < u->hist->n_points; i++) {
        const kvr_ui_point_t *p = kvr_ui_history_point(u->hist, i);
        if (p->t_ms > since)
            write_point(w, p);
    }
    kvr_json_end_array(w);
    kvr_json_end_object(w);
    kvr_reply_writer(u->rep, req, 200);
}

/* ---------------------------------------------------------------------------------------- */
/* GET /ui */

static void h_page(kvr_ui_t *u, struct evhttp_request *req)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Cache-Control", "no-store");
    evhttp_add_header(h, "X-Content-Type-Options", "nosniff");
    evhttp_add_header(h, "Referrer-Policy", "no-referrer");
    evhttp_add_header(h, "Content-Security-Policy",
                      "default-src 'none'; script-src 'unsafe-inline'; style-src "
                      "'unsafe-inline'; connect-src 'self'; img-src data:; "
                      "frame-ancestors 'none'; base-uri 'none'; form-action 'none'");
    kvr_reply_body(u->rep, req, 200, "text/html; charset=utf-8", (const char *)kvr_ui_page,
                   kvr_ui_page_len);
}

/* ---------------------------------------------------------------------------------------- */
/* The service */

static bool handle(void *arg, struct evhttp_request *req, const char *path, bool get, bool post)
{
    (void)post;
    if (get && strcmp(path, "/ui") == 0)
        h_page(arg, req);
    else if (get && strcmp(path, "/v1/stats") == 0)
        h_stats(arg, req);
    else
        return false;
    return true;
}

static void metrics(void *arg, kvr_prom_t *p)
{
    kvr_ui_t *u = arg;
    kvr_prom_counter(p, "kvr_ui_samples_total",
                     "Readings of the router's own metrics taken for GET /v1/stats and /ui "
                     "(one a second).",
                     (double)u->samples);
    kvr_prom_counter(p, "kvr_ui_sample_seconds_total", "Time spent taking them, seconds.",
                     u->sample_seconds);
}

kvr_ui_t *kvr_ui_new(const kvr_ui_config_t *c, int *status, char *err, size_t err_len)
{
    kvr_ui_t *u = calloc(1, sizeof *u);
    kvr_ui_history_t *hist = calloc(1, sizeof *hist);
    struct event *tick = u != NULL ? event_new(c->loop, -1, EV_PERSIST, on_tick, u) : NULL;
    if (u == NULL || hist == NULL || tick == NULL) {
        if (tick != NULL)
            event_free(tick);
        free(hist);
        free(u);
        snprintf(err, err_len, "out of memory");
        *status = KVR_ENOMEM;
        return NULL;
    }
    u->host = c->host;
    u->fleet = c->fleet;
    u->rep = kvr_http_host_reply(c->host);
    u->cfg = *c->cfg;
    u->hist = hist;
    u->tick = tick;
    u->started_ms = wall_ms();
    u->rl_skip = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(60000, 1);
    kvr_prom_init(&u->text);
    kvr_ui_history_init(hist);
    kvr_http_service_t svc = {.handle = handle, .metrics = metrics, .arg = u};
    const struct timeval every = {SAMPLE_MS / 1000, (SAMPLE_MS % 1000) * 1000};
    if (kvr_http_host_add_service(c->host, &svc) != KVR_OK || event_add(tick, &every) != 0) {
        kvr_http_host_remove_service(c->host, u);
        event_free(tick);
        free(hist);
        free(u);
        snprintf(err, err_len, "the live view: could not add its service or timer");
        *status = KVR_EFULL;
        return NULL;
    }
    sample(u); /* the first reading: the first point comes a second later */
    return u;
}

void kvr_ui_free(kvr_ui_t *u)
{
    if (u == NULL)
        return;
    kvr_http_host_remove_service(u->host, u);
    event_free(u->tick);
    kvr_prom_deinit(&u->text);
    free(u->hist);
    free(u);
}
