/*
 * mocker_state.h: the one struct the mocker's files share (struct kvr_mocker, its ranks, its
 * requests, the disaggregated roles' holds and parked reads) and three inline helpers of time.
 * Not a public interface (mocker.h is), and no functions of any file are declared here: each
 * file offers its own in its private header, and the calls go one way only (no cycle):
 *
 *   mocker.c        lifecycle, dispatch, /metrics       calls admit, kv, rank, server
 *   mocker_admit.c  requests: admission, token stream   calls kv, rank, server
 *   mocker_kv.c     KV transfer of the disagg. roles    calls server
 *   mocker_rank.c   ranks: engine stepping, KV events   calls nothing of the mocker's
 *   mocker_server.c replies, request bodies, listeners  calls nothing of the mocker's
 *
 * A lower file reaches an upper one only through a callback it was handed (a rank's output
 * callback, a request's kv_done).
 * Ownership: struct kvr_mocker owns everything below it (mocker.c frees it). Threads: the
 * loop thread only. Cost: header only.
 */
#ifndef KVR_MOCKER_STATE_H
#define KVR_MOCKER_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>
#include <time.h>

#include <event2/event.h>
#include <event2/http.h>

#include "sim/engine.h"
#include "tokenizer/model.h"
#include "base/clock.h"
#include "events/kv_publisher.h"
#include "base/log.h"
#include "mocker/mocker.h"
#include "http/http.h"
#include "wire/disagg.h"
#include "wire/json_writer.h"
#include "wire/kv_encode.h"
#include "wire/openai.h"
#include "wire/prom.h"

typedef struct kvr_mocker kvr_mocker_t;

typedef struct rank {
    kvr_mocker_t *m;
    uint32_t idx;
    kvr_engine_t *eng;
    kvr_kv_enc_t *enc;
    kvr_kv_pub_t *pub;
    kvr_engine_output_fn on_output; /* the engine's tokens go there (mocker_admit.c's) */
    bool batch_open;
    uint64_t *scratch; /* engine hashes of one event */
    size_t scratch_cap;
    uint32_t *tok_scratch; /* its tokens, altered (the "wrong" KV-event fault) */
    size_t tok_cap;
    struct event *timer;
    struct event *replay_ev; /* the replay socket's ZMQ_FD: requests answered on arrival */
    bool stepping;
    uint64_t step_due_ns; /* when the current step's modelled time is up */
    uint64_t n_live;      /* admitted requests not yet finished */
    uint64_t encode_errors, publish_errors;
    double lag_s;         /* real time beyond the modelled, summed over steps */
} rank_t;

/* Where a request is: in its rank's engine, or (a decode worker's) still getting its KV. */
typedef enum mq_phase {
    MQ_ENGINE = 0, /* added to the engine */
    MQ_FETCH,      /* asking the prefill worker for the KV */
    MQ_XFER,       /* the KV's modelled transfer time */
} mq_phase_t;

typedef struct mreq mreq_t;

/* How a decode request's KV read ended (mocker_kv.c -> its kv_done). */
typedef enum mk_kv_outcome {
    MK_KV_LOADED = 0, /* the KV is in: admit with it */
    MK_KV_FAILED,     /* the read failed (why): recompute or fail, as configured */
    MK_KV_ERROR,      /* a local error (why): fail the request */
    MK_KV_ABANDONED,  /* the client had left: free the request */
} mk_kv_outcome_t;
typedef void (*mk_kv_done_fn)(mreq_t *q, mk_kv_outcome_t how, const char *why);

struct mreq {
    kvr_mocker_t *m;
    rank_t *rk;
    uint64_t id;
    struct evhttp_request *req;
    struct evhttp_connection *conn;
    bool chat, stream, include_usage, want_worker;
    uint32_t prompt_tokens;
    uint64_t created;
    uint64_t arrival_ns;
    struct evbuffer *text; /* non-streaming: the output so far */
    struct mreq *prev, *next; /* non-streaming: the list the disconnect sweep probes */
    char rid[KVR_OAI_ID_BYTES];
    /* disaggregation (mocker_kv.c) */
    bool hold;           /* prefill role: the engine keeps the KV when it finishes */
    bool by_room;        /* held for a bootstrap room (else for a pull by xfer_id) */
    uint64_t room;
    char xfer_id[48];    /* pull: the remote_request_id its answer names */
    mq_phase_t phase;
    bool gone;           /* the client left during MQ_FETCH: freed when the fetch ends */
    uint32_t *tokens;    /* MQ_FETCH, MQ_XFER: the engine request to add once the KV is in */
    uint32_t n_tokens, max_tokens;
    const char *lora;
    struct evhttp_connection *fetch_conn;
    struct evhttp_request *fetch_req;
    struct event *xfer_timer;
    uint32_t xfer_blocks;
    char peer[KVR_DISAGG_STR_BYTES + 16]; /* the prefill worker read from, host:port */
    mk_kv_done_fn kv_done; /* MQ_FETCH, MQ_XFER: called once when the read ends */
};

