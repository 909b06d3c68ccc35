/*
 * frontend_int.h: what the OpenAI front end's files share (frontend.c: the request state
 * machine; fe_relay.c: streamed answers to the client; fe_upstream.c: per-worker connection pools and failure accounting; fe_models.c:
 * GET /v1/models; fe_metrics.c: its /metrics families). Not a public interface: only these
 * files include it. Threads: the HTTP thread only, like everything in the front end.
 */
#ifndef KVR_NET_FRONTEND_INT_H
#define KVR_NET_FRONTEND_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/http.h>
#include <xxhash.h>

#include "core/endpoint.h"
#include "frontend/tokcache.h"
#include "frontend/frontend.h"
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

typedef enum up_kind {
    UPK_CONNECT = 0, /* refused, unreachable, or no connection within the timeout */
    UPK_TIMEOUT,     /* silence past frontend_upstream_timeout_ms on a connected upstream */
    UPK_EOF,         /* closed before the response was complete */
    UPK_PROTOCOL,    /* a malformed answer */
    UPK_NO_URL,      /* the worker has no usable url */
    UPK_STATUS_5XX,  /* answered with a 5xx status (relayed, not retried) */
    UPK_TOO_LARGE,   /* a whole answer longer than frontend_max_answer_bytes */
    UPK_COUNT
} up_kind_t;

extern const char *const UPK_NAMES[UPK_COUNT]; /* fe_metrics.c */

typedef struct upool upool_t;

typedef struct upconn {
    upool_t *pool;
    struct evhttp_connection *conn;
    bool busy;
} upconn_t;

typedef struct pmodel {
    char *id, *owned_by, *parent; /* parent: a LoRA adapter's base model; NULL: none */
    uint64_t created, max_model_len;
} pmodel_t;

/* One worker's upstream side: where it is, its connections, its failures, its models. */
struct upool {
    kvr_frontend_t *fe;
    uint64_t worker_id;
    char url[KVR_ADDR_BYTES];
    kvr_url_t loc; /* url taken apart: host, port, Host header, base path */
    bool bad_url;
    bool dead;                 /* left the registry or changed url: freed once unused */
    upconn_t **conns;
    size_t n_conns, cap_conns, n_busy;
    uint32_t consecutive_failures;
    /* GET /v1/models */
    struct evhttp_connection *mconn;
    bool m_in_flight;
    pmodel_t *models;
    size_t n_models;
};

typedef enum fe_phase {
    PH_START = 0,
    PH_TOKENIZE,   /* a /tokenize call in flight */
    PH_QUEUED,     /* waiting in the router's queue */
    PH_UPSTREAM,   /* the generation request in flight */
    PH_RETRY,      /* retry_ev pending */
} fe_phase_t;

typedef struct fe_req fe_req_t;

/* How a request is served (fe_disagg.c). */
typedef enum fe_dmode {
    FD_AGG = 0,   /* by one worker (no prefill worker, or the policy kept it local) */
    FD_PULL,      /* vLLM: the prefill worker first, then the decode worker with its
                     kv_transfer_params */
    FD_BOOTSTRAP, /* SGLang: both at once, with a bootstrap room */
} fe_dmode_t;

/* A bootstrap prefill call, running beside its request's decode call. */
typedef struct fe_bg fe_bg_t;

