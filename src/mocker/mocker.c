/*
 * mocker.c: `kvrouter mocker`'s engine process (mocker.h): configuration, the lifecycle, the
 * request dispatch and the endpoints that are not requests to an engine (/v1/models, /health,
 * /metrics, /version, /debug/kv_blocks, /debug/kv_events_fault, /reset_prefix_cache).
 * The top of the mocker's files (mocker_state.h draws the chain): it calls mocker_admit.c for
 * generation and tokenization, mocker_kv.c for /kv/pull, mocker_rank.c for the ranks and
 * mocker_server.c for replies; nothing calls up into it.
 * Invariants: kvr_mocker_new either returns a mocker serving on its port(s) or frees all it
 * made; kvr_mocker_free frees the HTTP server first (its close callbacks free the requests)
 * and the ranks last. Ownership: see mocker.h. Threads: the loop thread only.
 * Cost: /metrics formats every family afresh per scrape (one buffer, reused).
 */
#include "mocker/mocker.h"

#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "base/clock.h"
#include "base/namelist.h"
#include "events/kv_publisher.h"
#include "http/http.h"
#include "kvrouter.h"
#include "mocker/mocker_admit.h"
#include "mocker/mocker_kv.h"
#include "mocker/mocker_rank.h"
#include "mocker/mocker_server.h"
#include "mocker/mocker_state.h"

#define MAX_BODY_BYTES ((size_t)256 << 20)
#define REPLAY_POLL_US 10000 /* backstop; requests are answered on arrival (on_replay_ready) */
#define SWEEP_US 50000
#define MOCKER_VERSION "kvrouter-mocker 0.1.0"

static const double TTFT_BOUNDS[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                     0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10.0, 20.0, 40.0};
static const double E2E_BOUNDS[] = {0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0,
                                    20.0, 30.0, 40.0, 50.0, 60.0, 120.0};
#define N_TTFT (sizeof TTFT_BOUNDS / sizeof TTFT_BOUNDS[0])
#define N_E2E (sizeof E2E_BOUNDS / sizeof E2E_BOUNDS[0])

/* ---- config ---------------------------------------------------------------------------- */

void kvr_mocker_config_default(kvr_mocker_config_t *c)
{
    memset(c, 0, sizeof *c);
    kvr_engine_config_default(&c->engine);
    snprintf(c->host, sizeof c->host, "0.0.0.0");
    c->port = 8000;
    snprintf(c->model, sizeof c->model, "kvrouter-mocker");
    c->dp_size = 1;
    c->speedup = 1.0;
    kvr_kv_events_config_default(&c->events);
    c->event_format = KVR_KV_FMT_VLLM_ARRAY;
    c->kv_bytes_per_block = (uint64_t)2 << 20;
    c->kv_transfer_gbps = 100.0;
    c->kv_hold_timeout_s = 30.0;
    c->kv_wait_timeout_s = 30.0;
    snprintf(c->kv_host, sizeof c->kv_host, "127.0.0.1");
}

