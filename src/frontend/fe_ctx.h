/*
 * fe_ctx.h: the OpenAI front end's shared context: its limits, its counters and the front end
 * itself (struct kvr_frontend), which every fe_*.c file reads. It declares no function: each
 * concern has its own header (fe_req.h the per-request state, fe_upstream.h the worker pools,
 * fe_body.h, fe_tokenize.h, fe_relay.h, fe_disagg.h the leg planner, fe_models.h,
 * fe_metrics.h with the per-model histograms, http/reply.h), and no helper includes the state machine
 * (frontend.c), which has no header besides the public frontend.h.
 * Invariants: live holds the n_live requests not yet finished; pools the worker pools
 * (fe_upstream.h); bgs the planner's background calls (fe_disagg.c); dfree the planner's idle
 * per-request parts. Ownership: the front end owns all of it. Threads: the HTTP thread only,
 * like everything in the front end. Cost: none (declarations).
 */
#ifndef KVR_FRONTEND_FE_CTX_H
#define KVR_FRONTEND_FE_CTX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/http.h>
#include <xxhash.h>

#include "core/endpoint.h"
#include "frontend/tokcache.h"
#include "frontend/frontend.h"
#include "frontend/fe_upstream.h"
#include "http/http.h"
#include "base/log.h"
#include "base/secret.h"
#include "wire/api_json.h"
#include "wire/json_scan.h"
#include "wire/json_writer.h"
#include "wire/openai.h"
#include "wire/prom.h"

#define FE_TICK_US 100000
#define FE_MODELS_TTL_MS 5000
#define FE_ADAPTERS_REFRESH_MS 30000 /* every worker's /v1/models, for the adapters it lists */
#define FE_MODELS_TIMEOUT_S 2
#define FE_MODELS_MAX_BYTES ((size_t)1 << 20)
#define FE_MAX_MODELS 256           /* per worker */
#define FE_MAX_MODEL_WAITERS 1024
#define FE_SSE_MAX_PENDING ((size_t)1 << 20) /* bytes without an event end: forwarded raw */
#define FE_MAX_ATTEMPTS 17          /* 1 + the largest frontend_max_retries */
#define FE_MAX_MEMBERS 512          /* top-level members of a body we splice */
#define FE_MAX_WORKERS 4096
#define FE_BEV_MAX_IO ((size_t)4 << 20)
#define FE_MAX_UPSTREAM_HEADER_BYTES 65536 /* a worker answer's head (vLLM's: a few hundred) */

typedef struct fe_req fe_req_t;   /* fe_req.h */
typedef struct fe_bg fe_bg_t;     /* fe_disagg.c: a background call */
typedef struct fe_dreq fe_dreq_t; /* fe_disagg.c: a disaggregated request's part */
typedef struct fe_tokmodel fe_tokmodel_t; /* fe_inproc.c: a model tokenized in process */

/* Where a text or chat prompt's ids came from, and why the in-process path declined one. */
enum { FE_TOKP_INPROC, FE_TOKP_WORKER, FE_TOKP_CACHE, FE_TOKP_COUNT };
enum { FE_TOKD_PENDING, FE_TOKD_REFUSED, FE_TOKD_UNSUPPORTED, FE_TOKD_NO_TEMPLATE, FE_TOKD_COUNT };
/* The state machine's answer to a planner event outside its hooks (fe_disagg.h). */
typedef void (*fe_leg_lost_fn)(fe_req_t *p);

/* One model's request histograms (fe_reqmetrics.c). */
#define FE_MAX_METRIC_MODELS 32
#define FE_METRIC_MODEL_BYTES 128
typedef struct fe_model_metrics {
    char name[FE_METRIC_MODEL_BYTES];
    kvr_hist_t ttft, itl, isl, osl, e2e, hit;
    uint64_t requests;
} fe_model_metrics_t;

typedef struct fe_stats {
    uint64_t requests[3];            /* completions, chat, models */
    uint64_t streams_ended;          /* SSE streams ended (their 200 is not counted again) */
    uint64_t forwarded, retries, fenced, client_disconnects, slow_client_aborts;
    uint64_t upstream_errors[UPK_COUNT];
    uint64_t tokenize_calls, stream_events, stream_tokens, sse_raw, inject_failed;
    uint64_t models_refreshes;
    uint64_t kvt_stripped; /* requests whose kv_transfer_params / bootstrap_* were dropped */
} fe_stats_t;