struct fe_req {
    kvr_frontend_t *fe;
    fe_req_t *prev, *next;
    struct evhttp_request *client;
    struct evhttp_connection *client_conn;
    kvr_oai_endpoint_t ep;
    fe_phase_t phase;
    bool stream, want_worker;
    bool rewrite;          /* the body cannot go verbatim */
    bool kvt_counted;      /* its KV-transfer members were stripped (counted once) */
    bool drop_prompt;      /* completions: the prompt member becomes the ids */
    bool reply_started;    /* SSE headers sent to the client */
    bool got_headers;      /* the upstream answered (its first byte): no retry from here */
    bool sse_mode;
    bool first_token_sent;
    bool slow_abort;       /* the client's pending output passed the cap: aborted from retry_ev */
    uint64_t arrival_ns;
    uint64_t first_token_ns, last_token_ns; /* token chunks relayed (0: none yet) */
    uint64_t cached_tokens;                 /* on the chosen worker, at routing */
    uint16_t model_slot;                    /* its per-model metrics (fe_reqmetrics.c) */
    /* the prompt */
    uint32_t *tokens;
    size_t n_tokens;
    const char *client_body; /* the client's body (its input buffer, pulled up) */
    size_t client_body_len;
    char *body_own;          /* the rebuilt body, when rewrite */
    const char *body;
    size_t body_len;
    char *auth;              /* the client's Authorization, when forwarded (config) */
    /* tokenize */
    char *tok_body;
    size_t tok_body_len;
    XXH128_hash_t tok_key;
    uint64_t tok_tried[FE_MAX_ATTEMPTS];
    unsigned n_tok_tried;
    /* routing */
    char *model; /* the request's model ("" when it named none) */
    uint64_t *images; /* its chat images' hashes (kvr_oai_request_t.images); NULL: none */
    size_t n_images;
    kvr_block_mm_t *mm; /* every block carries the images (their positions are unknown) */
    size_t n_mm;
    size_t model_len;
    uint32_t block_size; /* of the chosen worker's model (output-block accounting) */
    char *lora;
    size_t lora_len;
    char session[KVR_OAI_MAX_SESSION_BYTES + 1]; /* sticky session id; "" = none */
    size_t session_len;
    bool session_close;
    bool has_allowed;
    uint64_t *allowed;
    size_t n_allowed;
    bool has_pin_worker, has_pin_rank;
    uint64_t pin_worker;
    uint32_t pin_rank;
    double priority_jump; /* queue head start, seconds */
    bool has_priority;    /* the engine priority forwarded as the body's "priority" */
    int32_t priority;
    bool has_eot;
    uint32_t eot;
    uint64_t tried[FE_MAX_ATTEMPTS]; /* workers whose upstream failed */
    unsigned n_tried, attempts;
    uint64_t *scratch;               /* the allowed ids of an attempt */
    size_t cap_scratch;
    kvr_ticket_t ticket; /* queued in the scheduler (PH_QUEUED) */
    char last_fail[160];
    /* the booking */
    bool booked;
    kvr_req_handle_t handle; /* the booking, for the scheduler's lifecycle calls */
    char rid[KVR_LOAD_MAX_ID_BYTES + 1];
    size_t rid_len;
    kvr_worker_t worker;
    char nvext[192];                 /* "nvext":{"worker_id":{...}} */
    size_t nvext_len;
    /* the upstream call */
    struct evhttp_request *up;
    upconn_t *uc;
    upool_t *up_pool;
    bool up_err_set;
    up_kind_t up_err;
    int up_code;
    struct evbuffer *sse;            /* upstream bytes of an event not yet complete */
    uint64_t gen_tokens;
    uint64_t step_seen; /* its worker's step clock: the step it last had a token of */
    struct event *retry_ev;
    /* disaggregation (fe_disagg.c): the current booking and upstream call are the prefill's
     * while pf_leg; afterwards the decode's (the fields above) */
    fe_dmode_t dmode;
    bool disagg_planned; /* the mode was decided */
    bool pf_leg;
    bool has_pf; /* pf: the prefill worker that served (or serves) it */
    kvr_worker_t pf;
    uint64_t pf_cached_tokens;
    uint64_t pf_start_ns;
    char *leg_body; /* the current leg's body when it is not p->body (owned) */
    size_t leg_body_len;
    bool has_pin_pf, has_pin_pf_rank; /* pre-routed prefill worker */
    uint64_t pin_pf;
    uint32_t pin_pf_rank;
    fe_bg_t *bg;     /* bootstrap: its prefill call (NULL when none or finished) */
    bool leg_switch; /* retry_ev continues on the next leg (not a retry) */
    char *kvt;       /* pull: the prefill answer's kv_transfer_params (owned) */
    size_t kvt_len;
    bool d_sent; /* the decode leg was sent to a decode worker */
    bool abandoned; /* pull: its client left while a call must go on (a prefill call until
                       it answers, a decode call until its worker answers) */
    char *rel_base; /* pull: the body for a release call, kept when its client left */
    size_t rel_base_len;
};

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
    uint64_t replies[6];             /* 2xx, 3xx, 4xx, 5xx, streamed, other */
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
    struct evbuffer *out;      /* scratch: reply bodies and relayed chunks */
    struct event *tick;
    fe_req_t *live;
    size_t n_live;
    upool_t **pools;
    size_t n_pools, cap_pools;
    uint64_t tok_rr;
    size_t n_urlless;          /* registered workers without a url (refreshed by the tick) */
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
    /* disaggregation (fe_disagg.c) */
    fe_dstats_t ds;
    int dstate;           /* the prefill pool's state last seen (kvr_disagg_state_t) */
    kvr_hist_t h_prefill; /* the prefill call: sent -> answered, seconds */
    fe_bg_t *bgs;         /* bootstrap prefill calls in flight */
    kvr_ratelimit_t rl_disagg;
};