int kvr_mocker_config_validate(const kvr_mocker_config_t *c, char *err, size_t err_len)
{
    if (!isfinite(c->speedup) || c->speedup <= 0) {
        snprintf(err, err_len, "speedup: must be a finite number > 0");
        return KVR_EINVAL;
    }
    if (c->dp_size < 1 || c->dp_size > KVR_MOCKER_MAX_DP) {
        snprintf(err, err_len, "data-parallel-size: must be in [1, %d]", KVR_MOCKER_MAX_DP);
        return KVR_EINVAL;
    }
    if (c->model[0] == '\0') {
        snprintf(err, err_len, "model: must not be empty");
        return KVR_EINVAL;
    }
    if (c->event_format != KVR_KV_FMT_VLLM_ARRAY && c->event_format != KVR_KV_FMT_VLLM_MAP) {
        snprintf(err, err_len, "event-format: must be array or map");
        return KVR_EINVAL;
    }
    if ((unsigned)c->role > KVR_MOCKER_DECODE || (unsigned)c->kv_transfer > KVR_MOCKER_BOOTSTRAP) {
        snprintf(err, err_len, "role: prefill, decode or both; kv-transfer: pull or bootstrap");
        return KVR_EINVAL;
    }
    if ((unsigned)c->kv_events_fault > KVR_MOCKER_EVFAULT_DROP) {
        snprintf(err, err_len, "kv-events-fault: none, wrong or drop");
        return KVR_EINVAL;
    }
    if (!isfinite(c->kv_transfer_gbps) || c->kv_transfer_gbps <= 0) {
        snprintf(err, err_len, "kv-transfer-gbps: must be a finite number > 0");
        return KVR_EINVAL;
    }
    if (!isfinite(c->kv_hold_timeout_s) || c->kv_hold_timeout_s <= 0 ||
        !isfinite(c->kv_wait_timeout_s) || c->kv_wait_timeout_s <= 0) {
        snprintf(err, err_len, "kv-hold-timeout / kv-wait-timeout: must be finite numbers > 0");
        return KVR_EINVAL;
    }
    if (c->kv_host[0] == '\0' || strpbrk(c->kv_host, " /\\\"") != NULL) {
        snprintf(err, err_len, "kv-host: a host name or address (no space, slash or quote)");
        return KVR_EINVAL;
    }
    size_t n = 0, len;
    const char *cur = c->loras, *l;
    while (kvr_namelist_next(&cur, &l, &len)) {
        if (len == 0 || len >= 256 || ++n > MAX_LORAS ||
            (len == strlen(c->model) && memcmp(l, c->model, len) == 0)) {
            snprintf(err, err_len,
                     "lora-modules: at most %d names of 1 to 255 bytes, none the model's",
                     MAX_LORAS);
            return KVR_EINVAL;
        }
    }
    return kvr_engine_config_validate(&c->engine, err, err_len);
}

/* ---- endpoints ---------------------------------------------------------------------------- */

static void h_models(kvr_mocker_t *m, struct evhttp_request *req)
{
    kvr_oai_model_t md[1 + MAX_LORAS];
    uint64_t now = (uint64_t)time(NULL), mml = kvr_engine_config(m->ranks[0].eng)->max_model_len;
    md[0] = (kvr_oai_model_t){m->cfg.model, now, "kvrouter", mml, NULL};
    for (size_t i = 0; i < m->n_lora; i++) /* as vLLM lists its LoRA modules */
        md[1 + i] = (kvr_oai_model_t){m->lora[i], now, "kvrouter", mml, m->cfg.model};
    kvr_json_writer_reset(&m->w);
    kvr_oai_encode_models(&m->w, md, 1 + m->n_lora);
    kvr_reply_writer(&m->rep, req, 200);
}

const char *const KVR_MOCKER_EVFAULT_NAMES[] = {"none", "wrong", "drop", NULL};

/* POST /debug/kv_events_fault?mode=none|wrong|drop: the silent KV-event fault from now on
 * (the events of the step in progress are published under the old one). */
static void h_evfault(kvr_mocker_t *m, struct evhttp_request *req)
{
    const char *q = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
    for (int k = 0; q != NULL && KVR_MOCKER_EVFAULT_NAMES[k] != NULL; k++) {
        char want[32];
        snprintf(want, sizeof want, "mode=%s", KVR_MOCKER_EVFAULT_NAMES[k]);
        if (strcmp(q, want) == 0) {
            m->cfg.kv_events_fault = (kvr_mocker_evfault_t)k;
            kvr_log(KVR_LOG_WARN, "KV-event fault now: %s", KVR_MOCKER_EVFAULT_NAMES[k]);
            char body[64];
            int n = snprintf(body, sizeof body, "{\"kv_events_fault\":\"%s\"}",
                             KVR_MOCKER_EVFAULT_NAMES[k]);
            kvr_reply_body(&m->rep, req, 200, "application/json", body, (size_t)n);
            return;
        }
    }
    mk_reply_error(m, req, 400, "query must be mode=none, mode=wrong or mode=drop (got %s)",
                   q != NULL ? q : "none");
}

static void h_reset(kvr_mocker_t *m, struct evhttp_request *req)
{
    for (uint32_t r = 0; r < m->cfg.dp_size; r++) {
        if (kvr_engine_in_step(m->ranks[r].eng) ||
            kvr_engine_reset_prefix_cache(m->ranks[r].eng) != KVR_OK) {
            mk_reply_error(m, req, 409, "rank %u has requests running; the prefix cache is kept",
                           r);
            return;
        }
        mk_rank_flush(&m->ranks[r]);
    }
    kvr_reply_body(&m->rep, req, 200, "application/json", "{\"reset\":true}", 14);
}

