/*
 * loadgen.h: the one closed-loop HTTP load generator of the benchmarks (bench route drives a
 * router's POST /v1/route with it, bench mocker a mocker's POST /v1/completions).
 *
 * How: --clients keep-alive connections (libevent evhttp client) spread over --threads event
 * loops, one event_base and one thread each. Each client has one request outstanding at all
 * times: the response callback sends the next (closed loop), or, paced (interval_ns), waits
 * for its slot (exact timerfd wake-ups; a client that fell behind sends at once but does not
 * burst to catch up). Latency is one CLOCK_MONOTONIC interval from just before
 * evhttp_make_request() to the response callback. Bodies are built before timing and sent by
 * reference. A run: warmup (connections open, unmeasured), then the window: duration, or until
 * `requests` responses; responses completing in the window are counted, then in-flight
 * requests drain (not counted; a drain longer than drain_ns counts them as stuck). Errors are
 * counted by kind (an HTTP status, a connection failure by evhttp's reason, or a driver's own
 * kind); after a connection failure the client pauses retry_ms so a dead server is not spun
 * on; abort_errors errors (and 10x the successes) end the run early.
 *
 * The driver says what a response means: check() returns KVR_LG_GOOD (with the units and
 * events it verified, e.g. completion tokens and SSE events), an error kind, or KVR_LG_LATER
 * when it sent an untimed follow-up itself (bench route's DELETE) and will call
 * kvr_lg_followup_done() from that follow-up's callback.
 *
 * Memory: bodies are the caller's; samples and loops are the run's, freed by kvr_lg_run.
 * Threads: one per loop (the caller's thread waits, or samples at the window's edges through
 * at_window); the loops share only the run's atomics.
 * Invariants: one request outstanding per client; the verdict (kvr_lg_run_failed) is the same
 * for every benchmark that uses it. Cost: see loadgen.c.
 */
#ifndef KVR_BENCH_LOADGEN_H
#define KVR_BENCH_LOADGEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/http.h>

/* Error kinds: an HTTP status (100..599), a driver's own (-99..-1), or these. */
#define KVR_LG_CONN (-100)   /* connection failure without a reason */
#define KVR_LG_OTHER (-300)  /* kinds beyond KVR_LG_MAX_KINDS */
#define KVR_LG_EVREQ (-1000) /* minus an evhttp_request_error */
#define KVR_LG_MAX_KINDS 32

#define KVR_LG_GOOD 0
#define KVR_LG_LATER 1

/* A request body, sent by reference. */
typedef struct kvr_lg_body {
    char *data;
    size_t len;
    char len_str[24];
} kvr_lg_body_t;

/* Writes v in decimal at p; returns the end. */
char *kvr_lg_put_u32(char *p, uint32_t v);
/* Sets len and len_str once data is written up to end. */
void kvr_lg_body_done(kvr_lg_body_t *b, const char *end);
void kvr_lg_free_bodies(kvr_lg_body_t *b, size_t n);

/* Writes one body for the prompt tok[0..n); false when out of memory. */
typedef bool (*kvr_lg_make_body_fn)(kvr_lg_body_t *b, const uint32_t *tok, size_t n, void *arg);
/* n bodies of tokens-id prompts (ids < vocab), deterministic from seed: the first
 * round(prefix_share * tokens) ids of each are one of n_prefixes shared prefixes (so a KV-aware
 * server sees overlap), the rest unique. NULL when out of memory. */
kvr_lg_body_t *kvr_lg_make_bodies(uint64_t seed, uint64_t tokens, double prefix_share,
                                  size_t n_prefixes, uint32_t vocab, size_t n,
                                  kvr_lg_make_body_fn make, void *arg);

typedef struct kvr_lg_err {
    int tag; /* the driver's request kind (0: the timed request; bench route: 1 = DELETE) */
    int code;
    uint64_t n;
} kvr_lg_err_t;

typedef struct kvr_lg_errs {
    kvr_lg_err_t k[KVR_LG_MAX_KINDS];
    size_t n_kinds;
    uint64_t other, total;
} kvr_lg_errs_t;

void kvr_lg_errs_add(kvr_lg_errs_t *e, int tag, int code, uint64_t n);
void kvr_lg_errs_merge(kvr_lg_errs_t *into, const kvr_lg_errs_t *e);
/* "route 500 x12, route eof x1, delete 404 x3": tag_names[tag] first when given; a driver's
 * kinds named by driver_kind (NULL: "connect"). */
