/*
 * replay_driver.c: see replay_driver.h.
 *
 * Structure: one event loop; a slot per outstanding request (at most max_inflight, made on
 * first use and reused, each with its stream parser and timeout timer); a pool of keep-alive
 * evhttp connections (one request at a time each, so a slow stream never delays another
 * request). Sending happens only in pump(), run from the arrival timer or from a "pump" event
 * activated when a request finishes, never from inside an evhttp callback: evhttp may call a
 * request's callbacks from within evhttp_make_request (a refused local connect), and this
 * keeps that from recursing.
 *
 * libevent facts relied on (2.1): the chunk callback must consume the input buffer (evhttp
 * drains it afterwards); a failed request's done callback gets NULL after the error callback
 * named the reason, or a request with response code 0 when the connect failed; cancelling a
 * request calls its error callback (EVREQ_HTTP_REQUEST_CANCEL) but not its done callback.
 * Invariants: a slot is ACTIVE exactly while its request is outstanding, and finish() runs once
 * per request (the sample is filled there only); a connection serves one request at a time.
 * The blocking pieces before a run (the endpoint, /v1/models) are http/client.h's.
 * Ownership: the driver's loop, slots and connections are freed before kvr_replay_run returns.
 * Threads: the caller's, which runs the loop. Cost: per request, the body callback and one
 * stream parse per event; connections are reused (at most max_inflight per target).
 */
#include "replay/replay_driver.h"
#include "base/clock.h"

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "kvrouter.h"
#include "http/http.h"
#include "wire/oai_stream.h"

#define ERR_BODY_BYTES 2048 /* of a non-200 body, kept for its message */
#define MODELS_BODY_BYTES 65535 /* of a /v1/models answer */

static struct timeval tv_of(double s)
{
    if (!(s > 0))
        s = 0;
    struct timeval tv = {(time_t)s, (suseconds_t)((s - floor(s)) * 1e6)};
    return tv;
}

const char *kvr_replay_outcome_name(kvr_replay_outcome_t o)
{
    static const char *names[] = {"ok",           "http",      "connect",  "eof",
                                  "timeout",      "bad-stream", "stream-error",
                                  "cancelled",    "not-sent"};
    return (unsigned)o < KVR_REPLAY_N_OUTCOMES ? names[o] : "?";
}

/* ---- GET /v1/models ---------------------------------------------------------------------- */

static const char *evreq_error_name(int e)
{
    switch (e) {
    case EVREQ_HTTP_TIMEOUT:
        return "timed out";
    case EVREQ_HTTP_EOF:
        return "connection closed";
    case EVREQ_HTTP_INVALID_HEADER:
        return "invalid HTTP header";
    case EVREQ_HTTP_BUFFER_ERROR:
        return "connection error";
    case EVREQ_HTTP_REQUEST_CANCEL:
        return "cancelled";
    case EVREQ_HTTP_DATA_TOO_LONG:
        return "response too long";
    default:
        return "failed";
    }
}

int kvr_http_first_model(const kvr_http_target_t *t, int timeout_ms, char *out, size_t cap,
                         char *err, size_t err_len)
{
    kvr_http_target_t at = *t;
    kvr_http_resp_t r = {0};
    char path[300], why[240];
    snprintf(path, sizeof path, "%s/v1/models", t->base_path);
    int rc = kvr_http_get(&at, "/v1/models", timeout_ms, MODELS_BODY_BYTES, &r, why, sizeof why);
    const char *body = r.buf ? r.buf + r.body_at : "";
    size_t len = r.len - r.body_at;
    if (rc != KVR_OK) {
        snprintf(err, err_len, "GET %s: %s", path, why);
        rc = KVR_EIO;
    } else if (r.status != 200) {
        char msg[200];
        if (!kvr_oai_error_message(body, len, msg, sizeof msg))
            snprintf(msg, sizeof msg, "%.120s", body);
        snprintf(err, err_len, "GET %s: HTTP %d: %s", path, r.status, msg);
        rc = KVR_EIO;
    } else if ((rc = kvr_oai_models_first_id(body, len, out, cap, why, sizeof why)) != KVR_OK) {
        snprintf(err, err_len, "GET %s: %s%s", path, why,
                 r.truncated ? " (body cut at 64 KiB)" : "");
    }
    kvr_http_resp_free(&r);
    return rc;
}

/* ---- one run ---------------------------------------------------------------------------- */

typedef struct driver driver_t;

