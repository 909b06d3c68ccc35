/*
 * health.c: the workers' health (see fleet.h). Every health_interval_ms each
 * live worker with a url gets GET /health; health_failures failures in a row (or one, after
 * other evidence: kvr_fleet_suspect) fence it (never picked, its index state dropped),
 * and a 200 readmits it and re-runs the scheduler's queue. The ingest thread's per-rank status
 * is copied into the router on the tick (and on GET /v1/workers), and ranks whose KV events
 * never came are warned about (rate-limited). Threads: the HTTP thread.
 * A worker registered without its KV-cache size (num_blocks= / total_kv_blocks) gets, after a
 * healthy probe, GET /metrics on the same connection: vLLM's cache_config_info or SGLang's
 * pool gauge gives it (wire/engine_capacity.h), in the worker's blocks; CAP_TRIES answers
 * without one and the router stops asking. Every outcome is counted
 * (kvr_worker_capacity_fetches_total) and a failure logged, rate-limited.
 * Cost: one small HTTP request per worker per interval, and one /metrics read per worker.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/http.h>

#include <event2/buffer.h>

#include "core/endpoint.h"
#include "fleet/fleet_int.h"
#include "base/log.h"
#include "wire/engine_capacity.h"

#define CAP_TRIES 3
#define CAP_MAX_BYTES ((size_t)8 << 20) /* an engine's whole exposition text */
#define PROBE_MAX_BYTES ((size_t)64 << 10) /* a /health answer (vLLM's is empty) */
#define PROBE_MAX_HEADER_BYTES 16384       /* an answer's status line and headers */

void fleet_add_probe(kvr_fleet_t *s, uint64_t worker_id)
{
    if (s->n_all == KVR_FLEET_MAX_PROBES)
        return;
    probe_t *pr = calloc(1, sizeof *pr);
    if (pr == NULL)
        return;
    pr->f = s;
    pr->worker_id = worker_id;
    /* keep live probes first: the first dead one moves to the end */
    s->probes[s->n_all++] = s->probes[s->n_probes];
    s->probes[s->n_probes++] = pr;
}

void fleet_free_probes(kvr_fleet_t *s)
{
    for (size_t i = 0; s->probes != NULL && i < s->n_all; i++) {
        if (s->probes[i]->conn != NULL)
            evhttp_connection_free(s->probes[i]->conn);
        if (s->probes[i]->cap_conn != NULL)
            evhttp_connection_free(s->probes[i]->cap_conn);
        free(s->probes[i]);
    }
    free(s->probes);
    s->probes = NULL;
    s->n_all = s->n_probes = 0;
}

void fleet_remove_probe(kvr_fleet_t *s, uint64_t id)
{
    for (size_t i = 0; i < s->n_probes; i++) {
        probe_t *pr = s->probes[i];
        if (pr->worker_id != id)
            continue;
        if (pr->conn != NULL)
            evhttp_connection_free(pr->conn); /* cancels an in-flight probe */
        pr->conn = NULL;
        if (pr->cap_conn != NULL)
            evhttp_connection_free(pr->cap_conn);
        pr->cap_conn = NULL;
        pr->dead = true;
        /* move it past the live ones */
        s->probes[i] = s->probes[s->n_probes - 1];
        s->probes[--s->n_probes] = pr;
        return;
    }
}

/* A probe's outcome: ok, or why not (for the log line that fences the worker). */
static void probe_result(probe_t *pr, bool ok, const char *why_not)
{
    kvr_fleet_t *s = pr->f;
    bool fenced = kvr_router_fenced(s->r, pr->worker_id);
    if (ok) {
        pr->failures = 0;
        if (fenced) {
            kvr_router_set_fenced(s->r, pr->worker_id, false);
            kvr_log(KVR_LOG_INFO, "worker %llu healthy again: readmitted",
                    (unsigned long long)pr->worker_id);
            kvr_sched_dispatch(s->sched, kvr_now_ms(), KVR_SCHED_BY_EVENT);
        }
        return;
    }
    pr->failures++;
    if (!fenced && pr->suspect[0] != '\0') {
        char why[160];
        snprintf(why, sizeof why, "%s and its /health failed", pr->suspect);
        kvr_fleet_fence(s, pr->worker_id, why);
    } else if (!fenced && pr->failures >= s->cfg.health_failures) {
        char why[160];
        snprintf(why, sizeof why, "failed %u health checks in a row (last: %s)", pr->failures,
                 why_not);
        kvr_fleet_fence(s, pr->worker_id, why);
    }
}

