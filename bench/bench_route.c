/*
 * bench_route.c: `kvrouter bench route`: a closed-loop HTTP load generator for a running
 * router's `POST /v1/route`, measuring requests per second and the latency one client sees.
 * It shares the machine with the router, so its own cost (below) bounds what it can show.
 *
 * How: --clients keep-alive connections (libevent evhttp client), spread over --threads event
 * loops, one event_base per thread. Each client has one request outstanding at all times: the
 * response callback sends the next one (closed loop). Latency is one CLOCK_MONOTONIC interval
 * from just before evhttp_make_request() to the response callback, so it covers the request's
 * serialization, both socket trips, the router's work and the response's parsing; the timer's
 * calibrated overhead is subtracted. Bodies, `{"tokens":[...],"update_state":false}` with
 * --tokens random ids < 150000, are generated before timing (deterministic from --seed; the
 * first --prefix-share of each prompt is one of 8 shared prefixes, so the router sees overlap)
 * and sent by reference, so neither JSON formatting nor copying is measured. Each client
 * cycles through its own set of bodies (up to 16, fewer when they would pass 256 MB in all).
 * With --update-state true the body asks the router to book the request, and the client then
 * sends DELETE /v1/requests/{request_id} (the id read from the route response) before its next
 * route, so the run leaves no load behind; DELETEs are not timed, their failures are errors.
 *
 * Closed loop ties the figures together (Little's law: clients = per_s x mean latency), so
 * "32 clients, p99 <= 1 ms" already implies well over 32,000/s. --rate R paces the clients to
 * R requests/s in all (each waits for its slot; exact timerfd wake-ups), which measures the
 * latency at a given load instead; it costs the generator about twice the CPU per request.
 * Generator cost on a 2-core VM against a do-nothing libevent server: ~15-20 us of CPU per
 * 1K-token request unpaced (one loop drives ~55,000/s while the server takes the other core;
 * a second loop thread only adds scheduling delay), ~300 us per 128K-token request.
 *
 * A run: --warmup seconds unmeasured (connections open here), then the measured window:
 * --duration seconds, or until --requests responses (--requests wins). Responses completing
 * in the window are counted; in-flight requests are then drained (not counted) so the router
 * is left idle. Figures per point (clients x tokens): per_s = 2xx responses / window;
 * p50/p99/p99.9 latency of those; concurrency = sum of their latencies / window, the requests
 * actually kept outstanding (Little's law; below --clients when the generator lags).
 * Rates, latencies and concurrency are medians over --runs; requests and errors are totals.
 * errors: non-2xx responses and connection failures (timeouts, resets), counted by kind on
 * stderr and in the JSON; a run in which more than 1% of requests fail fails the benchmark.
 *
 * The server is probed first with a plain TCP connect (2 s timeout): unreachable means a clear
 * error naming the URL and exit 1, never a hang; each request also has a 5 s timeout.
 * Memory: bodies and samples are owned here and freed per point. Threads: each loop thread
 * owns its clients and samples; the threads share only the run's atomics.
 */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "bench.h"
#include "net/replay_driver.h"

static const kvr_bench_col_t COLS[] = {
    {"bench", KVR_BENCH_STR, 5, 0},         {"clients", KVR_BENCH_INT, 7, 0},
    {"tokens", KVR_BENCH_INT, 7, 0},        {"threads", KVR_BENCH_INT, 7, 0},
    {"runs", KVR_BENCH_INT, 4, 0},          {"requests", KVR_BENCH_INT, 9, 0},
    {"per_s", KVR_BENCH_NUM, 8, 0},         {"p50_us", KVR_BENCH_NUM, 8, 1},
    {"p99_us", KVR_BENCH_NUM, 8, 1},        {"p999_us", KVR_BENCH_NUM, 8, 1},
    {"concurrency", KVR_BENCH_NUM, 11, 1},  {"errors", KVR_BENCH_INT, 6, 0},
    {"target_per_s", KVR_BENCH_NUM, 12, 0}, {"target_p99_us", KVR_BENCH_NUM, 13, 0},
    {"error_kinds", KVR_BENCH_STR, 0, 0},   {"update_state", KVR_BENCH_STR, 0, 0},
    {"prefix_share", KVR_BENCH_NUM, 0, 2},  {"duration_s", KVR_BENCH_NUM, 0, 3},
    {"rate_per_s", KVR_BENCH_NUM, 0, 0},    {"url", KVR_BENCH_STR, 0, 0},
};
#define N_COLS (sizeof COLS / sizeof COLS[0])