typedef struct conn {
    struct evhttp_connection *evcon;
    int nodelay_fd;
    size_t target; /* index into cfg->targets */
} conn_t;

typedef enum slot_state { SLOT_FREE = 0, SLOT_ACTIVE, SLOT_CANCELLING } slot_state_t;

typedef struct slot {
    driver_t *d;
    slot_state_t state;
    size_t i; /* the request */
    struct evhttp_request *req;
    conn_t *conn;
    kvr_oai_stream_t *stream;
    struct event *timer;
    uint64_t t_sent, t_first, t_last;
    uint32_t tokens;
    int fail;          /* evreq error + 1 from the error callback; 0: none */
    bool got_body;     /* any response byte */
    bool stream_bad;   /* the parser failed (the rest of the body is ignored) */
    char errbody[ERR_BODY_BYTES];
    size_t errbody_len;
    struct slot *next_free;
} slot_t;

struct driver {
    const kvr_replay_config_t *cfg;
    kvr_replay_sample_t *samples;
    kvr_replay_stats_t *st;
    struct event_base *base;
    struct event *sched, *pump_ev, *tick, *sig_int, *sig_term;
    uint64_t t0;
    uint64_t first_send, last_end;
    size_t next;       /* the next request to send */
    size_t marked;     /* requests before this one are marked waited (or not due yet) */
    size_t done;       /* finished, whatever the outcome */
    uint32_t inflight;
    slot_t *slots;     /* max_inflight */
    slot_t *free_slots;
    size_t n_slots_used;
    conn_t *conns;     /* max_inflight x targets */
    conn_t **idle;     /* per target, max_inflight each */
    size_t n_idle[KVR_REPLAY_MAX_TARGETS], n_conns;
    char path[KVR_REPLAY_MAX_TARGETS][600];
    int fatal;
    char *err;
    size_t err_len;
};

static double since_start_s(const driver_t *d, uint64_t t)
{
    return (double)(t - d->t0) / 1e9;
}

static void fatal(driver_t *d, int status)
{
    if (d->fatal == KVR_OK)
        d->fatal = status;
    event_base_loopexit(d->base, NULL);
}

static size_t n_targets(const kvr_replay_config_t *c) { return c->n_targets ? c->n_targets : 1; }

static const kvr_http_target_t *target_of(const kvr_replay_config_t *c, size_t k)
{
    return c->n_targets ? &c->targets[k] : c->target;
}

/* A connection to target k (request i goes to target i mod the number of targets). */
static conn_t *conn_get(driver_t *d, size_t k)
{
    if (d->n_idle[k] > 0)
        return d->idle[k * d->cfg->max_inflight + --d->n_idle[k]];
    if (d->n_conns == (size_t)d->cfg->max_inflight * n_targets(d->cfg))
        return NULL; /* cannot happen: one connection per outstanding request */
    conn_t *c = &d->conns[d->n_conns];
    c->target = k;
    const kvr_http_target_t *t = target_of(d->cfg, k);
    c->evcon = evhttp_connection_base_new(d->base, NULL, t->addr[0] ? t->addr : t->host,
                                          t->port);
    if (c->evcon == NULL)
        return NULL;
    /* evhttp's own timeouts (connect, and between reads) back up the per-request timer */
    struct timeval tv = tv_of(d->cfg->timeout_s + 1.0);
    evhttp_connection_set_timeout_tv(c->evcon, &tv);
    c->nodelay_fd = -1;
    d->n_conns++;
    d->st->connections++;
    return c;
}

static void conn_put(driver_t *d, conn_t *c)
{
    d->idle[c->target * d->cfg->max_inflight + d->n_idle[c->target]++] = c;
}

static void describe_failure(driver_t *d, const slot_t *s, const char *what)
{
    if (d->st->first_error[0] == '\0')
        snprintf(d->st->first_error, sizeof d->st->first_error, "request %zu: %s", s->i + 1,
                 what);
}