enum { CAP_LEARNT, CAP_NONE, CAP_FAILED };

static void cap_outcome(probe_t *pr, int outcome, const char *why)
{
    kvr_fleet_t *s = pr->f;
    s->cap_fetches[outcome]++;
    if (outcome == CAP_LEARNT)
        return;
    if (++pr->cap_tries == CAP_TRIES)
        kvr_log_limited(&s->rl_cap, KVR_LOG_WARN,
                        "worker %llu: no KV-cache size from its /metrics after %d tries (%s); "
                        "approximate mode keeps only a TTL for it: give num_blocks= on "
                        "--worker or total_kv_blocks in POST /v1/workers",
                        (unsigned long long)pr->worker_id, CAP_TRIES, why);
    else
        kvr_log_limited(&s->rl_cap, KVR_LOG_WARN, "worker %llu: KV-cache size from /metrics: %s",
                        (unsigned long long)pr->worker_id, why);
}

static void on_cap_done(struct evhttp_request *req, void *arg)
{
    probe_t *pr = arg;
    pr->cap_in_flight = false;
    if (pr->dead)
        return;
    kvr_fleet_t *s = pr->f;
    const kvr_worker_spec_t *sp = kvr_router_worker(s->r, pr->worker_id);
    if (sp == NULL || sp->total_kv_blocks != 0)
        return; /* gone, or given meanwhile */
    int code = req ? evhttp_request_get_response_code(req) : 0;
    struct evbuffer *in = req ? evhttp_request_get_input_buffer(req) : NULL;
    size_t len = in ? evbuffer_get_length(in) : 0;
    if (code != 200 || len > CAP_MAX_BYTES) {
        char why[64];
        if (code != 200)
            snprintf(why, sizeof why, "GET /metrics answered %d", code);
        else
            snprintf(why, sizeof why, "an answer over %zu bytes", CAP_MAX_BYTES);
        cap_outcome(pr, CAP_FAILED, why);
        return;
    }
    const char *text = len ? (const char *)evbuffer_pullup(in, (ev_ssize_t)len) : "";
    uint32_t bs = sp->block_size ? sp->block_size : s->cfg.block_size;
    kvr_engine_capacity_t c;
    char err[160];
    int rc = kvr_engine_capacity_parse(text, len, bs, &c, err, sizeof err);
    if (rc == KVR_OK)
        rc = kvr_router_set_capacity(s->r, pr->worker_id, c.blocks);
    if (rc != KVR_OK) {
        cap_outcome(pr, rc == KVR_ENOTFOUND ? CAP_NONE : CAP_FAILED,
                    rc == KVR_ENOMEM ? "out of memory" : err);
        return;
    }
    cap_outcome(pr, CAP_LEARNT, NULL);
    kvr_log(KVR_LOG_INFO, "worker %llu: KV cache of %llu blocks of %u tokens (from %s)",
            (unsigned long long)pr->worker_id, (unsigned long long)c.blocks, bs,
            c.source == KVR_CAPACITY_VLLM ? "vllm:cache_config_info"
                                          : "sglang:max_total_num_tokens");
}

/* One GET to a worker: on its connection (made on first use, with its timeout), the path
 * under the worker's base path, in_flight set while it is out. */
typedef struct get {
    struct evhttp_connection **conn;
    const kvr_url_t *u;
    int timeout_s;
    const char *suffix; /* "/health", "/metrics" */
    size_t max_bytes;   /* the answer's body at most: a longer one fails the probe unread */
    void (*done)(struct evhttp_request *, void *);
    bool *in_flight;
} get_t;

/* KVR_OK: sent; KVR_ENOMEM: no connection or request could be made (nothing sent, retried at
 * the next probe); KVR_EIO: libevent refused to send it. */