/* A finished prefill whose KV waits for its decode worker (the engine holds the blocks). */
typedef struct mk_hold {
    struct mk_hold *next;
    char xfer_id[48]; /* pull: the remote_request_id */
    bool by_room;
    uint64_t room;    /* bootstrap */
    rank_t *rk;
    uint64_t eng_id;
    uint32_t blocks;
    uint64_t deadline_ns;
} mk_hold_t;

/* A decode worker's bootstrap read that arrived before its prefill finished. */
typedef struct mk_park {
    struct mk_park *next;
    kvr_mocker_t *m;
    struct evhttp_request *req;
    uint64_t room;
    uint64_t deadline_ns;
} mk_park_t;

typedef struct mk_kv_stats {
    uint64_t holds, pulls_served, pulls_unknown, holds_expired, parks_expired;
    uint64_t transfers_ok, transfers_failed, transfers_invalid, transfers_mismatch;
    uint64_t transfer_blocks, abandoned;
    double transfer_s; /* modelled */
} mk_kv_stats_t;

#define MAX_LORAS 16

struct kvr_mocker {
    kvr_mocker_config_t cfg;
    char lora[MAX_LORAS][256]; /* cfg.loras split (engine requests borrow these names) */
    size_t n_lora;
    struct event_base *base;
    struct evhttp *http;
    uint16_t port;
    rank_t ranks[KVR_MOCKER_MAX_DP];
    uint32_t rr;            /* round-robin start for ties */
    uint64_t next_id;
    uint64_t id_state; /* the response ids' generator: random per process, so two mockers
                          (or one restarted) never answer with the same id, as vLLM's uuids */
    struct event *replay_tick;
    struct event *sweep_tick;  /* probes non-streaming clients for a disconnect */
    mreq_t *waiting_whole;     /* non-streaming requests in flight (list head) */
    kvr_oai_decoder_t *dec;
    kvr_json_writer_t w;
    kvr_reply_t rep;        /* replies (http/reply.h): over w, OpenAI's error shape */
    struct evbuffer *out;   /* stream chunks */
    uint32_t *toks;         /* tokenized text prompts */
    size_t toks_cap;
    char *chat;             /* rendered chat templates */
    size_t chat_cap;
    kvr_tokmodel_t *tok;                     /* cfg.tokenizer's (NULL: the toy tokenizer) */
    kvr_tokmodel_scratch_t *tok_s;
    kvr_json_writer_t conv_w;                /* the chat template's input */
    kvr_prom_t prom;
    kvr_hist_t h_ttft, h_e2e;
    uint64_t http_errors[6]; /* 400, 404, 413, 500, 503, other */
    uint64_t requests_disconnected;
    kvr_ratelimit_t rl_events;
    /* disaggregation (mocker_kv.c) */
    mk_hold_t *holds;
    mk_park_t *parks;
    struct evhttp *boot_http; /* prefill role, bootstrap convention: the bootstrap server */
    struct event *park_ev;    /* serves parked reads once their room is held */
    uint16_t boot_port;
    mk_kv_stats_t kv;
    kvr_ratelimit_t rl_kv;
};

/* ---- time ------------------------------------------------------------------------------ */

static inline uint64_t mk_mono_ns(void)
{
    return kvr_now_ns();
}

/* Modelled seconds as real nanoseconds (divided by --speedup), capped at an hour. */
static inline uint64_t mk_modelled_ns(const kvr_mocker_t *m, double seconds)
{
    double ns = seconds * 1e9 / m->cfg.speedup;
    return ns > 3.6e12 ? (uint64_t)3.6e12 : (uint64_t)ns;
}

static inline struct timeval mk_tv_of(uint64_t ns)
{
    return (struct timeval){.tv_sec = (time_t)(ns / 1000000000u),
                            .tv_usec = (suseconds_t)((ns % 1000000000u) / 1000u)};
}

#endif /* KVR_MOCKER_STATE_H */