/* ---- frontend.c -------------------------------------------------------------------------- */
void fe_send_error(kvr_frontend_t *fe, struct evhttp_request *req, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void fe_send_writer(kvr_frontend_t *fe, struct evhttp_request *req, int code);
size_t fe_client_backlog(const fe_req_t *p);

void fe_req_finish(fe_req_t *p);
/* The SSE headers go to the client (once). */
void fe_start_reply(fe_req_t *p);
/* A token arrived: first token and output blocks reported to the router. */
void fe_mark_token(fe_req_t *p);

/* Replies and request plumbing the other fe_*.c files share. */
void fe_send_body(kvr_frontend_t *fe, struct evhttp_request *req, int code, const char *ctype,
                  const char *body, size_t len);
/* The client's request, detached: nothing may reach it through p afterwards (NULL if gone). */
struct evhttp_request *fe_client_take(fe_req_t *p);
/* Answers with an error and frees the request. */
void fe_req_fail(fe_req_t *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The Authorization a worker gets (the client's when forwarded, else the router's own). */
void fe_add_upstream_auth(const fe_req_t *p, struct evkeyvalq *h);
bool fe_ensure_retry_ev(fe_req_t *p);
/* Continues p (the next attempt) from a zero-delay timer. */
void fe_schedule_retry(fe_req_t *p);
bool fe_set_tokens(fe_req_t *p, const uint32_t *t, size_t n);
/* The ids are known: the body for the workers, then routing. */
void fe_ids_ready(fe_req_t *p);
void fe_up_count_error(kvr_frontend_t *fe, up_kind_t kind, uint64_t worker_id, bool before);
void fe_on_up_error(enum evhttp_request_error err, void *arg);

/* Routing and answering, shared with fe_disagg.c. */
void fe_route_attempt(fe_req_t *p);
void fe_unbook(fe_req_t *p);
/* Drops p's upstream call without any callback (the worker sees its connection close). */
void fe_cancel_upstream(fe_req_t *p);
/* The whole (non-SSE) answer in up relayed to the client with its status. */
void fe_reply_whole(fe_req_t *p, struct evhttp_request *up);

/* ---- fe_body.c: the workers' body, the nvext naming the worker ------------------------- */
/* The body for the workers when the client's cannot go verbatim (p->rewrite). KVR_OK,
 * KVR_ETOOBIG (more than FE_MAX_MEMBERS members) or KVR_ENOMEM. */
int fe_build_forward_body(fe_req_t *p);
/* Whether the client's body b may hold a KV-transfer member (kv_transfer_params, bootstrap_*),
 * which must then be stripped: a byte search, false positives only cost a rewrite. */
bool fe_body_may_name_kvt(const char *b, size_t n);
/* A leg of a disaggregated request: the forward body without the top-level members named in
 * drop (NULL-terminated; *seen gets bit i set when drop[i] was present), then tail (members
 * text, no leading comma). Into a new buffer (*out, owned by the caller). */
int fe_build_leg_body(fe_req_t *p, const char *const *drop, unsigned *seen, const char *tail,
                      size_t tail_len, char **out, size_t *out_len);
/* "nvext":{"worker_id":{...}} for the chosen worker, into p->nvext. */
void fe_make_nvext(fe_req_t *p);
/* json with the worker's nvext added (when the client asked for it) into out; false when it is
 * not one valid object (forwarded as it was). */
bool fe_inject_worker(const fe_req_t *p, const char *json, size_t len, struct evbuffer *out);

/* ---- fe_tokenize.c: ids from a worker's /tokenize, cached -------------------------------- */
/* The /tokenize body and the cache key of a text or chat prompt. */
bool fe_tokenize_body(fe_req_t *p, const kvr_oai_request_t *rq);
/* Asks the next untried worker to tokenize p's prompt (fe_ids_ready when it answers). */
void fe_start_tokenize(fe_req_t *p);

/* ---- fe_models.c: GET /v1/models; the adapters each engine lists ------------------------ */
/* Asks every worker for its models when the last round is FE_ADAPTERS_REFRESH_MS old. */
void fe_models_tick(kvr_frontend_t *fe);

/* ---- fe_disagg.c: disaggregated prefill/decode ---------------------------------------- */
int fe_disagg_init(kvr_frontend_t *fe);
void fe_disagg_free(kvr_frontend_t *fe);
/* Decides how p is served (before its first route); false after failing p (enforce). */
bool fe_disagg_plan(fe_req_t *p);
/* The route request's pool and overrides for p's current leg. */
void fe_disagg_route_req(fe_req_t *p, kvr_route_req_t *q);
/* p's current leg was placed (res): counted per pool; the prefill leg's body and, for
 * bootstrap, its call (then p continues on its decode leg by itself). True when p's upstream
 * call is to be sent now. */
bool fe_disagg_placed(fe_req_t *p, const kvr_route_res_t *res);
/* The prefill leg's whole answer (pull): continues p (decode leg, or the answer itself). */
void fe_disagg_prefill_done(fe_req_t *p, struct evhttp_request *up, int code);
/* The prefill leg cannot go on (no prefill worker left, retries spent, a failed answer):
 * served aggregated (or 503 with enforce_disagg). */
void fe_disagg_fallback(fe_req_t *p, const char *why);
/* The call of p, whose client left, ended (code; 0: failed): a prefill answer's KV is
 * released; p finishes. */
void fe_disagg_abandoned(fe_req_t *p, struct evhttp_request *up, int code);
/* Keeps what a release call of p needs of its client's body (before the client is freed). */
int fe_disagg_keep_body(fe_req_t *p);
/* p's client left: its prefilled KV (pull) is released if no decode worker got it. */
void fe_disagg_orphan(fe_req_t *p);
/* p ends: its bootstrap prefill call is cancelled (cancel) or left to finish. */
void fe_disagg_release(fe_req_t *p, bool cancel);
/* The pool state, checked from the tick (transitions logged and counted). */
kvr_disagg_state_t fe_disagg_tick(kvr_frontend_t *fe); /* the state now */
void fe_disagg_metrics(const kvr_frontend_t *fe, struct kvr_prom *pr);
/* A worker left: bootstrap calls booked on it have nothing left to release. */
void fe_disagg_worker_removed(kvr_frontend_t *fe, uint64_t worker_id);
/* Whether the upstream call of p's current leg streams. */
static inline bool fe_leg_streams(const fe_req_t *p) { return p->stream && !p->pf_leg; }

/* ---- fe_reqmetrics.c: per-model request histograms --------------------------------------- */
int fe_reqm_init(kvr_frontend_t *fe);
void fe_reqm_free(kvr_frontend_t *fe);
/* The metrics slot of a model name (FE_MAX_METRIC_MODELS: "other"). */
uint16_t fe_reqm_slot(kvr_frontend_t *fe, const char *model, size_t len);
/* A request answered 200 in full, at now_ns, with osl output tokens. */
void fe_reqm_observe(kvr_frontend_t *fe, const fe_req_t *p, uint64_t now_ns, uint64_t osl);
void fe_reqm_metrics(const kvr_frontend_t *fe, struct kvr_prom *p);

/* ---- fe_relay.c: upstream SSE -> the client ---------------------------------------------- */
/* Forwards the complete events held (all of it when final). */
void fe_relay(fe_req_t *p, bool final);
/* Ends a request whose client stopped reading (from retry_ev). */
void fe_abort_slow_client(fe_req_t *p);

/* ---- fe_upstream.c: one pool of keep-alive connections per worker ------------------------ */
/* The live pool of a registered worker (made on first use; a new one when its url changed). */
upool_t *fe_pool_for(kvr_frontend_t *fe, const kvr_worker_spec_t *sp);
struct evhttp_connection *fe_new_conn(kvr_frontend_t *fe, const upool_t *u,
                                      const struct timeval *tv);
/* An idle keep-alive connection of the pool, or a new one. */
/* An idle pooled connection to u, or a new one; timeout_ms of silence allowed on this call. */
upconn_t *fe_pool_acquire(kvr_frontend_t *fe, upool_t *u, uint64_t timeout_ms);
void fe_pool_release(upconn_t *c);
void fe_pool_free(upool_t *u);
/* A refused connection or a failure before the first byte: counted against the worker. */
void fe_worker_failed(kvr_frontend_t *fe, upool_t *u, up_kind_t kind);
/* Frees the pools of workers gone and idle connections beyond the cap. */
void fe_pool_upkeep(kvr_frontend_t *fe);

/* ---- fe_models.c: GET /v1/models, merged from the workers' lists ------------------------- */
void fe_h_models(kvr_frontend_t *fe, struct evhttp_request *req);
void fe_models_answer(kvr_frontend_t *fe, struct evhttp_request *req);

/* ---- fe_metrics.c ------------------------------------------------------------------------ */
void fe_metrics(void *arg, struct kvr_prom *p);

#endif