/* GET /debug/kv_blocks: the engine hashes each rank's prefix cache holds, as its KV events
 * describe them (what a subscriber that saw every event must hold). */
static void h_kv_blocks(kvr_mocker_t *m, struct evhttp_request *req)
{
    kvr_json_writer_reset(&m->w);
    kvr_json_begin_object(&m->w);
    kvr_json_key(&m->w, "ranks");
    kvr_json_begin_array(&m->w);
    for (uint32_t r = 0; r < m->cfg.dp_size; r++) {
        const kvr_kvcache_t *kc = kvr_engine_cache(m->ranks[r].eng);
        size_t n = kvr_kvcache_cached_hashes(kc, NULL, 0);
        uint64_t *hs = malloc((n + 1) * sizeof *hs);
        if (!hs) {
            mk_reply_error(m, req, 500, "out of memory");
            return;
        }
        kvr_kvcache_cached_hashes(kc, hs, n);
        kvr_json_begin_object(&m->w);
        kvr_json_key(&m->w, "dp_rank");
        kvr_json_u64(&m->w, r);
        kvr_json_key(&m->w, "block_hashes");
        kvr_json_begin_array(&m->w);
        for (size_t i = 0; i < n; i++)
            kvr_json_u64(&m->w, kvr_mocker_engine_hash(hs[i]));
        kvr_json_end_array(&m->w);
        kvr_json_end_object(&m->w);
        free(hs);
    }
    kvr_json_end_array(&m->w);
    kvr_json_end_object(&m->w);
    kvr_reply_writer(&m->rep, req, 200);
}


/* ---- /metrics ------------------------------------------------------------------------------ */

static void metric_per_rank(kvr_mocker_t *m, const char *name, const char *type,
                            const char *help, const double *v)
{
    const char *suffix = strcmp(type, "counter") == 0 ? "_total" : "";
    char full[160];
    snprintf(full, sizeof full, "%s%s", name, suffix);
    kvr_prom_family(&m->prom, full, type, help); /* HELP and TYPE name the samples, as vLLM's */
    for (uint32_t r = 0; r < m->cfg.dp_size; r++) {
        char eng[16];
        snprintf(eng, sizeof eng, "%u", r);
        kvr_prom_label_t l[] = {{"model_name", m->cfg.model}, {"engine", eng}};
        kvr_prom_sample(&m->prom, full, l, 2, v[r]);
    }
}

enum {
    MF_RUNNING,
    MF_WAITING,
    MF_KV_USAGE,
    MF_GPU_USAGE,
    MF_PREFIX_Q,
    MF_PREFIX_H,
    MF_HIT_RATE,
    MF_PROMPT,
    MF_GEN,
    MF_PREEMPT,
    MF_SUCCESS,
    MF_CANCELLED,
    MF_STEPS,
    MF_LAG,
    MF_CACHED,
    MF_ACTIVE,
    MF_STORED,
    MF_REMOVED,
    MF_PUBLISHED,
    MF_DROPPED,
    MF_ENC_ERR,
    MF_PUB_ERR,
    MF_REPLAY_REQ,
    MF_REPLAYED,
    MF_REPLAY_TRUNC,
    MF_REPLAY_INVALID,
    MF_REPLAY_SEND_ERR,
    MF_SUBSCRIBERS,
    MF_HELD,
    MF_HELD_BLOCKS,
    MF_KV_LOADED,
    MF_KV_LOADED_TOK,
    MF_COUNT
};