static int send_get(kvr_fleet_t *s, const get_t *g, void *arg)
{
    if (*g->conn == NULL) {
        *g->conn = evhttp_connection_base_new(s->base, NULL, g->u->host, g->u->port);
        if (*g->conn == NULL)
            return KVR_ENOMEM;
        evhttp_connection_set_timeout(*g->conn, g->timeout_s);
        evhttp_connection_set_max_headers_size(*g->conn, PROBE_MAX_HEADER_BYTES);
        evhttp_connection_set_max_body_size(*g->conn, (ev_ssize_t)g->max_bytes);
    }
    struct evhttp_request *req = evhttp_request_new(g->done, arg);
    if (req == NULL)
        return KVR_ENOMEM;
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", g->u->host_hdr);
    char path[sizeof g->u->base_path + 16];
    snprintf(path, sizeof path, "%s%s", g->u->base_path, g->suffix);
    *g->in_flight = true;
    if (evhttp_make_request(*g->conn, req, EVHTTP_REQ_GET, path) != 0) {
        *g->in_flight = false;
        return KVR_EIO;
    }
    return KVR_OK;
}

/* After a healthy probe: GET /metrics if the worker's cache size is still unknown. */
static void cap_fetch(probe_t *pr)
{
    kvr_fleet_t *s = pr->f;
    const kvr_worker_spec_t *sp = kvr_router_worker(s->r, pr->worker_id);
    kvr_url_t u;
    if (sp == NULL || sp->total_kv_blocks != 0 || pr->cap_in_flight || pr->cap_tries >= CAP_TRIES ||
        kvr_endpoint_parse_url(sp->url, NULL, &u, NULL, 0) != KVR_OK)
        return;
    get_t g = {&pr->cap_conn, &u, 5, "/metrics", CAP_MAX_BYTES, on_cap_done,
               &pr->cap_in_flight};
    if (send_get(s, &g, pr) == KVR_EIO)
        cap_outcome(pr, CAP_FAILED, "the request could not be sent");
}

static void on_probe_done(struct evhttp_request *req, void *arg)
{
    probe_t *pr = arg;
    pr->in_flight = false;
    if (pr->dead)
        return;
    int code = req ? evhttp_request_get_response_code(req) : 0;
    char why[64];
    if (code == 0)
        snprintf(why, sizeof why, "no answer: refused, reset or timed out");
    else
        snprintf(why, sizeof why, "/health answered HTTP %d", code);
    probe_result(pr, code == 200, why);
    pr->suspect[0] = '\0';
    if (code == 200)
        cap_fetch(pr);
}

static void probe_one(probe_t *pr)
{
    kvr_fleet_t *s = pr->f;
    const kvr_worker_spec_t *sp = kvr_router_worker(s->r, pr->worker_id);
    if (sp == NULL || sp->url[0] == '\0' || pr->in_flight)
        return;
    kvr_url_t u;
    if (kvr_endpoint_parse_url(sp->url, NULL, &u, NULL, 0) != KVR_OK) {
        probe_result(pr, false, "its url does not parse");
        return;
    }
    int secs = (int)(s->cfg.health_interval_ms / 1000);
    get_t g = {&pr->conn, &u, secs > 0 ? secs : 1, "/health", PROBE_MAX_BYTES, on_probe_done,
               &pr->in_flight};
    if (send_get(s, &g, pr) == KVR_EIO)
        probe_result(pr, false, "the request could not be sent");
}

void kvr_fleet_suspect(kvr_fleet_t *s, uint64_t worker_id, const char *why)
{
    if (kvr_router_fenced(s->r, worker_id))
        return;
    for (size_t i = 0; i < s->n_probes; i++) {
        probe_t *pr = s->probes[i];
        if (pr->worker_id != worker_id || pr->suspect[0] != '\0')
            continue;
        snprintf(pr->suspect, sizeof pr->suspect, "%s", why);
        if (pr->in_flight)
            return; /* the probe on its way decides */
        probe_one(pr);
        if (!pr->in_flight)
            pr->suspect[0] = '\0';
        return;
    }
}

void fleet_probe_all(kvr_fleet_t *s)
{
    for (size_t i = 0; i < s->n_probes; i++)
        probe_one(s->probes[i]);
}