void kvr_lg_errs_format(const kvr_lg_errs_t *e, const char *const *tag_names,
                        const char *(*driver_kind)(int code), char *buf, size_t len);

typedef struct kvr_lg_client kvr_lg_client_t;

typedef struct kvr_lg_driver {
    /* Per request, before it goes (e.g. a chunked-body callback, state reset); may be NULL. */
    void (*prepare)(kvr_lg_client_t *c, struct evhttp_request *req);
    /* A response with a status (any): KVR_LG_GOOD, an error kind, or KVR_LG_LATER. */
    int (*check)(kvr_lg_client_t *c, struct evhttp_request *req, uint64_t *units, uint64_t *events);
    size_t state_bytes; /* the driver's per-client state (kvr_lg_state) */
} kvr_lg_driver_t;

typedef struct kvr_lg_config {
    const kvr_lg_driver_t *drv;
    void *drv_arg;               /* kvr_lg_arg() */
    const char *addr, *host_hdr; /* numeric address; Host header */
    uint16_t port;
    const char *path; /* POST target */
    const char *content_type; /* of the bodies; NULL = application/json */
    size_t clients, threads;
    const kvr_lg_body_t *bodies;
    size_t n_bodies;
    size_t per_client; /* > 0: client i owns bodies [i*per, (i+1)*per); 0: all share
                          the pool, client i starting at i * n_bodies / clients */
    double warmup_s, duration_s;
    uint64_t requests;    /* > 0: the window ends at this many responses */
    uint64_t interval_ns; /* > 0: each client's pace */
    int timeout_s;        /* per request and connect */
    unsigned tick_ms, retry_ms;
    uint64_t drain_ns;
    uint64_t abort_errors;
    size_t max_single_io; /* bytes per read or write call */
    /* called from the caller's thread at the window's start (false) and end (true); NULL:
     * the caller's thread only waits */
    void (*at_window)(void *arg, bool end);
    void *window_arg;
} kvr_lg_config_t;

typedef struct kvr_lg_result {
    double *ns; /* latencies of the window's good responses (caller frees) */
    size_t n_ns;
    double sum_ns, window_ns; /* window_ns: NAN when nothing was measured */
    uint64_t units, events, followups;
    kvr_lg_errs_t errs; /* the window's; every phase's when aborted or nothing good */
    uint64_t stuck;
    bool aborted;
} kvr_lg_result_t;

/* One run. false on a setup failure (message printed, prefixed with who). */
bool kvr_lg_run(const kvr_lg_config_t *cfg, const char *who, kvr_lg_result_t *res);
/* The verdict on one run of a point, as the benchmarks judge it. */
typedef struct kvr_lg_verdict_in {
    unsigned run;         /* its number, from 1 */
    bool aborted;         /* kvr_lg_result_t.aborted */
    uint64_t ok, errors;  /* good responses, errors */
    double attempts;      /* requests tried (follow-ups included) */
    double window_s;      /* the measured window */
    double fail_fraction; /* errors above this fraction of attempts fail the run */
} kvr_lg_verdict_in_t;
/* Whether the run failed: aborted, no good response, or too many errors; why says which. */
bool kvr_lg_run_failed(const kvr_lg_verdict_in_t *v, char *why, size_t cap);
/* The stderr line for requests still unanswered after the drain (none: nothing printed). */
void kvr_lg_report_stuck(const char *who, uint64_t stuck, uint64_t drain_ns);

/* ---- for drivers ---- */
void *kvr_lg_state(kvr_lg_client_t *c);
void *kvr_lg_arg(const kvr_lg_client_t *c);
struct evhttp_connection *kvr_lg_conn(const kvr_lg_client_t *c);
/* The error callback to give a follow-up request (records evhttp's reason). */
void kvr_lg_on_error(enum evhttp_request_error err, void *client);
/* Counts an error of the client's without failing its request (e.g. a follow-up that could
 * not be sent after a good response). */
void kvr_lg_count_error(kvr_lg_client_t *c, int tag, int code);
/* A follow-up sent after KVR_LG_LATER ended: ok, or failed with kind (tag names it). */
void kvr_lg_followup_done(kvr_lg_client_t *c, struct evhttp_request *req, bool ok, int tag);

#endif