static const struct {
    const char *name, *type, *help;
} MF[MF_COUNT] = {
    [MF_RUNNING] = {"vllm:num_requests_running", "gauge", "Requests in the running batch"},
    [MF_WAITING] = {"vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled"},
    [MF_KV_USAGE] = {"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage (1 = 100%)"},
    [MF_GPU_USAGE] = {"vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage (older name)"},
    [MF_PREFIX_Q] = {"vllm:prefix_cache_queries", "counter", "Prompt tokens looked up"},
    [MF_PREFIX_H] = {"vllm:prefix_cache_hits", "counter", "Prompt tokens found cached"},
    [MF_HIT_RATE] = {"vllm:gpu_prefix_cache_hit_rate", "gauge", "hits / queries since start"},
    [MF_PROMPT] = {"vllm:prompt_tokens", "counter", "Prompt tokens of finished prefills"},
    [MF_GEN] = {"vllm:generation_tokens", "counter", "Generated tokens"},
    [MF_PREEMPT] = {"vllm:num_preemptions", "counter", "Requests preempted (recompute)"},
    [MF_SUCCESS] = {"vllm:request_success", "counter", "Requests finished"},
    [MF_CANCELLED] = {"kvr_mocker_requests_cancelled", "counter", "Requests cancelled"},
    [MF_STEPS] = {"kvr_mocker_steps", "counter", "Engine steps run"},
    [MF_LAG] = {"kvr_mocker_step_lag_seconds", "counter",
                "Real time beyond the modelled step times (the machine could not keep up)"},
    [MF_CACHED] = {"kvr_mocker_blocks_cached", "gauge", "Blocks in the prefix cache"},
    [MF_ACTIVE] = {"kvr_mocker_blocks_active", "gauge", "Blocks held by requests"},
    [MF_STORED] = {"kvr_mocker_blocks_stored", "counter", "Blocks that entered the cache"},
    [MF_REMOVED] = {"kvr_mocker_blocks_removed", "counter", "Blocks evicted from the cache"},
    [MF_PUBLISHED] = {"kvr_mocker_kv_event_batches_published", "counter", "KV event batches"},
    [MF_DROPPED] = {"kvr_mocker_kv_event_batches_dropped", "counter",
                    "Batches numbered but not sent (--kv-events-drop-every fault injection)"},
    [MF_ENC_ERR] = {"kvr_mocker_kv_event_encode_errors", "counter", "KV events not encoded"},
    [MF_PUB_ERR] = {"kvr_mocker_kv_event_publish_errors", "counter", "Batches ZMQ refused"},
    [MF_REPLAY_REQ] = {"kvr_mocker_replay_requests", "counter", "Valid replay requests received"},
    [MF_REPLAYED] = {"kvr_mocker_replayed_batches", "counter", "Batches sent by replay"},
    [MF_REPLAY_TRUNC] = {"kvr_mocker_replay_truncated", "counter",
                         "Replay requests older than the buffer"},
    [MF_REPLAY_INVALID] = {"kvr_mocker_replay_invalid_requests", "counter",
                           "Malformed replay requests"},
    [MF_REPLAY_SEND_ERR] = {"kvr_mocker_replay_send_errors", "counter",
                            "Replay answers abandoned (the subscriber went away)"},
    [MF_SUBSCRIBERS] = {"kvr_mocker_kv_event_subscribers", "gauge",
                        "Subscriptions that have reached the KV-event publisher"},
    [MF_HELD] = {"kvr_mocker_kv_held_requests", "gauge",
                 "Finished prefills whose KV is held for a decode worker"},
    [MF_HELD_BLOCKS] = {"kvr_mocker_kv_held_blocks", "gauge", "Blocks those prefills hold"},
    [MF_KV_LOADED] = {"kvr_mocker_kv_loaded_requests", "counter",
                      "Requests admitted with their KV transferred from a prefill worker"},
    [MF_KV_LOADED_TOK] = {"kvr_mocker_kv_loaded_tokens", "counter",
                          "Prompt tokens those requests did not compute"},
};