#define ROUTE_MAX_TOKEN 150000
#define ROUTE_N_PREFIXES 8
#define ROUTE_MAX_BODIES 16                      /* per client */
#define ROUTE_BODY_BUDGET ((size_t)256 << 20)    /* all bodies of a point */
#define ROUTE_PROBE_MS 2000                      /* TCP connect probe */
#define ROUTE_TIMEOUT_S 5                        /* per request (and connect) */
#define ROUTE_DRAIN_NS ((uint64_t)(ROUTE_TIMEOUT_S + 1) * 1000000000u)
#define ROUTE_RETRY_MS 1                         /* pause after a connection failure */
#define ROUTE_TICK_MS 20
#define ROUTE_MAX_SINGLE_IO ((size_t)4 << 20)   /* bytes per read or write call */
#define ROUTE_MAX_KINDS 32
#define ROUTE_MAX_ID 256
#define ROUTE_FAIL_FRACTION 0.01
#define ROUTE_ABORT_ERRORS 1000 /* errors (and 10 x the successes) that end a run early */

/* Error kinds: an HTTP status (100..599), or one of these. */
enum {
    KIND_CONN = -100,       /* connection failure without a reason */
    KIND_NO_ID = -200,      /* 2xx route response without a usable request_id */
    KIND_OTHER = -300,      /* kinds beyond ROUTE_MAX_KINDS */
    KIND_EVREQ_BASE = -1000 /* - evhttp_request_error */
};

/* ---- the target ------------------------------------------------------------------------- */

typedef struct target {
    kvr_http_target_t h;    /* host, Host header, numeric address (net/replay_driver.h) */
    char route_path[512];
    char delete_prefix[512];
} target_t;

static bool parse_url(const char *url, target_t *t, char *why, size_t why_len)
{
    memset(t, 0, sizeof *t);
    if (kvr_http_target_parse(url, &t->h, why, why_len) != KVR_OK)
        return false;
    snprintf(t->route_path, sizeof t->route_path, "%s/v1/route", t->h.base_path);
    snprintf(t->delete_prefix, sizeof t->delete_prefix, "%s/v1/requests/", t->h.base_path);
    return true;
}

bool kvr_bench_route_url_ok(const char *url, char *why, size_t why_len)
{
    target_t t;
    return parse_url(url, &t, why, why_len);
}

/* A TCP connect with a timeout, so an absent server is an error message, not a hang. On
 * success t->h.addr holds the numeric address that answered (evhttp then needs no resolver). */
static bool probe(target_t *t)
{
    char err[512];
    if (kvr_http_probe(&t->h, ROUTE_PROBE_MS, err, sizeof err) == KVR_OK)
        return true;
    fprintf(stderr, "kvrouter bench route: %s; is the router (kvrouter serve) running?\n", err);
    return false;
}

/* ---- bodies ----------------------------------------------------------------------------- */

typedef struct body {
    char *data;
    size_t len;
    char len_str[24];
} body_t;