/* The request is over (slot still attached): fills its sample, frees the slot. */
static void finish(slot_t *s, kvr_replay_outcome_t outcome, int http_status, uint64_t now,
                   const char *why)
{
    driver_t *d = s->d;
    kvr_replay_sample_t *smp = &d->samples[s->i];
    const kvr_oai_stream_info_t *in = kvr_oai_stream_info(s->stream);
    smp->outcome = outcome;
    smp->http_status = http_status;
    smp->token_events = s->tokens;
    if (s->tokens > 0)
        smp->ttft_ms = (double)(s->t_first - s->t_sent) / 1e6;
    if (s->tokens > 1)
        smp->itl_ms = (double)(s->t_last - s->t_first) / 1e6 / (double)(s->tokens - 1);
    if (outcome != KVR_REPLAY_TIMEOUT && outcome != KVR_REPLAY_CANCELLED &&
        outcome != KVR_REPLAY_CONNECT)
        smp->e2e_ms = (double)(now - s->t_sent) / 1e6;
    if (in->has_usage) {
        smp->has_usage = true;
        smp->prompt_tokens = in->prompt_tokens;
        smp->output_tokens = in->completion_tokens;
        smp->has_cached = in->has_cached;
        smp->cached_tokens = in->cached_tokens;
    }
    if (in->has_worker) {
        smp->has_worker = true;
        smp->worker_id = in->worker_id;
    }
    kvr_replay_stats_t *st = d->st;
    st->by_outcome[outcome]++;
    if (outcome == KVR_REPLAY_OK) {
        st->ok++;
    } else if (outcome != KVR_REPLAY_CANCELLED) {
        st->failed++;
        describe_failure(d, s, why);
    }
    if (now > d->last_end)
        d->last_end = now;
    d->done++;
    evtimer_del(s->timer);
    s->req = NULL;
    conn_put(d, s->conn);
    s->conn = NULL;
    s->state = SLOT_FREE;
    s->next_free = d->free_slots;
    d->free_slots = s;
    d->inflight--;
    if (d->done == d->cfg->n)
        event_base_loopexit(d->base, NULL);
    else
        event_active(d->pump_ev, EV_TIMEOUT, 0);
}

static void on_chunk(struct evhttp_request *req, void *arg)
{
    slot_t *s = arg;
    if (s->state != SLOT_ACTIVE)
        return;
    uint64_t now = kvr_now_ns();
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    int code = evhttp_request_get_response_code(req);
    s->got_body = true;
    size_t n;
    while ((n = (size_t)evbuffer_get_contiguous_space(in)) > 0) {
        const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)n);
        if (code != 200) {
            size_t room = sizeof s->errbody - 1 - s->errbody_len;
            size_t k = n < room ? n : room;
            memcpy(s->errbody + s->errbody_len, p, k);
            s->errbody_len += k;
        } else if (!s->stream_bad) {
            uint32_t toks = 0;
            if (kvr_oai_stream_feed(s->stream, p, n, &toks) != KVR_OK)
                s->stream_bad = true;
            if (toks > 0) {
                if (s->tokens == 0)
                    s->t_first = now;
                s->t_last = now;
                s->tokens += toks;
            }
        }
        evbuffer_drain(in, n);
    }
}

static void on_error(enum evhttp_request_error e, void *arg)
{
    slot_t *s = arg;
    if (s->state == SLOT_ACTIVE)
        s->fail = (int)e + 1;
}

static void on_done(struct evhttp_request *req, void *arg)
{
    slot_t *s = arg;
    if (s->state != SLOT_ACTIVE)
        return;
    uint64_t now = kvr_now_ns();
    int code = req ? evhttp_request_get_response_code(req) : 0;
    char why[400];
    if (req && code > 0 && evbuffer_get_length(evhttp_request_get_input_buffer(req)) > 0)
        on_chunk(req, s); /* a body evhttp did not hand to the chunk callback */
    if (code <= 0 || (req == NULL && s->fail)) {
        int e = s->fail - 1;
        kvr_replay_outcome_t o = KVR_REPLAY_CONNECT;
        if (s->fail == 0)
            snprintf(why, sizeof why, "cannot connect");
        else if (e == EVREQ_HTTP_TIMEOUT)
            o = KVR_REPLAY_TIMEOUT;
        else if (e == EVREQ_HTTP_EOF || e == EVREQ_HTTP_BUFFER_ERROR)
            o = KVR_REPLAY_EOF; /* connected (a refused connect reports no error kind) */
        else
            o = KVR_REPLAY_BAD_STREAM;
        if (s->fail)
            snprintf(why, sizeof why, "%s%s", evreq_error_name(e),
                     o != KVR_REPLAY_EOF ? ""
                     : s->got_body      ? " mid-response"
                                        : " before a response");
        finish(s, o, 0, now, why);
        return;
    }
    if (code != 200) {
        char msg[256];
        s->errbody[s->errbody_len] = '\0';
        if (!kvr_oai_error_message(s->errbody, s->errbody_len, msg, sizeof msg))
            snprintf(msg, sizeof msg, "%.200s", s->errbody);
        snprintf(why, sizeof why, "HTTP %d: %s", code, msg);
        finish(s, KVR_REPLAY_HTTP_STATUS, code, now, why);
        return;
    }
    if (kvr_oai_stream_finish(s->stream) != KVR_OK) {
        snprintf(why, sizeof why, "malformed stream: %s", kvr_oai_stream_error(s->stream));
        finish(s, KVR_REPLAY_BAD_STREAM, code, now, why);
        return;
    }
    const kvr_oai_stream_info_t *in = kvr_oai_stream_info(s->stream);
    if (in->error_event) {
        snprintf(why, sizeof why, "error event: %s", in->error[0] ? in->error : "(no message)");
        finish(s, KVR_REPLAY_STREAM_ERROR, code, now, why);
        return;
    }
    finish(s, KVR_REPLAY_OK, code, now, "");
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    slot_t *s = arg;
    if (s->state != SLOT_ACTIVE)
        return;
    char why[80];
    snprintf(why, sizeof why, "no complete response within %g s", s->d->cfg->timeout_s);
    s->state = SLOT_CANCELLING;
    evhttp_cancel_request(s->req); /* resets the connection, which stays usable */
    s->state = SLOT_ACTIVE;
    finish(s, KVR_REPLAY_TIMEOUT, 0, kvr_now_ns(), why);
}