static double metric_value(const rank_t *rk, int f, const kvr_engine_stats_t *s,
                           const kvr_kv_pub_stats_t *p)
{
    switch (f) {
    case MF_RUNNING: return s->running;
    case MF_WAITING: return s->waiting;
    case MF_KV_USAGE:
    case MF_GPU_USAGE: return s->kv_usage;
    case MF_PREFIX_Q: return (double)s->prefix_queries_tokens;
    case MF_PREFIX_H: return (double)s->prefix_hits_tokens;
    case MF_HIT_RATE:
        return s->prefix_queries_tokens
                   ? (double)s->prefix_hits_tokens / (double)s->prefix_queries_tokens : 0;
    case MF_PROMPT: return (double)s->prompt_tokens;
    case MF_GEN: return (double)s->generation_tokens;
    case MF_PREEMPT: return (double)s->preemptions;
    case MF_SUCCESS: return (double)s->requests_finished;
    case MF_CANCELLED: return (double)s->requests_cancelled;
    case MF_STEPS: return (double)s->steps;
    case MF_LAG: return rk->lag_s;
    case MF_CACHED: return s->cache.n_cached;
    case MF_ACTIVE: return s->cache.n_active;
    case MF_STORED: return (double)s->cache.stored_blocks;
    case MF_REMOVED: return (double)s->cache.removed_blocks;
    case MF_PUBLISHED: return (double)p->published;
    case MF_DROPPED: return (double)p->dropped;
    case MF_REPLAY_SEND_ERR: return (double)p->replay_send_errors;
    case MF_ENC_ERR: return (double)rk->encode_errors;
    case MF_PUB_ERR: return (double)rk->publish_errors;
    case MF_REPLAY_REQ: return (double)p->replay_requests;
    case MF_REPLAYED: return (double)p->replayed_batches;
    case MF_REPLAY_TRUNC: return (double)p->replay_truncated;
    case MF_REPLAY_INVALID: return (double)p->invalid_requests;
    case MF_SUBSCRIBERS: return (double)p->subscribers;
    case MF_HELD:
        return s->held;
    case MF_HELD_BLOCKS:
        return (double)s->held_blocks;
    case MF_KV_LOADED:
        return (double)s->kv_loaded_requests;
    case MF_KV_LOADED_TOK:
        return (double)s->kv_loaded_tokens;
    default: return 0;
    }
}

static void h_metrics(kvr_mocker_t *m, struct evhttp_request *req)
{
    kvr_prom_reset(&m->prom);
    kvr_engine_stats_t st[KVR_MOCKER_MAX_DP];
    kvr_kv_pub_stats_t ps[KVR_MOCKER_MAX_DP];
    for (uint32_t r = 0; r < m->cfg.dp_size; r++) {
        kvr_engine_get_stats(m->ranks[r].eng, &st[r]);
        memset(&ps[r], 0, sizeof ps[r]);
        if (m->ranks[r].pub) {
            kvr_kv_pub_poll_subscriptions(m->ranks[r].pub);
            kvr_kv_pub_get_stats(m->ranks[r].pub, &ps[r]);
        }
    }
    double v[KVR_MOCKER_MAX_DP];
    for (int f = 0; f < MF_COUNT; f++) {
        for (uint32_t r = 0; r < m->cfg.dp_size; r++)
            v[r] = metric_value(&m->ranks[r], f, &st[r], &ps[r]);
        metric_per_rank(m, MF[f].name, MF[f].type, MF[f].help, v);
    }
    /* vLLM's info gauge of its cache config, one line per engine core: a router learns the
     * cache size from it (num_gpu_blocks of block_size tokens) */
    kvr_prom_family(&m->prom, "vllm:cache_config_info", "gauge",
                    "Information of the LLMEngine CacheConfig");
    for (uint32_t r = 0; r < m->cfg.dp_size; r++) {
        char bs[16], nb[16], en[16];
        snprintf(bs, sizeof bs, "%u", m->cfg.engine.block_size);
        snprintf(nb, sizeof nb, "%u", m->cfg.engine.num_gpu_blocks);
        snprintf(en, sizeof en, "%u", r);
        kvr_prom_label_t cl[] = {
            {"block_size", bs},
            {"enable_prefix_caching", m->cfg.engine.enable_prefix_caching ? "True" : "False"},
            {"engine", en},
            {"num_gpu_blocks", nb}};
        kvr_prom_sample(&m->prom, "vllm:cache_config_info", cl, 4, 1.0);
    }
    kvr_prom_label_t l[] = {{"model_name", m->cfg.model}};
    kvr_prom_family(&m->prom, "vllm:time_to_first_token_seconds", "histogram",
                    "Time to first token (real time, arrival to first token sent)");
    kvr_prom_hist(&m->prom, "vllm:time_to_first_token_seconds", l, 1, &m->h_ttft);
    kvr_prom_family(&m->prom, "vllm:e2e_request_latency_seconds", "histogram",
                    "Request latency (real time)");
    kvr_prom_hist(&m->prom, "vllm:e2e_request_latency_seconds", l, 1, &m->h_e2e);
    kvr_prom_family(&m->prom, "kvr_mocker_http_errors_total", "counter", "Error replies by status");
    static const char *codes[] = {"400", "404", "413", "500", "503", "other"};
    for (int k = 0; k < 6; k++) {
        kvr_prom_label_t cl[] = {{"code", codes[k]}};
        kvr_prom_sample(&m->prom, "kvr_mocker_http_errors_total", cl, 1,
                        (double)m->http_errors[k]);
    }
    kvr_prom_family(&m->prom, "kvr_mocker_requests_disconnected_total", "counter",
                    "Requests whose client went away before the end (cancelled)");
    kvr_prom_sample(&m->prom, "kvr_mocker_requests_disconnected_total", NULL, 0,
                    (double)m->requests_disconnected);
    mk_kv_metrics(m);
    kvr_reply_body(&m->rep, req, 200, "text/plain; version=0.0.4", m->prom.buf ? m->prom.buf : "",
                  m->prom.len);
}