static char *put_u32(char *p, uint32_t v)
{
    char tmp[10];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

static bool make_body(body_t *b, const uint32_t *tok, size_t n, bool update_state)
{
    static const char head[] = "{\"tokens\":[";
    const char *tail = update_state ? "],\"update_state\":true}" : "],\"update_state\":false}";
    b->data = malloc(sizeof head + n * 7 + strlen(tail) + 1);
    if (b->data == NULL)
        return false;
    char *p = b->data;
    memcpy(p, head, sizeof head - 1);
    p += sizeof head - 1;
    for (size_t i = 0; i < n; i++) {
        if (i)
            *p++ = ',';
        p = put_u32(p, tok[i]);
    }
    size_t tl = strlen(tail);
    memcpy(p, tail, tl);
    p += tl;
    b->len = (size_t)(p - b->data);
    snprintf(b->len_str, sizeof b->len_str, "%zu", b->len);
    return true;
}

/* Bodies per client that fit the budget (at least 1, at most ROUTE_MAX_BODIES). */
static size_t bodies_per_client(uint64_t clients, uint64_t tokens)
{
    size_t one = (size_t)tokens * 7 + 64;
    size_t k = ROUTE_BODY_BUDGET / (one * (size_t)clients);
    return k < 1 ? 1 : k > ROUTE_MAX_BODIES ? ROUTE_MAX_BODIES : k;
}

static void free_bodies(body_t *b, size_t n)
{
    for (size_t i = 0; b && i < n; i++)
        free(b[i].data);
    free(b);
}

/* clients * per bodies; client c owns [c * per, (c + 1) * per). */
static body_t *make_bodies(const kvr_bench_opts_t *o, uint64_t clients, uint64_t tokens,
                           size_t per)
{
    size_t n_bodies = (size_t)clients * per;
    size_t plen = (size_t)floor(o->prefix_share * (double)tokens + 0.5);
    body_t *bodies = calloc(n_bodies, sizeof *bodies);
    uint32_t *pre = malloc(((size_t)ROUTE_N_PREFIXES * plen + 1) * sizeof *pre);
    uint32_t *tok = malloc((size_t)tokens * sizeof *tok);
    bool ok = bodies && pre && tok;
    kvr_bench_rng_t rng;
    kvr_bench_rng_seed(&rng, o->seed ^ kvr_bench_mix64(tokens ^ 0x70a7eu));
    for (size_t i = 0; ok && i < (size_t)ROUTE_N_PREFIXES * plen; i++)
        pre[i] = (uint32_t)kvr_bench_rng_below(&rng, ROUTE_MAX_TOKEN);
    for (size_t b = 0; ok && b < n_bodies; b++) {
        if (plen > 0)
            memcpy(tok, pre + kvr_bench_rng_below(&rng, ROUTE_N_PREFIXES) * plen,
                   plen * sizeof *tok);
        for (size_t i = plen; i < tokens; i++)
            tok[i] = (uint32_t)kvr_bench_rng_below(&rng, ROUTE_MAX_TOKEN);
        ok = make_body(&bodies[b], tok, (size_t)tokens, o->update_state);
    }
    free(pre);
    free(tok);
    if (!ok) {
        free_bodies(bodies, n_bodies);
        return NULL;
    }
    return bodies;
}

/* ---- one run ---------------------------------------------------------------------------- */

typedef struct err_kind {
    bool del; /* from a DELETE, not a route */
    int code;
    uint64_t n;
} err_kind_t;

typedef struct errs {
    err_kind_t k[ROUTE_MAX_KINDS];
    size_t n_kinds;
    uint64_t other, total;
} errs_t;

static void errs_add(errs_t *e, bool del, int code, uint64_t n)
{
    e->total += n;
    for (size_t i = 0; i < e->n_kinds; i++)
        if (e->k[i].del == del && e->k[i].code == code) {
            e->k[i].n += n;
            return;
        }
    if (e->n_kinds == ROUTE_MAX_KINDS) {
        e->other += n;
        return;
    }
    e->k[e->n_kinds++] = (err_kind_t){del, code, n};
}

static const char *kind_name(int code, char *buf, size_t len)
{
    static const char *evreq[] = {"timeout", "eof",       "bad-header",
                                  "buffer",  "cancelled", "too-long"};
    if (code > 0)
        snprintf(buf, len, "%d", code);
    else if (code == KIND_NO_ID)
        snprintf(buf, len, "no-request_id");
    else if (code == KIND_OTHER)
        snprintf(buf, len, "other");
    else if (code <= KIND_EVREQ_BASE && KIND_EVREQ_BASE - code < 6)
        snprintf(buf, len, "%s", evreq[KIND_EVREQ_BASE - code]);
    else
        snprintf(buf, len, "connect");
    return buf;
}

/* "route 500 x12, route eof x1, delete 404 x3" */
static void errs_format(const errs_t *e, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < e->n_kinds && off < len; i++) {
        char name[32];
        off += (size_t)snprintf(buf + off, len - off, "%s%s %s x%llu", i ? ", " : "",
                                e->k[i].del ? "delete" : "route",
                                kind_name(e->k[i].code, name, sizeof name),
                                (unsigned long long)e->k[i].n);
    }
    if (e->other && off < len)
        snprintf(buf + off, len - off, "%sother x%llu", off ? ", " : "",
                 (unsigned long long)e->other);
}

typedef struct run {
    const target_t *t;
    bool update_state;
    uint64_t measure_start; /* ns; responses before this are warmup */
    uint64_t measure_end;   /* ns; UINT64_MAX in --requests mode until the last one */
    uint64_t target;        /* --requests, 0 = duration mode */
    uint64_t start_ns;      /* the run's first request */
    uint64_t interval_ns;   /* --rate: between one client's requests; 0 = unpaced */
    size_t n_clients;
    atomic_uint_fast64_t done;
    atomic_bool stop;
    atomic_uint_fast64_t end_ns;
    atomic_bool aborted;
} run_t;

typedef struct loop loop_t;

typedef struct client {
    loop_t *lp;
    struct evhttp_connection *evcon;
    struct event *wake; /* pacing (--rate) and the pause after a connection failure */
    const body_t *bodies;
    size_t n_bodies, next;
    size_t index;     /* among all the run's clients */
    uint64_t next_at; /* --rate: when this client's next request is due (ns) */
    uint64_t t0;
    int fail; /* the last evhttp error reported for the request in flight */
    evutil_socket_t nodelay_fd;
} client_t;

struct loop {
    run_t *run;
    struct event_base *base;
    struct event *tick;
    client_t *clients;
    size_t n_clients;
    size_t active; /* clients with a request (or a wake-up) outstanding */
    bool stopping;
    uint64_t stop_at;
    double *ns; /* latencies of the window's 2xx responses */
    size_t n_ns, cap_ns;
    double sum_ns;
    uint64_t deletes; /* the window's 2xx DELETEs */
    bool oom;
    uint64_t stuck; /* still in flight when the drain timed out */
    uint64_t seen_ok, seen_err; /* every phase: a server that only fails ends the run early */
    errs_t errs;                /* the window's */
    errs_t errs_all;            /* every phase's, reported when the run is cut short */
    pthread_t th;
};

static void send_route(client_t *c);

