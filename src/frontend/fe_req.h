/*
 * fe_req.h: one front-end request (fe_req_t) and its lifecycle (fe_req.c). The state machine
 * (frontend.c) drives it; the helpers (fe_body.c, fe_relay.c, fe_tokenize.c, fe_disagg.c,
 * fe_reqmetrics.c) read and write the groups named in their headers, never the machine.
 *
 * The groups: client (the client's request and connection, and what we answer it), prompt
 * (its body, ids, hashes), hints (what the client asked of routing), route (the attempts and
 * the booking, held by its handle alone), up (the worker call in flight: a /tokenize or a
 * leg's call), leg (the leg being run: aggregated requests have one, the whole request) and
 * dis (the disaggregated part, the leg planner's: NULL unless the request was planned
 * disaggregated).
 *
 * Invariants (fe_req_verify asserts them, under !NDEBUG, at the machine's transitions):
 *   - up.req and up.uc are both set or both NULL; a set uc is busy;
 *   - route.handle != KVR_REQ_HANDLE_NONE (booked) only out of PH_QUEUED; PH_QUEUED has a
 *     ticket and no call;
 *   - client.req set => client.conn set; client.kept (the call goes on after the client left)
 *     => client.req NULL and no reply started;
 *   - client.slow_abort => retry_ev exists (the abort continues from it);
 *   - route.n_tried, prompt.n_tok_tried <= FE_MAX_ATTEMPTS; leg.pin set;
 *   - the forward body is the client's or the rebuilt one (or dangling once the client left);
 *   - dis NULL => the leg is the whole request (no pool shape, the worker pin);
 *   the planner's part has its own (fe_disagg_verify; the machine checks both).
 * Ownership: p owns every pointer it holds but client.req / client.conn (libevent's),
 * prompt.client_body (the client's input buffer), up.req (libevent's), up.uc (its pool's,
 * lent), up.pool and leg.body (the planner's part, or NULL). Threads: the HTTP thread only.
 * Cost: one calloc a request; the copies it needs (ids, routing fields, a rebuilt body).
 */
#ifndef KVR_FRONTEND_FE_REQ_H
#define KVR_FRONTEND_FE_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/http.h>
#include <xxhash.h>

#include "frontend/fe_ctx.h"
#include "frontend/fe_upstream.h"

struct fe_tok_result; /* fe_tokenize.h */

typedef enum fe_phase {
    PH_START = 0,
    PH_TOKENIZE,   /* a /tokenize call in flight */
    PH_QUEUED,     /* waiting in the router's queue */
    PH_UPSTREAM,   /* the generation request in flight */
    PH_RETRY,      /* retry_ev pending */
} fe_phase_t;

/* A worker the client named (headers or nvext). */
typedef struct fe_pin {
    bool has, has_rank; /* a rank means nothing without its worker */
    uint64_t worker;
    uint32_t rank;
} fe_pin_t;

/* What a leg's call must do should its client leave while it runs. */
typedef enum fe_keep {
    FE_KEEP_NONE = 0,   /* cancelled with its client */
    FE_KEEP_TO_HEADERS, /* goes on until the worker answers (it has then read the KV) */
    FE_KEEP_TO_ANSWER,  /* goes on until its whole answer (a prefill: its KV is released) */
} fe_keep_t;

/* The leg being run: what the machine needs to place it and send its call. The planner
 * (fe_disagg.h) sets it; an aggregated request runs one, the whole request (fe_leg_whole). */
typedef struct fe_leg {
    void (*shape)(kvr_route_req_t *q); /* its placement's pool and overrides; NULL: as asked */
    const fe_pin_t *pin;               /* the client's pin for it (hints.worker or hints.pf) */
    const char *body;                  /* what its call sends; NULL: prompt.body */
    size_t body_len;
    uint64_t silence_ms;               /* the silence its call is allowed */
    bool may_stream;                   /* its call streams when the client asked (else whole) */
    fe_keep_t keep;                    /* its call should the client leave */
} fe_leg_t;

/* The client: its request and connection, and what we answer it. */
typedef struct fe_client {
    struct evhttp_request *req;       /* NULL once answered (fe_client_take) or gone */
    struct evhttp_connection *conn;
    kvr_oai_endpoint_t ep;
    bool stream, want_worker;
    bool usage_asked;                 /* its answer carries usage (a stream only when asked) */
    bool reply_started;               /* SSE headers sent to the client */
    bool slow_abort;                  /* its pending output passed the cap: aborted from retry_ev */
    fe_keep_t kept;                   /* it left while a call goes on (FE_KEEP_NONE: it did not) */
    char *auth;                       /* its Authorization, when forwarded (config) */
    char nvext[192];                  /* "nvext":{"worker_id":{...}} when it asked */
    size_t nvext_len;
    uint16_t model_slot;              /* its per-model metrics (fe_reqmetrics.c) */
    uint64_t arrival_ns;
    uint64_t first_token_ns, last_token_ns; /* token chunks relayed (0: none yet) */
    uint64_t gen_tokens;              /* token chunks relayed */
} fe_client_t;