static slot_t *slot_get(driver_t *d)
{
    slot_t *s = d->free_slots;
    if (s) {
        d->free_slots = s->next_free;
        return s;
    }
    if (d->n_slots_used == d->cfg->max_inflight)
        return NULL;
    s = &d->slots[d->n_slots_used];
    s->d = d;
    s->stream = kvr_oai_stream_new();
    s->timer = s->stream ? evtimer_new(d->base, on_timeout, s) : NULL;
    if (s->timer == NULL) {
        kvr_oai_stream_free(s->stream);
        s->stream = NULL;
        return NULL;
    }
    d->n_slots_used++;
    return s;
}

static void slot_unget(driver_t *d, slot_t *s)
{
    s->state = SLOT_FREE;
    s->next_free = d->free_slots;
    d->free_slots = s;
}

/* Sends request d->next. KVR_OK, or a fatal status. */
static int send_next(driver_t *d)
{
    size_t i = d->next;
    const char *body;
    size_t len;
    int rc = d->cfg->body(d->cfg->body_arg, i, &body, &len, d->err, d->err_len);
    if (rc != KVR_OK)
        return rc;
    slot_t *s = slot_get(d);
    size_t k = i % n_targets(d->cfg);
    conn_t *c = s ? conn_get(d, k) : NULL;
    struct evhttp_request *req = c ? evhttp_request_new(on_done, s) : NULL;
    if (req == NULL || evbuffer_add(evhttp_request_get_output_buffer(req), body, len) != 0) {
        if (req)
            evhttp_request_free(req);
        if (c)
            conn_put(d, c);
        if (s)
            slot_unget(d, s);
        snprintf(d->err, d->err_len, "out of memory sending request %zu", i + 1);
        return KVR_ENOMEM;
    }
    evhttp_request_set_chunked_cb(req, on_chunk);
    evhttp_request_set_error_cb(req, on_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", target_of(d->cfg, k)->host_hdr);
    evhttp_add_header(h, "Content-Type", "application/json");
    evhttp_add_header(h, "Accept", "text/event-stream");
    kvr_oai_stream_reset(s->stream);
    s->state = SLOT_ACTIVE;
    s->i = i;
    s->req = req;
    s->conn = c;
    s->tokens = 0;
    s->fail = 0;
    s->got_body = false;
    s->stream_bad = false;
    s->errbody_len = 0;
    s->t_sent = kvr_now_ns();
    d->next++;
    d->inflight++;
    kvr_replay_stats_t *st = d->st;
    st->sent++;
    if (d->inflight > st->peak_inflight)
        st->peak_inflight = d->inflight;
    if (st->sent == 1)
        d->first_send = s->t_sent;
    d->samples[i].sent_s = since_start_s(d, s->t_sent);
    struct timeval tv = tv_of(d->cfg->timeout_s);
    evtimer_add(s->timer, &tv);
    if (evhttp_make_request(c->evcon, req, EVHTTP_REQ_POST, d->path[k]) != 0) {
        /* the request is freed by evhttp; account for it as a connection failure */
        if (s->state == SLOT_ACTIVE)
            finish(s, KVR_REPLAY_CONNECT, 0, kvr_now_ns(), "cannot send");
        return KVR_OK;
    }
    if (s->state == SLOT_ACTIVE && s->conn == c)
        kvr_http_nodelay(c->evcon, &c->nodelay_fd);
    return KVR_OK;
}

/* Sends every request that is due, as far as max_inflight allows, then arms the timer for
 * the next arrival. */
static void pump(driver_t *d)
{
    const kvr_replay_config_t *cfg = d->cfg;
    uint64_t now = kvr_now_ns();
    while (d->next < cfg->n && d->fatal == KVR_OK) {
        double due = cfg->arrival_s[d->next];
        double t = since_start_s(d, now);
        if (due > t) {
            evtimer_del(d->sched);
            struct timeval tv = tv_of(due - t);
            evtimer_add(d->sched, &tv);
            return;
        }
        if (d->inflight >= cfg->max_inflight) {
            /* everything due now waits for a free slot: mark it (once) */
            if (d->marked < d->next)
                d->marked = d->next;
            while (d->marked < cfg->n && cfg->arrival_s[d->marked] <= t) {
                d->samples[d->marked].waited = true;
                d->st->waited++;
                d->marked++;
            }
            return;
        }
        int rc = send_next(d);
        if (rc != KVR_OK) {
            fatal(d, rc);
            return;
        }
        now = kvr_now_ns();
    }
}

static void on_sched(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    pump(arg);
}

static void report_progress(driver_t *d)
{
    const kvr_replay_config_t *cfg = d->cfg;
    if (cfg->progress == NULL)
        return;
    double t = since_start_s(d, kvr_now_ns());
    size_t waiting = 0;
    for (size_t k = d->next; k < cfg->n && cfg->arrival_s[k] <= t; k++)
        waiting++;
    kvr_replay_progress_t p = {
        .total = cfg->n,
        .sent = d->st->sent,
        .done = d->done,
        .failed = d->st->failed,
        .inflight = d->inflight,
        .waiting = waiting,
        .elapsed_s = t,
    };
    cfg->progress(cfg->progress_arg, &p);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    report_progress(arg);
}

/* SIGINT / SIGTERM: cancel what is outstanding, leave the rest unsent. */
static void on_signal(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    driver_t *d = arg;
    d->st->interrupted = true;
    for (size_t k = d->next; k < d->cfg->n; k++)
        d->samples[k].outcome = KVR_REPLAY_NOT_SENT;
    d->st->by_outcome[KVR_REPLAY_NOT_SENT] += d->cfg->n - d->next;
    d->done += d->cfg->n - d->next;
    d->next = d->cfg->n;
    uint64_t now = kvr_now_ns();
    for (size_t k = 0; k < d->n_slots_used; k++) {
        slot_t *s = &d->slots[k];
        if (s->state != SLOT_ACTIVE)
            continue;
        s->state = SLOT_CANCELLING;
        evhttp_cancel_request(s->req);
        s->state = SLOT_ACTIVE;
        finish(s, KVR_REPLAY_CANCELLED, 0, now, "cancelled");
    }
    event_base_loopexit(d->base, NULL);
}

static struct event_base *new_base(void)
{
    struct event_config *ec = event_config_new();
    if (ec)
        event_config_set_flag(ec, EVENT_BASE_FLAG_PRECISE_TIMER);
    struct event_base *b = ec ? event_base_new_with_config(ec) : event_base_new();
    if (ec)
        event_config_free(ec);
    return b;
}

static void driver_deinit(driver_t *d)
{
    for (size_t k = 0; k < d->n_slots_used; k++) {
        if (d->slots[k].state == SLOT_ACTIVE && d->slots[k].req)
            evhttp_cancel_request(d->slots[k].req); /* only after a fatal error */
        if (d->slots[k].timer)
            event_free(d->slots[k].timer);
        kvr_oai_stream_free(d->slots[k].stream);
    }
    for (size_t k = 0; k < d->n_conns; k++)
        evhttp_connection_free(d->conns[k].evcon);
    struct event *evs[] = {d->sched, d->pump_ev, d->tick, d->sig_int, d->sig_term};
    for (size_t k = 0; k < sizeof evs / sizeof evs[0]; k++)
        if (evs[k])
            event_free(evs[k]);
    if (d->base)
        event_base_free(d->base);
    free(d->slots);
    free(d->conns);
    free(d->idle);
}

static int check_config(const kvr_replay_config_t *c, char *err, size_t err_len)
{
    const char *why = NULL;
    if ((c->target == NULL && c->n_targets == 0) || c->path == NULL || c->body == NULL)
        why = "target, path and body are required";
    else if (c->n_targets > KVR_REPLAY_MAX_TARGETS)
        why = "targets: at most KVR_REPLAY_MAX_TARGETS";
    else if (c->n > 0 && c->arrival_s == NULL)
        why = "arrival_s is required";
    else if (c->max_inflight == 0)
        why = "max_inflight: must be >= 1";
    else if (!(c->timeout_s > 0) || !isfinite(c->timeout_s))
        why = "timeout_s: must be > 0";
    for (size_t i = 0; why == NULL && i < c->n; i++)
        if (!isfinite(c->arrival_s[i]) || c->arrival_s[i] < 0 ||
            (i > 0 && c->arrival_s[i] < c->arrival_s[i - 1]))
            why = "arrival_s: must be finite, >= 0 and non-decreasing";
    if (why) {
        snprintf(err, err_len, "%s", why);
        return KVR_EINVAL;
    }
    return KVR_OK;
}

int kvr_replay_run(const kvr_replay_config_t *cfg, kvr_replay_sample_t *samples,
                   kvr_replay_stats_t *stats, char *err, size_t err_len)
{
    memset(stats, 0, sizeof *stats);
    if (check_config(cfg, err, err_len) != KVR_OK)
        return KVR_EINVAL;
    for (size_t i = 0; i < cfg->n; i++) {
        memset(&samples[i], 0, sizeof samples[i]);
        samples[i].arrival_s = cfg->arrival_s[i];
        samples[i].sent_s = samples[i].ttft_ms = samples[i].itl_ms = samples[i].e2e_ms = NAN;
        samples[i].outcome = KVR_REPLAY_NOT_SENT;
    }
    if (cfg->n == 0)
        return KVR_OK;
    driver_t d;
    memset(&d, 0, sizeof d);
    d.cfg = cfg;
    d.samples = samples;
    d.st = stats;
    d.err = err;
    d.err_len = err_len;
    for (size_t k = 0; k < n_targets(cfg); k++)
        snprintf(d.path[k], sizeof d.path[k], "%s%s", target_of(cfg, k)->base_path, cfg->path);
    d.base = new_base();
    d.slots = calloc(cfg->max_inflight, sizeof *d.slots);
    d.conns = calloc((size_t)cfg->max_inflight * n_targets(cfg), sizeof *d.conns);
    d.idle = calloc((size_t)cfg->max_inflight * n_targets(cfg), sizeof *d.idle);
    if (d.base) {
        d.sched = evtimer_new(d.base, on_sched, &d);
        d.pump_ev = event_new(d.base, -1, 0, on_sched, &d);
        if (cfg->progress)
            d.tick = event_new(d.base, -1, EV_PERSIST, on_tick, &d);
        if (cfg->catch_signals) {
            d.sig_int = evsignal_new(d.base, SIGINT, on_signal, &d);
            d.sig_term = evsignal_new(d.base, SIGTERM, on_signal, &d);
        }
    }
    if (!d.base || !d.slots || !d.conns || !d.idle || !d.sched || !d.pump_ev ||
        (cfg->progress && !d.tick) || (cfg->catch_signals && (!d.sig_int || !d.sig_term))) {
        driver_deinit(&d);
        snprintf(err, err_len, "out of memory");
        return KVR_ENOMEM;
    }
    if (d.tick) {
        struct timeval tv = tv_of((cfg->progress_ms ? cfg->progress_ms : 100) / 1000.0);
        event_add(d.tick, &tv);
    }
    if (d.sig_int) {
        event_add(d.sig_int, NULL);
        event_add(d.sig_term, NULL);
    }
    d.t0 = kvr_now_ns();
    pump(&d);
    if (d.fatal == KVR_OK && d.done < cfg->n)
        event_base_dispatch(d.base);
    if (d.fatal == KVR_OK)
        report_progress(&d);
    stats->duration_s = d.last_end > d.first_send ? (double)(d.last_end - d.first_send) / 1e9
                                                   : 0.0;
    int rc = d.fatal;
    driver_deinit(&d);
    return rc;
}