static bool should_stop(loop_t *lp, uint64_t now)
{
    if (!lp->stopping && (now >= lp->run->measure_end || atomic_load(&lp->run->stop))) {
        lp->stopping = true;
        lp->stop_at = now;
    }
    return lp->stopping;
}

static void client_idle(client_t *c)
{
    loop_t *lp = c->lp;
    if (--lp->active == 0)
        event_base_loopexit(lp->base, NULL);
}

static void wake_at(client_t *c, uint64_t delay_ns)
{
    struct timeval tv = {(time_t)(delay_ns / 1000000000u),
                         (suseconds_t)(delay_ns % 1000000000u / 1000u)};
    evtimer_add(c->wake, &tv);
}

/* After a response: the next route (now, or when --rate says it is due), or nothing when the
 * window is over. A client that fell behind its schedule sends at once but does not burst to
 * catch up. */
static void next(client_t *c, uint64_t now)
{
    if (should_stop(c->lp, now)) {
        client_idle(c);
        return;
    }
    uint64_t iv = c->lp->run->interval_ns;
    if (iv > 0) {
        c->next_at += iv;
        if (c->next_at + iv < now)
            c->next_at = now;
        if (c->next_at > now + 2000) {
            wake_at(c, c->next_at - now);
            return;
        }
    }
    send_route(c);
}

static bool in_window(const run_t *r, uint64_t t1)
{
    return t1 >= r->measure_start && t1 < r->measure_end && !atomic_load(&r->stop);
}

static void count_error(client_t *c, bool del, int code, uint64_t t1)
{
    loop_t *lp = c->lp;
    if (in_window(lp->run, t1))
        errs_add(&lp->errs, del, code, 1);
    errs_add(&lp->errs_all, del, code, 1);
    if (++lp->seen_err >= ROUTE_ABORT_ERRORS && lp->seen_err > 10 * lp->seen_ok) {
        atomic_store(&lp->run->aborted, true);
        atomic_store(&lp->run->stop, true);
    }
}

static void record(loop_t *lp, uint64_t t0, uint64_t t1)
{
    run_t *r = lp->run;
    if (t1 < r->measure_start || t1 >= r->measure_end)
        return;
    if (r->target > 0) {
        uint_fast64_t prev = atomic_fetch_add(&r->done, 1);
        if (prev >= r->target)
            return;
        if (prev + 1 == r->target) {
            atomic_store(&r->end_ns, t1);
            atomic_store(&r->stop, true);
        }
    } else if (atomic_load(&r->stop)) {
        return;
    }
    if (lp->n_ns == lp->cap_ns) {
        size_t cap = lp->cap_ns ? 2 * lp->cap_ns : (size_t)1 << 16;
        double *ns = realloc(lp->ns, cap * sizeof *ns);
        if (ns == NULL) {
            lp->oom = true;
            atomic_store(&r->stop, true);
            return;
        }
        lp->ns = ns, lp->cap_ns = cap;
    }
    lp->ns[lp->n_ns++] = (double)(t1 - t0);
    lp->sum_ns += (double)(t1 - t0);
}

/* Nagle would hold back the tail of a large body; set TCP_NODELAY once per socket (a compare
 * per request otherwise). */
static void set_nodelay(client_t *c)
{
    struct bufferevent *bev = evhttp_connection_get_bufferevent(c->evcon);
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    if (fd >= 0 && fd != c->nodelay_fd) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->nodelay_fd = fd;
    }
}

static void on_error(enum evhttp_request_error err, void *arg)
{
    client_t *c = arg;
    c->fail = KIND_EVREQ_BASE - (int)err;
}

static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    client_t *c = arg;
    if (should_stop(c->lp, kvr_bench_now_ns()))
        client_idle(c);
    else
        send_route(c);
}

/* A failed request: count it; after a connection failure pause briefly so a dead server
 * is not spun on. */
static void failed(client_t *c, bool del, struct evhttp_request *req, uint64_t t1)
{
    int code = req ? evhttp_request_get_response_code(req) : 0;
    bool conn = code <= 0;
    count_error(c, del, conn ? (c->fail ? c->fail : KIND_CONN) : code, t1);
    c->fail = 0;
    if (conn && !should_stop(c->lp, t1)) {
        wake_at(c, (uint64_t)ROUTE_RETRY_MS * 1000000u);
        return;
    }
    next(c, t1);
}

static void delete_done(struct evhttp_request *req, void *arg)
{
    client_t *c = arg;
    uint64_t t1 = kvr_bench_now_ns();
    int code = req ? evhttp_request_get_response_code(req) : 0;
    if (code < 200 || code > 299) {
        failed(c, true, req, t1);
        return;
    }
    if (in_window(c->lp->run, t1))
        c->lp->deletes++;
    next(c, t1);
}

