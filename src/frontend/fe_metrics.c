/*
 * fe_metrics.c: the front end's /metrics families (fe_metrics.h): its counters, gauges and
 * histograms, then the per-model ones (fe_reqmetrics.c) and the planner's (fe_disagg.c).
 * Invariants: the family names and help texts are an interface (dashboards read them).
 * Ownership: nothing kept. Threads: the HTTP thread (the api server's /metrics). Cost: one
 * pass over the live requests (client backlogs) and the pools.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <yajl/yajl_tree.h>

#include "kvrouter/router.h"
#include "fleet/fleet.h"
#include "frontend/fe_disagg.h"
#include "frontend/fe_inproc.h"
#include "frontend/fe_metrics.h"
#include "frontend/fe_req.h"

const char *const UPK_NAMES[UPK_COUNT] = {"connect", "timeout",    "eof",      "protocol",
                                          "no_url",  "status_5xx", "too_large"};

/* ---------------------------------------------------------------------------------------- */
/* Metrics */

void fe_metrics(void *arg, struct kvr_prom *p)
{
    kvr_frontend_t *fe = arg;
    const fe_stats_t *s = &fe->st;
    kvr_prom_family(p, "kvr_frontend_requests_total", "counter",
                    "OpenAI front-end requests by endpoint.");
    static const char *const eps[] = {"completions", "chat", "models"};
    for (int i = 0; i < 3; i++) {
        kvr_prom_label_t l = {"endpoint", eps[i]};
        kvr_prom_sample(p, "kvr_frontend_requests_total", &l, 1, (double)s->requests[i]);
    }
    kvr_prom_family(p, "kvr_frontend_replies_total", "counter",
                    "Front-end answers by status class (stream: SSE streams ended).");
    const uint64_t *by = fe->rep.by_class;
    const double v[] = {(double)by[KVR_REPLY_2XX], (double)by[KVR_REPLY_3XX],
                        (double)by[KVR_REPLY_4XX], (double)by[KVR_REPLY_5XX],
                        (double)s->streams_ended,  (double)by[KVR_REPLY_OTHER]};
    static const char *const cls[] = {"2xx", "3xx", "4xx", "5xx", "stream", "other"};
    for (int i = 0; i < 6; i++) {
        kvr_prom_label_t l = {"class", cls[i]};
        kvr_prom_sample(p, "kvr_frontend_replies_total", &l, 1, v[i]);
    }
    kvr_prom_gauge(p, "kvr_frontend_in_flight", "Front-end requests not yet answered.",
                   (double)fe->n_live);
    kvr_prom_gauge(p, "kvr_frontend_workers_without_url",
                   "Registered workers without a url: never sent front-end requests.",
                   (double)fe->n_urlless);
    kvr_prom_counter(p, "kvr_frontend_workers_without_url_untracked_total",
                     "Workers without a url the front end had no room to track (out of memory, "
                     "or past 4096): it may pick them and fail.",
                     (double)fe->urlless_lost);
    kvr_prom_counter(p, "kvr_frontend_forwarded_total",
                     "Generation requests sent to workers (retries "
                     "included).",
                     (double)s->forwarded);
    kvr_prom_counter(p, "kvr_frontend_retries_total",
                     "Requests routed again after an upstream failed "
                     "before its first byte.",
                     (double)s->retries);
    kvr_prom_counter(p, "kvr_frontend_workers_fenced_total",
                     "Workers fenced for failing upstream "
                     "requests in a row.",
                     (double)s->fenced);
    kvr_prom_counter(p, "kvr_frontend_client_disconnects_total",
                     "Clients gone before their answer "
                     "ended (their upstream requests cancelled).",
                     (double)s->client_disconnects);
    kvr_prom_family(p, "kvr_frontend_upstream_errors_total", "counter",
                    "Upstream failures by kind.");
    for (int i = 0; i < UPK_COUNT; i++) {
        kvr_prom_label_t l = {"kind", UPK_NAMES[i]};
        kvr_prom_sample(p, "kvr_frontend_upstream_errors_total", &l, 1,
                        (double)s->upstream_errors[i]);
    }
    kvr_prom_counter(p, "kvr_frontend_slow_client_aborts_total",
                     "Streams aborted (as disconnects) because "
                     "the client left more than frontend_max_client_buffer_bytes unread.",
                     (double)s->slow_client_aborts);
    size_t backlog = 0;
    for (const fe_req_t *q = fe->live; q != NULL; q = q->next)
        backlog += q->client.reply_started ? fe_client_backlog(q) : 0;
    kvr_prom_gauge(p, "kvr_frontend_client_buffer_bytes",
                   "Streamed bytes waiting in clients' output "
                   "buffers.",
                   (double)backlog);
    kvr_prom_gauge(p, "kvr_frontend_max_client_buffer_bytes",
                   "The cap on one client's waiting bytes "
                   "(frontend_max_client_buffer_bytes).",
                   (double)fe->cfg.frontend_max_client_buffer_bytes);
    kvr_prom_counter(p, "kvr_frontend_stream_events_total", "SSE events relayed.",
                     (double)s->stream_events);
    kvr_prom_counter(p, "kvr_frontend_stream_tokens_total", "SSE events that carried a token.",
                     (double)s->stream_tokens);
    kvr_prom_counter(p, "kvr_frontend_sse_unframed_total",
                     "Upstream stream bytes forwarded without an "
                     "event boundary (stream end or over 1 MiB).",
                     (double)s->sse_raw);
    kvr_prom_counter(p, "kvr_frontend_kv_transfer_stripped_total",
                     "Requests whose client-set kv_transfer_params / bootstrap_* were stripped "
                     "(frontend_trust_kv_transfer off).",
                     (double)s->kvt_stripped);
    kvr_prom_counter(p, "kvr_frontend_inject_failed_total",
                     "Answers that could not carry nvext.worker_id "
                     "(not one valid JSON object: forwarded as they were).",
                     (double)s->inject_failed);
    kvr_prom_counter(p, "kvr_frontend_tokenize_calls_total", "POST /tokenize calls to workers.",
                     (double)s->tokenize_calls);
    fe_inproc_metrics(fe, p);
    kvr_prom_counter(p, "kvr_frontend_tokenize_cache_hits_total",
                     "Text prompts found in the cache.", (double)fe->cache.hits);
    kvr_prom_counter(p, "kvr_frontend_tokenize_cache_misses_total",
                     "Text prompts not in the cache.", (double)fe->cache.misses);
    kvr_prom_counter(p, "kvr_frontend_tokenize_cache_evictions_total", "Entries evicted (LRU).",
                     (double)fe->cache.evictions);
    kvr_prom_gauge(p, "kvr_frontend_tokenize_cache_entries", "Cached prompts.",
                   (double)fe->cache.n_entries);
    kvr_prom_gauge(p, "kvr_frontend_tokenize_cache_tokens", "Cached token ids.",
                   (double)fe->cache.tokens);
    kvr_prom_gauge(p, "kvr_frontend_tokenize_cache_max_tokens", "The cache's budget.",
                   (double)fe->cache.cap_tokens);
    kvr_prom_counter(p, "kvr_frontend_models_refreshes_total",
                     "GET /v1/models rounds to the workers.", (double)s->models_refreshes);
    size_t conns = 0, busy = 0;
    for (size_t i = 0; i < fe->n_pools; i++) {
        conns += fe->pools[i]->n_conns;
        busy += fe->pools[i]->n_busy;
    }
    kvr_prom_gauge(p, "kvr_frontend_upstream_connections", "Pooled upstream connections.",
                   (double)conns);
    kvr_prom_gauge(p, "kvr_frontend_upstream_connections_busy",
                   "Pooled upstream connections in use.", (double)busy);
    kvr_prom_family(p, "kvr_frontend_forward_delay_seconds", "histogram",
                    "Request received to request sent to the worker (first attempt), seconds.");
    kvr_prom_hist(p, "kvr_frontend_forward_delay_seconds", NULL, 0, &fe->h_forward);
    fe_reqm_metrics(fe, p);
    fe_disagg_metrics(fe, p);
}
