/*
 * mocker_int.h: what the mocker's files share (mocker_server.c: the HTTP server, the ranks'
 * stepping and the token stream; mocker_kv.c: the disaggregated roles' KV transfer). Not a
 * public interface. Threads: the loop thread only.
 */
#ifndef KVR_NET_MOCKER_INT_H
#define KVR_NET_MOCKER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/http.h>

#include "sim/engine.h"
#include "events/kv_publisher.h"
#include "base/log.h"
#include "mocker/mocker_server.h"
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
    bool batch_open;
    uint64_t *scratch; /* engine hashes of one event */
    size_t scratch_cap;
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

typedef struct mreq {
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
} mreq_t;

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
    struct event *replay_tick;
    struct event *sweep_tick;  /* probes non-streaming clients for a disconnect */
    mreq_t *waiting_whole;     /* non-streaming requests in flight (list head) */
    kvr_oai_decoder_t *dec;
    kvr_json_writer_t w;
    struct evbuffer *out;   /* reply bodies and stream chunks */
    uint32_t *toks;         /* tokenized text prompts */
    size_t toks_cap;
    char *chat;             /* rendered chat templates */
    size_t chat_cap;
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

/* mocker_server.c */
uint64_t mk_mono_ns(void);
void mk_reply_body(kvr_mocker_t *m, struct evhttp_request *req, int code, const char *ctype,
                   const char *body, size_t len);
void mk_reply_json(kvr_mocker_t *m, struct evhttp_request *req, int code);
void mk_reply_error(kvr_mocker_t *m, struct evhttp_request *req, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Adds q (MQ_FETCH or MQ_XFER, its request copied in q) to its engine: KVR_OK, or the
 * engine's refusal (answered to the client, q freed). */
int mk_admit(mreq_t *q, bool kv_loaded);
/* Ends q's answer with an error (an error event on a stream, else the status) and frees q. */
void mk_fail(mreq_t *q, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void mk_mreq_free(mreq_t *q);

/* mocker_kv.c */
int mk_kv_init(kvr_mocker_t *m, char *err, size_t err_len);
void mk_kv_free(kvr_mocker_t *m);
/* Expires holds and parked reads past their time. */
void mk_kv_sweep(kvr_mocker_t *m, uint64_t now_ns);
/* The engine id a rank names in kv_transfer_params ("mocker-<port>-<rank>"). */
void mk_engine_id(const rank_t *rk, char *out, size_t cap);
/* A finished hold request's KV is now held: registered for its reader. For a pull, returns
 * the member its answer carries ("kv_transfer_params":{...}, malloc'd, NUL-terminated);
 * NULL otherwise or out of memory (the hold is then released at once). */
char *mk_kv_held(mreq_t *q, const kvr_engine_output_t *o);
/* POST /kv/pull (on the HTTP port): a decode worker reads a held KV. */
void mk_h_pull(kvr_mocker_t *m, struct evhttp_request *req);
/* A decode worker's request carrying a prefill's whereabouts: fetches the KV (q in MQ_FETCH),
 * then admits q with it. */
void mk_kv_fetch(mreq_t *q, const kvr_disagg_req_t *d);
/* The client of q left: stops q's fetch or transfer (a fetch in flight is let finish, so the
 * prefill worker frees its KV, and q is freed then). True when q is kept for now. */
bool mk_kv_client_gone(mreq_t *q);
void mk_kv_metrics(kvr_mocker_t *m);

#endif /* KVR_NET_MOCKER_INT_H */