/* ---- dispatch ------------------------------------------------------------------------------ */

static void on_request(struct evhttp_request *req, void *arg)
{
    kvr_mocker_t *m = arg;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
    const char *path = u ? evhttp_uri_get_path(u) : NULL;
    if (!path)
        path = "/";
    bool post = cmd == EVHTTP_REQ_POST, get = cmd == EVHTTP_REQ_GET;
    if (post && strcmp(path, "/v1/completions") == 0)
        mk_admit_generate(m, req, KVR_OAI_COMPLETIONS);
    else if (post && strcmp(path, "/v1/chat/completions") == 0)
        mk_admit_generate(m, req, KVR_OAI_CHAT);
    else if (post && strcmp(path, "/tokenize") == 0)
        mk_admit_tokenize(m, req);
    else if (get && strcmp(path, "/v1/models") == 0)
        h_models(m, req);
    else if (get && strcmp(path, "/health") == 0)
        kvr_reply_body(&m->rep, req, 200, "text/plain", "", 0);
    else if (get && strcmp(path, "/metrics") == 0)
        h_metrics(m, req);
    else if (get && strcmp(path, "/version") == 0)
        kvr_reply_body(&m->rep, req, 200, "application/json", "{\"version\":\"" MOCKER_VERSION "\"}",
                      sizeof "{\"version\":\"" MOCKER_VERSION "\"}" - 1);
    else if (get && strcmp(path, "/debug/kv_blocks") == 0)
        h_kv_blocks(m, req);
    else if (post && strcmp(path, "/reset_prefix_cache") == 0)
        h_reset(m, req);
    else if (post && strcmp(path, "/debug/kv_events_fault") == 0)
        h_evfault(m, req);
    else if (post && strcmp(path, "/kv/pull") == 0)
        mk_h_pull(m, req);
    else
        mk_reply_error(m, req, 404, "no route for %s %s",
                       post  ? "POST"
                       : get ? "GET"
                             : "this",
                       path);
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

/* Non-streaming clients are probed for a disconnect; held KV and parked reads expire. */
static void on_sweep_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_mocker_t *m = arg;
    mk_admit_sweep(m);
    mk_kv_sweep(m, mk_mono_ns());
}