/* ---------------------------------------------------------------------------------------- */
/* Periodic work */

void kvr_fleet_sync(kvr_fleet_t *s)
{
    if (s->g == NULL)
        return;
    uint64_t ids[4096];
    size_t n = kvr_router_worker_ids(s->r, ids, 4096);
    for (size_t i = 0; i < n && i < 4096; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(s->r, ids[i]);
        for (uint32_t d = 0; sp != NULL && d < sp->dp_size; d++) {
            kvr_worker_t wk = {sp->worker_id, sp->dp_start + d};
            kvr_rank_status_t st, old = {0};
            if (kvr_ingest_rank_status(s->g, wk, &st) != KVR_OK)
                continue;
            (void)kvr_router_rank_status(s->r, wk, &old);
            (void)kvr_router_set_rank_status(s->r, wk, &st);
            if (st.disconnects > old.disconnects && st.state == KVR_RANK_UNREACHABLE)
                kvr_fleet_suspect(s, wk.worker_id, "lost its events connection");
        }
    }
}

/* A rank with an events endpoint that has sent nothing although the router has been routing
 * for SILENT_WARN_MS is most likely misconfigured: both sides connecting (vLLM and the mocker
 * bind only endpoints with a '*' or "::" host), a wrong port, or events off on the engine.
 * Its state already says no_events (/v1/workers, /metrics); this says it in the log, since a
 * KV router whose index stays empty still routes, on load alone. */
#define SILENT_WARN_MS 30000u
void fleet_warn_silent_ranks(kvr_fleet_t *s, uint64_t now)
{
    if (s->g == NULL || now - s->last_silent_check_ms < 10000)
        return;
    s->last_silent_check_ms = now;
    kvr_router_stats_t rs;
    kvr_router_stats(s->r, &rs);
    if (rs.routed == 0)
        return;
    if (s->first_routed_ms == 0)
        s->first_routed_ms = now;
    if (now - s->first_routed_ms < SILENT_WARN_MS)
        return;
    uint64_t ids[4096];
    size_t n = kvr_router_worker_ids(s->r, ids, 4096);
    for (size_t i = 0; i < n && i < 4096; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(s->r, ids[i]);
        for (uint32_t d = 0; sp != NULL && sp->events[0] != '\0' && d < sp->dp_size; d++) {
            kvr_worker_t wk = {sp->worker_id, sp->dp_start + d};
            kvr_rank_status_t st;
            if (kvr_router_rank_status(s->r, wk, &st) == KVR_OK && st.state == KVR_RANK_NO_EVENTS)
                kvr_log_limited(&s->rl_silent, KVR_LOG_WARN,
                                "worker %llu rank %u: no KV events from %s after %llu s of "
                                "routing; its overlap is always 0. Does the engine publish "
                                "(kv-events-config), and does exactly one side bind (an engine "
                                "binds only an endpoint with a '*' host)?",
                                (unsigned long long)wk.worker_id, wk.dp_rank, sp->events,
                                (unsigned long long)((now - s->first_routed_ms) / 1000));
        }
    }
}

const probe_t *fleet_probe(const kvr_fleet_t *s, uint64_t worker_id)
{
    for (size_t i = 0; i < s->n_probes; i++)
        if (s->probes[i]->worker_id == worker_id)
            return s->probes[i];
    return NULL;
}

void kvr_fleet_fence(kvr_fleet_t *s, uint64_t worker_id, const char *why)
{
    if (kvr_router_worker(s->r, worker_id) == NULL || kvr_router_fenced(s->r, worker_id))
        return;
    kvr_router_set_fenced(s->r, worker_id, true);
    probe_t *pr = (probe_t *)fleet_probe(s, worker_id);
    if (pr != NULL)
        snprintf(pr->fence_why, sizeof pr->fence_why, "%s", why);
    if (s->g != NULL)
        (void)kvr_ingest_drop_state(s->g, worker_id);
    kvr_log(KVR_LOG_WARN,
            "worker %llu %s: fenced, index state dropped (readmitted when its "
            "/health answers)",
            (unsigned long long)worker_id, why);
}
