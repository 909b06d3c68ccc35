/*
 * replay_driver.h: the open-loop HTTP driver of `kvrouter replay`: sends n streaming
 * /v1/completions requests, each at its own arrival time, to one OpenAI-compatible endpoint
 * (the router, or one engine) and times what comes back.
 *
 * Open loop: request i is sent at arrival_s[i] after the run's start whatever the earlier
 * requests are doing, so a slow server sees the load it would see in production instead of
 * slowing the client down (a closed loop would hide its queueing). Only max_inflight caps it:
 * beyond that many outstanding requests, due requests wait (in arrival order) for one to
 * finish; each sample keeps when it was due and when it was sent, and the wait is reported, so
 * a run the client could not keep up with says so. Latencies are measured from the send.
 *
 * Per request (one libevent loop, evhttp client, keep-alive connections pooled up to
 * max_inflight): the body comes from the caller's callback at send time (not held for the
 * whole trace); the response is read as it arrives (wire/oai_stream.h): TTFT = send to the
 * first event with text, ITL = (last text event - first) / (text events - 1), E2E = send to
 * the end of the body; usage (prompt, cached, completion tokens) and nvext.worker_id from the
 * chunks. Failures are classified (kvr_replay_outcome_t): a status other than 200 (its error
 * message kept), no connection, a reset or early close, the per-request timeout (total time,
 * send to end), a malformed stream (including one that ends without [DONE]) and an error
 * event. Nothing is retried.
 *
 * Ownership: samples are the caller's (n of them); the driver owns its loop, connections and
 * per-request state, all freed before kvr_replay_run returns. Threads: kvr_replay_run runs its
 * own event loop on the calling thread and returns when every request has finished (or the run
 * was interrupted by SIGINT/SIGTERM when catch_signals is set: unsent requests are marked
 * NOT_SENT and outstanding ones cancelled). Cost: the client side of one request is the body's
 * encoding (by the callback) plus one JSON parse per streamed event.
 * Invariants: every sample is filled exactly once (its outcome NOT_SENT until then).
 */
#ifndef KVR_NET_REPLAY_DRIVER_H
#define KVR_NET_REPLAY_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/http.h"

/* ---- the endpoint ----------------------------------------------------------------------- */

/* GET {base}/v1/models and the first model's id into out. KVR_OK; KVR_EIO (no connection,
 * timeout, a status other than 200) or KVR_EPARSE (a body without data[0].id), err saying
 * which. */
int kvr_http_first_model(const kvr_http_target_t *t, int timeout_ms, char *out, size_t cap,
                         char *err, size_t err_len);

/* ---- one run ---------------------------------------------------------------------------- */

typedef enum kvr_replay_outcome {
    KVR_REPLAY_OK = 0,
    KVR_REPLAY_HTTP_STATUS,   /* a status other than 200 (http_status) */
    KVR_REPLAY_CONNECT,       /* no connection (refused, unreachable) */
    KVR_REPLAY_EOF,           /* the connection closed or broke before the response ended */
    KVR_REPLAY_TIMEOUT,       /* timeout_s passed since the send */
    KVR_REPLAY_BAD_STREAM,    /* malformed SSE or JSON, or no [DONE] at the end */
    KVR_REPLAY_STREAM_ERROR,  /* the server sent an error event */
    KVR_REPLAY_CANCELLED,     /* in flight when the run was interrupted */
    KVR_REPLAY_NOT_SENT,      /* the run was interrupted before its time */
    KVR_REPLAY_N_OUTCOMES
} kvr_replay_outcome_t;

/* "ok", "http", "connect", "eof", "timeout", "bad-stream", "stream-error", "cancelled",
 * "not-sent". */
const char *kvr_replay_outcome_name(kvr_replay_outcome_t o);

typedef struct kvr_replay_sample {
    double arrival_s;           /* when it was due, since the run's start */
    double sent_s;              /* when it was sent (NAN: never) */
    double ttft_ms;             /* NAN: no text event */
    double itl_ms;              /* NAN: fewer than two text events */
    double e2e_ms;              /* NAN unless the response ended (OK or not) */
    uint32_t token_events;      /* events with text */
    bool has_usage, has_cached, has_worker;
    uint64_t prompt_tokens, cached_tokens, output_tokens; /* from usage */
    uint64_t worker_id;         /* nvext.worker_id (the prefill worker) */
    bool waited;                /* held back by max_inflight */
    kvr_replay_outcome_t outcome;
    int http_status;            /* the response's status; 0 when none */
} kvr_replay_sample_t;

typedef struct kvr_replay_progress {
    size_t total, sent, done, failed, inflight, waiting; /* waiting: due, held by the cap */
    double elapsed_s;
} kvr_replay_progress_t;

/* The body of request i, in (*data, *len bytes), valid until the next call (the driver
 * copies it). KVR_OK, or an error that stops the run (err set). */
typedef int (*kvr_replay_body_fn)(void *arg, size_t i, const char **data, size_t *len,
                                  char *err, size_t err_len);
typedef void (*kvr_replay_progress_fn)(void *arg, const kvr_replay_progress_t *p);

#define KVR_REPLAY_MAX_TARGETS 4

typedef struct kvr_replay_config {
    const kvr_http_target_t *target; /* probed (addr set); used when n_targets is 0 */
    const kvr_http_target_t *targets; /* or several (router replicas behind a balancer): */
    size_t n_targets;                 /* request i goes to targets[i % n_targets] */
    const char *path;                /* appended to the base path, e.g. "/v1/completions" */
    size_t n;                        /* requests */
    const double *arrival_s;         /* n, non-decreasing, seconds after the start */
    kvr_replay_body_fn body;
    void *body_arg;
    uint32_t max_inflight;           /* >= 1 */
    double timeout_s;                /* > 0, per request */
    kvr_replay_progress_fn progress; /* NULL: none; else every progress_ms and at the end */
    void *progress_arg;
    uint32_t progress_ms;
    bool catch_signals;              /* SIGINT / SIGTERM end the run early */
} kvr_replay_config_t;

typedef struct kvr_replay_stats {
    double duration_s;               /* the first send to the last response's end */
    size_t sent, ok, failed;         /* failed: sent and not OK (cancelled ones excluded) */
    size_t by_outcome[KVR_REPLAY_N_OUTCOMES];
    size_t waited;                   /* requests held back by max_inflight */
    uint32_t peak_inflight;
    size_t connections;              /* opened */
    bool interrupted;
    char first_error[320];           /* the first failure, described ("" when none) */
} kvr_replay_stats_t;

/* Runs the requests; samples[0..n) are filled. KVR_OK when every request was attempted
 * (failures are in the samples and stats) and also when a signal ended the run early
 * (stats->interrupted); KVR_EINVAL (config), KVR_ENOMEM, or the body callback's error (err
 * set; the run stops). */
int kvr_replay_run(const kvr_replay_config_t *cfg, kvr_replay_sample_t *samples,
                   kvr_replay_stats_t *stats, char *err, size_t err_len);

#endif /* KVR_NET_REPLAY_DRIVER_H */