/* Disaggregation counters (fe_disagg.c). */
enum { FDB_UNAVAILABLE, FDB_ISL, FDB_LOAD, FDB_PREFILL_FAILED, FDB_COUNT };         /* bypasses */
enum { FDP_OK, FDP_TERMINAL, FDP_NO_PARAMS, FDP_BAD_PARAMS, FDP_ERROR, FDP_COUNT }; /* prefills */
typedef struct fe_dstats {
    uint64_t mode[3];                 /* requests served aggregated, pull, bootstrap */
    uint64_t bypass[FDB_COUNT];       /* remote prefill skipped, by reason */
    uint64_t prefill[FDP_COUNT];      /* prefill answers, by outcome */
    uint64_t bg_failed, bg_cancelled; /* bootstrap prefill calls that failed / were cancelled */
    uint64_t transitions[3];          /* the prefill pool entered pending, active, unavailable */
    uint64_t refused_enforced;        /* 503: enforce_disagg and no prefill */
    uint64_t orphans[2];              /* release calls made, and those that could not be */
    uint64_t pool_routed[2], pool_prompt_tokens[2], pool_cached_tokens[2]; /* prefill, decode */
} fe_dstats_t;

struct kvr_frontend {
    struct event_base *base;
    kvr_http_host_t *host;
    kvr_fleet_t *fleet;
    kvr_sched_t *sched;
    kvr_router_t *r;
    kvr_router_config_t cfg;
    kvr_oai_decoder_t *dec;
    size_t max_tokens; /* min(router_max_prompt_tokens, the decoders' limit) */
    uint32_t *tok_ids; /* a /tokenize answer's ids (scratch, grown) */
    size_t tok_cap;
    kvr_json_writer_t w;
    kvr_reply_t rep; /* replies to clients: over w, OpenAI's error shape, counted */
    struct evbuffer *out;      /* scratch: reply bodies and relayed chunks */
    struct event *tick;
    fe_req_t *live;
    size_t n_live;
    upool_t **pools;
    size_t n_pools, cap_pools;
    uint64_t tok_rr;
    size_t n_urlless;          /* registered workers without a url (the fleet's observer) */
    uint64_t *urlless;         /* their ids (FE_MAX_WORKERS; NULL while there are none) */
    uint64_t urlless_lost;     /* ones it had no room for (out of memory): eligible */
    kvr_tokcache_t cache;
    kvr_json_member_t *members;
    /* /v1/models */
    uint64_t models_at_ms;
    bool models_valid;
    size_t models_pending;
    struct evhttp_request **waiters;
    size_t n_waiters;
    fe_stats_t st;
    bool closing;              /* kvr_frontend_free is answering what is in flight */
    kvr_hist_t h_forward;      /* arrival -> upstream request issued, seconds */
    fe_model_metrics_t *mm;    /* FE_MAX_METRIC_MODELS + 1 ("other", last) */
    uint16_t n_mm;
    kvr_ratelimit_t rl_up, rl_proto, rl_slow;
    char worker_auth[KVR_SECRET_MAX + 8]; /* "Bearer <worker_api_key_file>"; "" = none */
    /* disaggregation: the leg planner (fe_disagg.c) */
    fe_dstats_t ds;
    int dstate;           /* the prefill pool's state last seen (kvr_disagg_state_t) */
    kvr_hist_t h_prefill; /* the prefill call: sent -> answered, seconds */
    fe_bg_t *bgs;         /* background calls in flight (bootstrap prefills, releases) */
    fe_dreq_t *dfree;     /* idle disaggregated parts, reused (no malloc once warm) */
    fe_leg_lost_fn leg_lost; /* the state machine's, for a leg lost outside its hooks */
    kvr_ratelimit_t rl_disagg;
    /* in-process tokenization (fe_inproc.c) */
    fe_tokmodel_t **tms;         /* each its own allocation: probes point at them */
    size_t n_tms, cap_tms;
    struct fe_tokpend **tok_pend; /* tokenizers named by registrations, loading */
    size_t n_tok_pend, cap_tok_pend;
    uint64_t tok_loads[2];       /* registrations' tokenizers: loaded, failed */
    kvr_json_writer_t conv_w;    /* the chat template's input */
    kvr_hist_t h_tokenize;       /* in-process tokenization of one prompt, seconds */
    uint64_t tok_path[FE_TOKP_COUNT];
    uint64_t tok_tokens;         /* ids made in process */
    uint64_t tok_declined[FE_TOKD_COUNT];
    kvr_ratelimit_t rl_tok;
};

#endif