/* The prompt: the body, the ids, the hashes. */
typedef struct fe_prompt {
    const char *client_body; /* the client's body (its input buffer, pulled up) */
    size_t client_body_len;
    bool rewrite;            /* the body cannot go verbatim */
    bool drop_prompt;        /* completions: the prompt member becomes the ids */
    bool kvt_counted;        /* its KV-transfer members were stripped (counted once) */
    char *body_own;          /* the rebuilt body, when rewrite */
    const char *body;        /* the body for the workers (the client's, or body_own) */
    size_t body_len;
    uint32_t *tokens;        /* NULL until the ids are known */
    size_t n_tokens;
    /* tokenize (fe_tokenize.c) */
    void (*tok_done)(fe_req_t *p, const struct fe_tok_result *r); /* its call's one callback */
    char *tok_body;
    size_t tok_body_len;
    XXH128_hash_t tok_key;
    uint64_t tok_tried[FE_MAX_ATTEMPTS];
    unsigned n_tok_tried;
    /* the model and the images' hashes */
    char *model;             /* "" when it named none */
    size_t model_len;
    uint64_t *images;        /* its chat images' hashes; NULL: none */
    size_t n_images;
    kvr_block_mm_t *mm;      /* every block carries the images (their positions are unknown) */
    size_t n_mm;
} fe_prompt_t;

/* What the client asked of routing (nvext, and the headers that override it). */
typedef struct fe_hints {
    char *lora;
    size_t lora_len;
    char session[KVR_OAI_MAX_SESSION_BYTES + 1]; /* sticky session id; "" = none */
    size_t session_len;
    bool session_close;
    bool has_allowed;
    uint64_t *allowed;
    size_t n_allowed;
    fe_pin_t worker;      /* the (decode) worker */
    fe_pin_t pf;          /* the prefill worker (disaggregated fleets) */
    double priority_jump; /* queue head start, seconds */
    bool has_priority;    /* the engine priority forwarded as the body's "priority" */
    int32_t priority;
    bool has_eot;
    uint32_t eot;
} fe_hints_t;

/* The route: attempts and the booking (its handle: the one place it is held). */
typedef struct fe_route {
    kvr_req_handle_t handle; /* the booking; KVR_REQ_HANDLE_NONE: none */
    kvr_ticket_t ticket;     /* queued in the scheduler (PH_QUEUED) */
    kvr_worker_t worker;     /* the last placement's worker */
    char rid[KVR_LOAD_MAX_ID_BYTES + 1];
    size_t rid_len;
    uint64_t cached_tokens;  /* on the chosen worker, at routing */
    uint64_t events_cached_tokens; /* ... as its KV events say (differs while it is routed
                                      approximately) */
    uint32_t block_size;     /* of the chosen worker's model (output-block accounting) */
    bool first_token_sent;   /* the booking was told its first token */
    bool leg_pending;        /* retry_ev places the next leg (not a retry) */
    uint64_t step_seen;      /* its worker's step clock: the step it last had a token of */
    uint64_t tried[FE_MAX_ATTEMPTS]; /* workers whose upstream failed */
    unsigned n_tried, attempts;      /* attempts: of the current leg */
    uint64_t pin_only;               /* the allowed list of a leg pinned to a worker */
    uint64_t *scratch;               /* the excluded ids: tried + url-less (when any) */
    size_t cap_scratch;
    char last_fail[160];
} fe_route_t;

/* The worker call in flight (a /tokenize, or the current leg's). */
typedef struct fe_up {
    struct evhttp_request *req;
    upconn_t *uc;
    upool_t *pool;
    bool err_set;
    up_kind_t err;
    int code;
    bool got_headers;     /* the worker answered (its first byte): no retry from here */
    bool sse_mode;
    bool leg_sent;        /* a call of the current leg was issued */
    bool has_cached;      /* its answer reported usage.prompt_tokens_details.cached_tokens */
    uint64_t cached;      /* ... this many */
    struct evbuffer *sse; /* upstream bytes of an event not yet complete */
} fe_up_t;

struct fe_req {
    kvr_frontend_t *fe;
    fe_req_t *prev, *next; /* fe->live */
    fe_phase_t phase;
    struct event *retry_ev; /* failures, leg switches and aborts continue from it */
    fe_client_t client;
    fe_prompt_t prompt;
    fe_hints_t hints;
    fe_route_t route;
    fe_up_t up;
    fe_leg_t leg;
    fe_dreq_t *dis;         /* the planner's part; NULL unless planned disaggregated */
};

/* A new request of client req on endpoint ep, arrived at t0 (mono ns); NULL out of memory. */
fe_req_t *fe_req_new(kvr_frontend_t *fe, struct evhttp_request *req, kvr_oai_endpoint_t ep,
                     uint64_t t0);
/* Frees what p owns and p (unlinked, its planner part returned). */
void fe_req_free(fe_req_t *p);
void fe_req_link(fe_req_t *p);
void fe_req_unlink(fe_req_t *p);
/* The whole request as its one leg (an aggregated request's, or a fallback's). */
void fe_leg_whole(fe_req_t *p);
static inline bool fe_req_booked(const fe_req_t *p)
{
    return p->route.handle != KVR_REQ_HANDLE_NONE;
}
/* Whether the current leg's call streams. */
static inline bool fe_leg_streams(const fe_req_t *p)
{
    return p->client.stream && p->leg.may_stream;
}
/* The client's request, detached: nothing may reach it through p afterwards (NULL if gone). */
struct evhttp_request *fe_client_take(fe_req_t *p);
/* Bytes handed to libevent for the client and not yet written to its socket. */
size_t fe_client_backlog(const fe_req_t *p);
/* p's ids (a copy); false out of memory. */
bool fe_set_tokens(fe_req_t *p, const uint32_t *t, size_t n);
/* libevent's error callback of p's calls: the kind, for the completion callback. */
void fe_on_up_error(enum evhttp_request_error err, void *arg);
/* Asserts the invariants above (a no-op under NDEBUG). */
void fe_req_verify(const fe_req_t *p);


#endif