/* The value of "request_id" (a string without escapes, or a number) in a small JSON object. */
static bool find_request_id(const char *s, size_t n, char *out, size_t cap)
{
    static const char key[] = "\"request_id\"";
    size_t kl = sizeof key - 1;
    for (size_t i = 0; i + kl <= n; i++) {
        if (s[i] != '"' || memcmp(s + i, key, kl) != 0)
            continue;
        size_t j = i + kl;
        while (j < n && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r'))
            j++;
        if (j >= n || s[j++] != ':')
            continue;
        while (j < n && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r'))
            j++;
        size_t start = j, len = 0;
        if (j < n && s[j] == '"') {
            start = ++j;
            while (j < n && s[j] != '"' && s[j] != '\\')
                j++;
            if (j >= n || s[j] != '"')
                return false;
            len = j - start;
        } else {
            while (j < n && s[j] >= '0' && s[j] <= '9')
                j++;
            len = j - start;
        }
        if (len == 0 || len >= cap)
            return false;
        memcpy(out, s + start, len);
        out[len] = '\0';
        return true;
    }
    return false;
}

/* DELETE /v1/requests/{id} for a booked route: 0 when sent, else the error kind. */
static int send_delete(client_t *c, struct evhttp_request *resp)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(resp);
    size_t n = evbuffer_get_length(in);
    const char *s = (const char *)evbuffer_pullup(in, -1);
    char id[ROUTE_MAX_ID];
    if (s == NULL || !find_request_id(s, n, id, sizeof id))
        return KIND_NO_ID;
    char *enc = evhttp_uriencode(id, -1, 0);
    char path[ROUTE_MAX_ID * 3 + 600];
    snprintf(path, sizeof path, "%s%s", c->lp->run->t->delete_prefix, enc ? enc : id);
    free(enc);
    struct evhttp_request *req = evhttp_request_new(delete_done, c);
    if (req == NULL)
        return KIND_CONN;
    evhttp_request_set_error_cb(req, on_error);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", c->lp->run->t->h.host_hdr);
    if (evhttp_make_request(c->evcon, req, EVHTTP_REQ_DELETE, path) != 0)
        return KIND_CONN; /* evhttp freed req */
    return 0;
}

static void route_done(struct evhttp_request *req, void *arg)
{
    client_t *c = arg;
    uint64_t t1 = kvr_bench_now_ns();
    int code = req ? evhttp_request_get_response_code(req) : 0;
    if (code < 200 || code > 299) {
        failed(c, false, req, t1);
        return;
    }
    c->lp->seen_ok++;
    record(c->lp, c->t0, t1);
    if (!c->lp->run->update_state) {
        next(c, t1);
    } else {
        int kind = send_delete(c, req);
        if (kind != 0) {
            count_error(c, kind == KIND_CONN, kind, t1);
            next(c, t1);
        }
    }
}

static void send_route(client_t *c)
{
    const body_t *b = &c->bodies[c->next];
    c->next = c->next + 1 == c->n_bodies ? 0 : c->next + 1;
    struct evhttp_request *req = evhttp_request_new(route_done, c);
    if (req == NULL) {
        failed(c, false, NULL, kvr_bench_now_ns());
        return;
    }
    evhttp_request_set_error_cb(req, on_error);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", c->lp->run->t->h.host_hdr);
    evhttp_add_header(h, "Content-Type", "application/json");
    evhttp_add_header(h, "Content-Length", b->len_str);
    evbuffer_add_reference(evhttp_request_get_output_buffer(req), b->data, b->len, NULL, NULL);
    c->t0 = kvr_bench_now_ns();
    if (evhttp_make_request(c->evcon, req, EVHTTP_REQ_POST, c->lp->run->t->route_path) != 0)
        failed(c, false, NULL, kvr_bench_now_ns()); /* evhttp freed req */
    else
        set_nodelay(c); /* a new connection's socket exists once the request is queued */
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    loop_t *lp = arg;
    uint64_t now = kvr_bench_now_ns();
    if (!should_stop(lp, now))
        return;
    if (lp->active == 0) {
        event_base_loopexit(lp->base, NULL);
    } else if (now - lp->stop_at > ROUTE_DRAIN_NS) {
        lp->stuck = lp->active;
        event_base_loopbreak(lp->base);
    }
}

static void *loop_main(void *arg)
{
    loop_t *lp = arg;
    const run_t *r = lp->run;
    uint64_t now = kvr_bench_now_ns();
    for (size_t i = 0; i < lp->n_clients; i++) {
        client_t *c = &lp->clients[i];
        /* paced clients start spread over one interval */
        c->next_at = r->start_ns + r->interval_ns / r->n_clients * c->index;
        if (c->next_at > now + 2000)
            wake_at(c, c->next_at - now);
        else
            send_route(c);
    }
    event_base_dispatch(lp->base);
    return NULL;
}

static void loop_deinit(loop_t *lp)
{
    for (size_t i = 0; lp->clients && i < lp->n_clients; i++) {
        if (lp->clients[i].evcon)
            evhttp_connection_free(lp->clients[i].evcon);
        if (lp->clients[i].wake)
            event_free(lp->clients[i].wake);
    }
    free(lp->clients);
    if (lp->tick)
        event_free(lp->tick);
    if (lp->base)
        event_base_free(lp->base);
    free(lp->ns);
}

static bool loop_init(loop_t *lp, run_t *r, size_t first, size_t n, const body_t *bodies,
                      size_t per)
{
    memset(lp, 0, sizeof *lp);
    lp->run = r;
    /* The changelist folds evhttp's per-request read/write interest toggles into one
     * epoll_ctl per change that survives the loop iteration (6 syscalls a request without). */
    struct event_config *cfg = event_config_new();
    if (cfg != NULL) {
        int flags = EVENT_BASE_FLAG_NOLOCK | EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST;
        /* Pacing needs exact wake-ups (timerfd, CLOCK_MONOTONIC): with the default coarse
         * clock every due client fires on the same 4 ms tick, and the bursts queue. */
        if (r->interval_ns > 0)
            flags |= EVENT_BASE_FLAG_PRECISE_TIMER;
        event_config_set_flag(cfg, flags);
        lp->base = event_base_new_with_config(cfg);
        event_config_free(cfg);
    }
    lp->clients = calloc(n, sizeof *lp->clients);
    if (lp->base == NULL || lp->clients == NULL)
        return false;
    lp->n_clients = n;
    lp->active = n;
    struct timeval tick = {0, ROUTE_TICK_MS * 1000}, timeout = {ROUTE_TIMEOUT_S, 0};
    lp->tick = event_new(lp->base, -1, EV_PERSIST, tick_cb, lp);
    if (lp->tick == NULL || event_add(lp->tick, &tick) != 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        client_t *c = &lp->clients[i];
        c->lp = lp;
        c->bodies = bodies + (first + i) * per;
        c->n_bodies = per;
        c->nodelay_fd = -1;
        c->evcon = evhttp_connection_base_new(lp->base, NULL, r->t->h.addr, r->t->h.port);
        c->index = first + i;
        c->wake = evtimer_new(lp->base, wake_cb, c);
        if (c->evcon == NULL || c->wake == NULL)
            return false;
        evhttp_connection_set_timeout_tv(c->evcon, &timeout);
        evhttp_connection_set_retries(c->evcon, 0);
        /* libevent writes at most 16 KB per loop iteration by default: a 128K-token body
         * (~900 KB) would take 55 writes and as many epoll round trips */
        struct bufferevent *bev = evhttp_connection_get_bufferevent(c->evcon);
        if (bev != NULL) {
            bufferevent_set_max_single_write(bev, ROUTE_MAX_SINGLE_IO);
            bufferevent_set_max_single_read(bev, ROUTE_MAX_SINGLE_IO);
        }
    }
    return true;
}

typedef struct run_result {
    double per_s, p50_us, p99_us, p999_us, concurrency, window_s;
    uint64_t ok, deletes;
    errs_t errs;
    uint64_t stuck;
    bool aborted;
} run_result_t;

/* One run of one point. false on a setup failure (message printed). */
static bool run_once(const kvr_bench_opts_t *o, const target_t *t, size_t clients,
                     const body_t *bodies, size_t per, run_result_t *res)
{
    memset(res, 0, sizeof *res);
    size_t n_loops = o->threads < clients ? o->threads : clients;
    loop_t *loops = calloc(n_loops, sizeof *loops);
    run_t *r = calloc(1, sizeof *r);
    bool ok = loops && r;
    if (ok) {
        r->t = t;
        r->update_state = o->update_state;
        r->target = o->requests;
        r->n_clients = clients;
        r->interval_ns = o->rate_per_s > 0 ? (uint64_t)((double)clients * 1e9 / o->rate_per_s) : 0;
        atomic_init(&r->done, 0);
        atomic_init(&r->stop, false);
        atomic_init(&r->end_ns, 0);
        atomic_init(&r->aborted, false);
    }
    for (size_t l = 0, first = 0; ok && l < n_loops; l++) {
        size_t n = clients / n_loops + (l < clients % n_loops);
        ok = loop_init(&loops[l], r, first, n, bodies, per);
        first += n;
    }
    if (!ok) {
        fprintf(stderr, "kvrouter bench route: cannot set up %zu clients (out of memory or "
                        "file descriptors?)\n", clients);
        goto out;
    }

    uint64_t start = kvr_bench_now_ns();
    r->start_ns = start;
    r->measure_start = start + (uint64_t)(o->warmup_s * 1e9);
    r->measure_end = o->requests > 0 ? UINT64_MAX
                                     : r->measure_start + (uint64_t)(o->duration_s * 1e9);
    size_t started = 0;
    for (size_t l = 1; l < n_loops; l++, started++)
        if (pthread_create(&loops[l].th, NULL, loop_main, &loops[l]) != 0)
            break;
    if (started + 1 < n_loops) {
        atomic_store(&r->stop, true);
        fprintf(stderr, "kvrouter bench route: cannot start %zu threads\n", n_loops);
        ok = false;
    }
    loop_main(&loops[0]);
    for (size_t l = 1; l <= started; l++)
        pthread_join(loops[l].th, NULL);
    if (!ok)
        goto out;

    bool aborted = atomic_load(&r->aborted);
    res->aborted = aborted;
    uint64_t end = o->requests > 0 ? atomic_load(&r->end_ns) : r->measure_end;
    size_t n = 0, n_ok = 0;
    double sum = 0;
    for (size_t l = 0; l < n_loops; l++)
        n_ok += loops[l].n_ns;
    for (size_t l = 0; l < n_loops; l++) {
        n += loops[l].n_ns;
        sum += loops[l].sum_ns;
        res->stuck += loops[l].stuck;
        res->deletes += loops[l].deletes;
        /* a run cut short, or one without a single answer, reports every phase's errors */
        const errs_t *e = aborted || n_ok == 0 ? &loops[l].errs_all : &loops[l].errs;
        for (size_t k = 0; k < e->n_kinds; k++)
            errs_add(&res->errs, e->k[k].del, e->k[k].code, e->k[k].n);
        if (e->other)
            errs_add(&res->errs, false, KIND_OTHER, e->other);
        if (loops[l].oom)
            ok = false;
    }
    if (!ok) {
        fprintf(stderr, "kvrouter bench route: out of memory for latency samples\n");
        goto out;
    }
    if (aborted || (o->requests > 0 && end == 0)) /* stopped before the window's end */
        end = kvr_bench_now_ns();
    double window_ns = end > r->measure_start ? (double)(end - r->measure_start) : NAN;
    double *all = malloc((n ? n : 1) * sizeof *all);
    if (all == NULL) {
        fprintf(stderr, "kvrouter bench route: out of memory\n");
        ok = false;
        goto out;
    }
    for (size_t l = 0, off = 0; l < n_loops; l++) {
        if (loops[l].n_ns > 0)
            memcpy(all + off, loops[l].ns, loops[l].n_ns * sizeof *all);
        off += loops[l].n_ns;
    }
    kvr_bench_lat_t lat;
    kvr_bench_summarize(all, n, &lat);
    free(all);
    res->ok = n;
    res->window_s = window_ns / 1e9;
    res->p50_us = lat.p50_us;
    res->p99_us = lat.p99_us;
    res->p999_us = lat.p999_us;
    res->per_s = aborted ? NAN : (double)n / (window_ns / 1e9);
    res->concurrency = aborted ? NAN : sum / window_ns;
out:
    for (size_t l = 0; loops && l < n_loops; l++)
        loop_deinit(&loops[l]);
    free(loops);
    free(r);
    return ok;
}

/* ---- points ----------------------------------------------------------------------------- */

static double target_per_s(uint64_t clients, uint64_t tokens)
{
    return clients == 32 && tokens == 1024 ? 30000.0 : NAN;
}

static double target_p99_us(uint64_t clients, uint64_t tokens)
{
    if (clients == 32 && tokens == 1024)
        return 1000.0;
    if (clients == 8 && tokens == 131072)
        return 2000.0;
    return NAN;
}

static int one_point(const kvr_bench_opts_t *o, const target_t *t, uint64_t clients,
                     uint64_t tokens)
{
    size_t per = bodies_per_client(clients, tokens);
    body_t *bodies = make_bodies(o, clients, tokens, per);
    double *fig = malloc((size_t)o->runs * 5 * sizeof *fig);
    if (bodies == NULL || fig == NULL) {
        fprintf(stderr, "kvrouter bench route: out of memory for %llu x %zu bodies of %llu "
                        "tokens\n", (unsigned long long)clients, per, (unsigned long long)tokens);
        free_bodies(bodies, (size_t)clients * per);
        free(fig);
        return 1;
    }
    double *r_per_s = fig, *r50 = fig + o->runs, *r99 = r50 + o->runs, *r999 = r99 + o->runs;
    double *rconc = r999 + o->runs;
    uint64_t ok_total = 0, stuck = 0;
    errs_t errs;
    memset(&errs, 0, sizeof errs);
    int rc = 0;
    unsigned runs = 0;
    char why[256] = "";
    while (runs < o->runs) {
        run_result_t res;
        if (!run_once(o, t, (size_t)clients, bodies, per, &res)) {
            rc = 1;
            break;
        }
        r_per_s[runs] = res.per_s, r50[runs] = res.p50_us, r99[runs] = res.p99_us;
        r999[runs] = res.p999_us, rconc[runs] = res.concurrency;
        runs++;
        ok_total += res.ok;
        stuck += res.stuck;
        for (size_t k = 0; k < res.errs.n_kinds; k++)
            errs_add(&errs, res.errs.k[k].del, res.errs.k[k].code, res.errs.k[k].n);
        if (res.errs.other)
            errs_add(&errs, false, KIND_OTHER, res.errs.other);
        double attempts = (double)(res.ok + res.deletes + res.errs.total);
        if (res.aborted) {
            snprintf(why, sizeof why, "run %u stopped early: almost every request fails", runs);
            rc = 1;
            break;
        }
        if (res.ok == 0) {
            snprintf(why, sizeof why, "no successful response in %.1f s", res.window_s);
            rc = 1;
            break;
        }
        if ((double)res.errs.total > ROUTE_FAIL_FRACTION * attempts) {
            snprintf(why, sizeof why, "%.3f%% of the requests of run %u failed (more than %g%%)",
                     100.0 * (double)res.errs.total / attempts, runs,
                     100.0 * ROUTE_FAIL_FRACTION);
            rc = 1;
            break;
        }
    }
    char kinds[1024];
    errs_format(&errs, kinds, sizeof kinds);
    if (runs > 0) {
        kvr_bench_row_t row;
        kvr_bench_row_init(&row, COLS, N_COLS);
        kvr_bench_set_str(&row, "bench", "route");
        kvr_bench_set_int(&row, "clients", (int64_t)clients);
        kvr_bench_set_int(&row, "tokens", (int64_t)tokens);
        kvr_bench_set_int(&row, "threads",
                          (int64_t)(o->threads < clients ? o->threads : clients));
        kvr_bench_set_int(&row, "runs", runs);
        kvr_bench_set_int(&row, "requests", (int64_t)ok_total);
        kvr_bench_set_num(&row, "per_s", kvr_bench_median(r_per_s, runs));
        kvr_bench_set_num(&row, "p50_us", kvr_bench_median(r50, runs));
        kvr_bench_set_num(&row, "p99_us", kvr_bench_median(r99, runs));
        kvr_bench_set_num(&row, "p999_us", kvr_bench_median(r999, runs));
        kvr_bench_set_num(&row, "concurrency", kvr_bench_median(rconc, runs));
        kvr_bench_set_int(&row, "errors", (int64_t)errs.total);
        kvr_bench_set_num(&row, "target_per_s", target_per_s(clients, tokens));
        kvr_bench_set_num(&row, "target_p99_us", target_p99_us(clients, tokens));
        kvr_bench_set_str(&row, "error_kinds", errs.total ? kinds : NULL);
        kvr_bench_set_str(&row, "update_state", o->update_state ? "true" : "false");
        kvr_bench_set_num(&row, "prefix_share", o->prefix_share);
        kvr_bench_set_num(&row, "duration_s", o->requests ? NAN : o->duration_s);
        kvr_bench_set_num(&row, "rate_per_s", o->rate_per_s > 0 ? o->rate_per_s : NAN);
        kvr_bench_set_str(&row, "url", o->url);
        kvr_bench_print_row(o, &row);
    }
    if (errs.total)
        fprintf(stderr, "kvrouter bench route: %llu errors (clients %llu, tokens %llu): %s\n",
                (unsigned long long)errs.total, (unsigned long long)clients,
                (unsigned long long)tokens, kinds);
    if (stuck)
        fprintf(stderr, "kvrouter bench route: %llu requests still unanswered %d s after the "
                        "window closed (abandoned)\n",
                (unsigned long long)stuck, (int)(ROUTE_DRAIN_NS / 1000000000u));
    double med_per_s = runs ? kvr_bench_median(r_per_s, runs) : NAN;
    if (o->rate_per_s > 0 && med_per_s < 0.97 * o->rate_per_s)
        fprintf(stderr, "kvrouter bench route: --rate %.0f not sustained (%.0f/s): the router "
                        "or the generator is saturated\n", o->rate_per_s, med_per_s);
    if (why[0])
        fprintf(stderr, "kvrouter bench route: FAILED against %s: %s\n", o->url, why);
    free_bodies(bodies, (size_t)clients * per);
    free(fig);
    return rc;
}

int kvr_bench_route(const kvr_bench_opts_t *o)
{
    static const kvr_bench_list_t def_clients = {1, {32}};
    static const kvr_bench_list_t def_tokens = {1, {1024}};
    const kvr_bench_list_t *clients = kvr_bench_pick(&o->clients, &def_clients);
    const kvr_bench_list_t *tokens = kvr_bench_pick(&o->tokens, &def_tokens);
    target_t t;
    char why[512];
    if (!parse_url(o->url, &t, why, sizeof why)) {
        fprintf(stderr, "kvrouter bench route: --url: %s\n", why);
        return 2;
    }
    if (!probe(&t))
        return 1;
    kvr_bench_print_header(o, COLS, N_COLS);
    for (size_t ti = 0; ti < tokens->n; ti++)
        for (size_t ci = 0; ci < clients->n; ci++) {
            int rc = one_point(o, &t, clients->v[ci], tokens->v[ti]);
            if (rc != 0)
                return rc;
        }
    return 0;
}