static int http_init(kvr_mocker_t *m, char *err, size_t err_len)
{
    struct evhttp_bound_socket *bs;
    int st = mk_listen(m, "port", m->cfg.port, MAX_BODY_BYTES, on_request, m, &m->http, &bs,
                       err, err_len);
    if (m->http)
        evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    if (st != KVR_OK)
        return st;
    /* Small SSE writes must not wait for the client's delayed ACK (Nagle): accepted
     * sockets inherit the flag on Linux. vLLM's server sets it too. */
    int one = 1;
    (void)setsockopt(evhttp_bound_socket_get_fd(bs), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    m->port = kvr_http_bound_port(bs);
    return KVR_OK;
}

kvr_mocker_t *kvr_mocker_new(struct event_base *base, void *zmq_ctx,
                             const kvr_mocker_config_t *cfg, int *status, char *err,
                             size_t err_len)
{
    int st = kvr_mocker_config_validate(cfg, err, err_len);
    kvr_mocker_t *m = NULL;
    if (st != KVR_OK)
        goto fail;
    st = KVR_ENOMEM;
    snprintf(err, err_len, "out of memory");
    if (!(m = calloc(1, sizeof *m)))
        goto fail;
    m->cfg = *cfg;
    if (getrandom(&m->id_state, sizeof m->id_state, 0) != (ssize_t)sizeof m->id_state)
        m->id_state = kvr_wall_ns() ^ ((uint64_t)getpid() << 32);
    const char *cur = cfg->loras, *l;
    size_t len;
    while (m->n_lora < MAX_LORAS && kvr_namelist_next(&cur, &l, &len)) { /* validated */
        memcpy(m->lora[m->n_lora], l, len);
        m->lora[m->n_lora++][len] = '\0';
    }
    m->base = base;
    m->rl_events = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    m->rl_kv = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    kvr_json_writer_init(&m->w);
    kvr_prom_init(&m->prom);
    kvr_hist_init(&m->h_ttft, TTFT_BOUNDS, N_TTFT);
    kvr_hist_init(&m->h_e2e, E2E_BOUNDS, N_E2E);
    kvr_json_writer_init(&m->conv_w);
    if (!(m->dec = kvr_oai_decoder_new(NULL)) || !(m->out = evbuffer_new()) ||
        kvr_reply_init(&m->rep, &m->w, &kvr_reply_openai) != KVR_OK)
        goto fail;
    if (cfg->tokenizer[0] != '\0') {
        char why[512];
        if (!(m->tok = kvr_tokmodel_load(cfg->tokenizer, &st, why, sizeof why))) {
            snprintf(err, err_len, "--tokenizer: %s", why);
            goto fail;
        }
        st = KVR_ENOMEM;
        snprintf(err, err_len, "out of memory");
        if (!(m->tok_s = kvr_tokmodel_scratch_new(m->tok)))
            goto fail;
    }
    for (uint32_t r = 0; r < cfg->dp_size; r++)
        if ((st = mk_rank_init(m, r, zmq_ctx, mk_admit_on_output, err, err_len)) != KVR_OK)
            goto fail;
    if (cfg->events.enabled && cfg->events.replay_endpoint[0]) {
        struct timeval tv = {0, REPLAY_POLL_US};
        m->replay_tick = event_new(base, -1, EV_PERSIST, mk_ranks_replay_tick, m);
        if (!m->replay_tick || event_add(m->replay_tick, &tv) != 0) {
            st = KVR_ENOMEM;
            goto fail;
        }
    }
    struct timeval sweep = {0, SWEEP_US};
    m->sweep_tick = event_new(base, -1, EV_PERSIST, on_sweep_tick, m);
    if (!m->sweep_tick || event_add(m->sweep_tick, &sweep) != 0) {
        st = KVR_ENOMEM;
        goto fail;
    }
    if ((st = http_init(m, err, err_len)) != KVR_OK || (st = mk_kv_init(m, err, err_len)) != KVR_OK)
        goto fail;
    *status = KVR_OK;
    err[0] = '\0';
    return m;
fail:
    kvr_mocker_free(m);
    *status = st;
    return NULL;
}

void kvr_mocker_free(kvr_mocker_t *m)
{
    if (!m)
        return;
    if (m->http)
        evhttp_free(m->http); /* closes connections: their close callbacks free requests */
    mk_kv_free(m);
    if (m->replay_tick)
        event_free(m->replay_tick);
    if (m->sweep_tick)
        event_free(m->sweep_tick);
    for (uint32_t r = 0; r < KVR_MOCKER_MAX_DP; r++)
        mk_rank_free(&m->ranks[r]);
    kvr_oai_decoder_free(m->dec);
    if (m->out)
        evbuffer_free(m->out);
    kvr_reply_deinit(&m->rep);
    kvr_json_writer_deinit(&m->w);
    kvr_json_writer_deinit(&m->conv_w);
    kvr_tokmodel_scratch_free(m->tok_s);
    kvr_tokmodel_free(m->tok);
    kvr_prom_deinit(&m->prom);
    free(m->toks);
    free(m->chat);
    free(m);
}

uint16_t kvr_mocker_port(const kvr_mocker_t *m) { return m->port; }
uint16_t kvr_mocker_bootstrap_port(const kvr_mocker_t *m) { return m->boot_port; }
