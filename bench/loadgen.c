/*
 * loadgen.c: see loadgen.h. The engine both HTTP benchmarks share: clients, loops, pacing,
 * the window, error accounting, the drain.
 * Invariants: a client has at most one request outstanding; a response is counted in the window
 * only when it completes inside it; every error is counted once, by kind.
 * Ownership: bodies are the caller's; clients, loops and samples are the run's (freed by
 * kvr_lg_run, the samples handed to the caller). Threads: one per loop; they share the run's
 * atomics only. Cost: per request one evhttp request and one timestamp pair; the verdict
 * helpers are O(1).
 */
#include "loadgen.h"

#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/keyvalq_struct.h>

#include "bench.h"
#include "http/http.h"

/* ---- bodies and errors ---------------------------------------------------------------------- */

char *kvr_lg_put_u32(char *p, uint32_t v)
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

void kvr_lg_body_done(kvr_lg_body_t *b, const char *end)
{
    b->len = (size_t)(end - b->data);
    snprintf(b->len_str, sizeof b->len_str, "%zu", b->len);
}

void kvr_lg_free_bodies(kvr_lg_body_t *b, size_t n)
{
    for (size_t i = 0; b && i < n; i++)
        free(b[i].data);
    free(b);
}

kvr_lg_body_t *kvr_lg_make_bodies(uint64_t seed, uint64_t tokens, double prefix_share,
                                  size_t n_prefixes, uint32_t vocab, size_t n,
                                  kvr_lg_make_body_fn make, void *arg)
{
    size_t plen = (size_t)floor(prefix_share * (double)tokens + 0.5);
    kvr_lg_body_t *bodies = calloc(n, sizeof *bodies);
    uint32_t *pre = malloc((n_prefixes * plen + 1) * sizeof *pre);
    uint32_t *tok = malloc(((size_t)tokens + 1) * sizeof *tok);
    bool ok = bodies && pre && tok;
    kvr_bench_rng_t rng;
    kvr_bench_rng_seed(&rng, seed);
    for (size_t i = 0; ok && i < n_prefixes * plen; i++)
        pre[i] = (uint32_t)kvr_bench_rng_below(&rng, vocab);
    for (size_t b = 0; ok && b < n; b++) {
        if (plen > 0)
            memcpy(tok, pre + kvr_bench_rng_below(&rng, n_prefixes) * plen, plen * sizeof *tok);
        for (size_t i = plen; i < tokens; i++)
            tok[i] = (uint32_t)kvr_bench_rng_below(&rng, vocab);
        ok = make(&bodies[b], tok, (size_t)tokens, arg);
    }
    free(pre);
    free(tok);
    if (!ok) {
        kvr_lg_free_bodies(bodies, n);
        return NULL;
    }
    return bodies;
}

void kvr_lg_errs_add(kvr_lg_errs_t *e, int tag, int code, uint64_t n)
{
    e->total += n;
    for (size_t i = 0; i < e->n_kinds; i++)
        if (e->k[i].tag == tag && e->k[i].code == code) {
            e->k[i].n += n;
            return;
        }
    if (e->n_kinds == KVR_LG_MAX_KINDS) {
        e->other += n;
        return;
    }
    e->k[e->n_kinds++] = (kvr_lg_err_t){tag, code, n};
}

void kvr_lg_errs_merge(kvr_lg_errs_t *into, const kvr_lg_errs_t *e)
{
    for (size_t k = 0; k < e->n_kinds; k++)
        kvr_lg_errs_add(into, e->k[k].tag, e->k[k].code, e->k[k].n);
    if (e->other)
        kvr_lg_errs_add(into, 0, KVR_LG_OTHER, e->other);
}

static const char *kind_name(int code, const char *(*driver_kind)(int), char *buf, size_t len)
{
    static const char *evreq[] = {"timeout", "eof",       "bad-header",
                                  "buffer",  "cancelled", "too-long"};
    if (code > 0)
        snprintf(buf, len, "%d", code);
    else if (code == KVR_LG_OTHER)
        snprintf(buf, len, "other");
    else if (code <= KVR_LG_EVREQ && KVR_LG_EVREQ - code < 6)
        snprintf(buf, len, "%s", evreq[KVR_LG_EVREQ - code]);
    else if (code > KVR_LG_CONN && code < 0 && driver_kind != NULL)
        snprintf(buf, len, "%s", driver_kind(code));
    else
        snprintf(buf, len, "connect");
    return buf;
}

void kvr_lg_errs_format(const kvr_lg_errs_t *e, const char *const *tag_names,
                        const char *(*driver_kind)(int code), char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < e->n_kinds && off < len; i++) {
        char name[32];
        off += (size_t)snprintf(buf + off, len - off, "%s%s%s%s x%llu", i ? ", " : "",
                                tag_names ? tag_names[e->k[i].tag] : "", tag_names ? " " : "",
                                kind_name(e->k[i].code, driver_kind, name, sizeof name),
                                (unsigned long long)e->k[i].n);
    }
    if (e->other && off < len)
        snprintf(buf + off, len - off, "%sother x%llu", off ? ", " : "",
                 (unsigned long long)e->other);
}

/* ---- verdicts ------------------------------------------------------------------------------- */

bool kvr_lg_run_failed(const kvr_lg_verdict_in_t *v, char *why, size_t cap)
{
    if (v->aborted)
        snprintf(why, cap, "run %u stopped early: almost every request fails", v->run);
    else if (v->ok == 0)
        snprintf(why, cap, "no successful response in %.1f s", v->window_s);
    else if ((double)v->errors > v->fail_fraction * v->attempts)
        snprintf(why, cap, "%.3f%% of the requests of run %u failed (more than %g%%)",
                 100.0 * (double)v->errors / v->attempts, v->run, 100.0 * v->fail_fraction);
    else
        return false;
    return true;
}

void kvr_lg_report_stuck(const char *who, uint64_t stuck, uint64_t drain_ns)
{
    if (stuck)
        fprintf(stderr, "%s: %llu requests still unanswered %d s after the window closed "
                        "(abandoned)\n", who, (unsigned long long)stuck,
                (int)(drain_ns / 1000000000u));
}

/* ---- the run ---------------------------------------------------------------------------- */

typedef struct run {
    const kvr_lg_config_t *cfg;
    uint64_t start_ns, measure_start, measure_end; /* end: UINT64_MAX in requests mode */
    atomic_uint_fast64_t done;
    atomic_bool stop;
    atomic_uint_fast64_t end_ns;
    atomic_bool aborted;
} run_t;

typedef struct loop loop_t;

struct kvr_lg_client {
    loop_t *lp;
    struct evhttp_connection *evcon;
    struct event *wake; /* pacing and the pause after a connection failure */
    const kvr_lg_body_t *bodies;
    size_t n_bodies, next;
    size_t index;     /* among all the run's clients */
    uint64_t next_at; /* paced: when the next request is due (ns) */
    uint64_t t0;
    int fail; /* the last evhttp error reported for the request in flight */
    int nodelay_fd;
    void *state;
};

struct loop {
    run_t *run;
    struct event_base *base;
    struct event *tick;
    kvr_lg_client_t *clients;
    size_t n_clients;
    size_t active; /* clients with a request (or a wake-up) outstanding */
    bool stopping;
    uint64_t stop_at;
    double *ns;
    size_t n_ns, cap_ns;
    double sum_ns;
    uint64_t units, events, followups;
    bool oom;
    uint64_t stuck;
    uint64_t seen_ok, seen_err;
    kvr_lg_errs_t errs, errs_all;
    pthread_t th;
    bool started;
};

void *kvr_lg_state(kvr_lg_client_t *c) { return c->state; }
void *kvr_lg_arg(const kvr_lg_client_t *c) { return c->lp->run->cfg->drv_arg; }
struct evhttp_connection *kvr_lg_conn(const kvr_lg_client_t *c) { return c->evcon; }

static void send_req(kvr_lg_client_t *c);

static bool should_stop(loop_t *lp, uint64_t now)
{
    if (!lp->stopping && (now >= lp->run->measure_end || atomic_load(&lp->run->stop))) {
        lp->stopping = true;
        lp->stop_at = now;
    }
    return lp->stopping;
}

static void client_idle(kvr_lg_client_t *c)
{
    loop_t *lp = c->lp;
    if (--lp->active == 0)
        event_base_loopexit(lp->base, NULL);
}

static void wake_at(kvr_lg_client_t *c, uint64_t delay_ns)
{
    struct timeval tv = {(time_t)(delay_ns / 1000000000u),
                         (suseconds_t)(delay_ns % 1000000000u / 1000u)};
    evtimer_add(c->wake, &tv);
}

/* After a response: the next request (now, or when the pace says it is due), or nothing when
 * the window is over. */
static void next(kvr_lg_client_t *c, uint64_t now)
{
    if (should_stop(c->lp, now)) {
        client_idle(c);
        return;
    }
    uint64_t iv = c->lp->run->cfg->interval_ns;
    if (iv > 0) {
        c->next_at += iv;
        if (c->next_at + iv < now)
            c->next_at = now;
        if (c->next_at > now + 2000) {
            wake_at(c, c->next_at - now);
            return;
        }
    }
    send_req(c);
}

static bool in_window(const run_t *r, uint64_t t1)
{
    return t1 >= r->measure_start && t1 < r->measure_end && !atomic_load(&r->stop);
}

static void count_error(kvr_lg_client_t *c, int tag, int code, uint64_t t1)
{
    loop_t *lp = c->lp;
    if (in_window(lp->run, t1))
        kvr_lg_errs_add(&lp->errs, tag, code, 1);
    kvr_lg_errs_add(&lp->errs_all, tag, code, 1);
    if (++lp->seen_err >= lp->run->cfg->abort_errors && lp->seen_err > 10 * lp->seen_ok) {
        atomic_store(&lp->run->aborted, true);
        atomic_store(&lp->run->stop, true);
    }
}

static void record(kvr_lg_client_t *c, uint64_t t1, uint64_t units, uint64_t events)
{
    loop_t *lp = c->lp;
    run_t *r = lp->run;
    if (t1 < r->measure_start || t1 >= r->measure_end)
        return;
    if (r->cfg->requests > 0) {
        uint_fast64_t prev = atomic_fetch_add(&r->done, 1);
        if (prev >= r->cfg->requests)
            return;
        if (prev + 1 == r->cfg->requests) {
            atomic_store(&r->end_ns, t1);
            atomic_store(&r->stop, true);
        }
    } else if (atomic_load(&r->stop)) {
        return;
    }
    if (lp->n_ns == lp->cap_ns) {
        size_t cap = lp->cap_ns ? 2 * lp->cap_ns : (size_t)1 << 15;
        double *ns = realloc(lp->ns, cap * sizeof *ns);
        if (ns == NULL) {
            lp->oom = true;
            atomic_store(&r->stop, true);
            return;
        }
        lp->ns = ns, lp->cap_ns = cap;
    }
    lp->ns[lp->n_ns++] = (double)(t1 - c->t0);
    lp->sum_ns += (double)(t1 - c->t0);
    lp->units += units;
    lp->events += events;
}

void kvr_lg_on_error(enum evhttp_request_error err, void *client)
{
    kvr_lg_client_t *c = client;
    c->fail = KVR_LG_EVREQ - (int)err;
}

static void wake_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    kvr_lg_client_t *c = arg;
    if (should_stop(c->lp, kvr_bench_now_ns()))
        client_idle(c);
    else
        send_req(c);
}

/* A failed request: counted; after a connection failure (no status, or evhttp's reason) the
 * client pauses so a dead server is not spun on. */
static void failed(kvr_lg_client_t *c, int tag, int code, uint64_t t1)
{
    bool conn = code == 0 || code <= KVR_LG_CONN;
    count_error(c, tag, conn ? (c->fail ? c->fail : KVR_LG_CONN) : code, t1);
    c->fail = 0;
    if (conn && !should_stop(c->lp, t1)) {
        wake_at(c, (uint64_t)c->lp->run->cfg->retry_ms * 1000000u);
        return;
    }
    next(c, t1);
}

void kvr_lg_count_error(kvr_lg_client_t *c, int tag, int code)
{
    count_error(c, tag, code, kvr_bench_now_ns());
}

void kvr_lg_followup_done(kvr_lg_client_t *c, struct evhttp_request *req, bool ok, int tag)
{
    uint64_t t1 = kvr_bench_now_ns();
    if (!ok) {
        failed(c, tag, req ? evhttp_request_get_response_code(req) : 0, t1);
        return;
    }
    if (in_window(c->lp->run, t1))
        c->lp->followups++;
    next(c, t1);
}

static void req_done(struct evhttp_request *req, void *arg)
{
    kvr_lg_client_t *c = arg;
    uint64_t t1 = kvr_bench_now_ns();
    int code = req ? evhttp_request_get_response_code(req) : 0;
    if (code <= 0) {
        failed(c, 0, 0, t1);
        return;
    }
    uint64_t units = 0, events = 0;
    int kind = c->lp->run->cfg->drv->check(c, req, &units, &events);
    if (kind != KVR_LG_GOOD && kind != KVR_LG_LATER) {
        failed(c, 0, kind, t1);
        return;
    }
    c->lp->seen_ok++;
    record(c, t1, units, events);
    if (kind == KVR_LG_GOOD)
        next(c, t1);
}

static void send_req(kvr_lg_client_t *c)
{
    const kvr_lg_config_t *cfg = c->lp->run->cfg;
    const kvr_lg_body_t *b = &c->bodies[c->next];
    c->next = c->next + 1 == c->n_bodies ? 0 : c->next + 1;
    struct evhttp_request *req = evhttp_request_new(req_done, c);
    if (req == NULL) {
        failed(c, 0, KVR_LG_CONN, kvr_bench_now_ns());
        return;
    }
    evhttp_request_set_error_cb(req, kvr_lg_on_error);
    if (cfg->drv->prepare != NULL)
        cfg->drv->prepare(c, req);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", cfg->host_hdr);
    evhttp_add_header(h, "Content-Type",
                      cfg->content_type ? cfg->content_type : "application/json");
    evhttp_add_header(h, "Content-Length", b->len_str);
    evbuffer_add_reference(evhttp_request_get_output_buffer(req), b->data, b->len, NULL, NULL);
    c->t0 = kvr_bench_now_ns();
    if (evhttp_make_request(c->evcon, req, EVHTTP_REQ_POST, cfg->path) != 0)
        failed(c, 0, KVR_LG_CONN, kvr_bench_now_ns()); /* evhttp freed req */
    else
        kvr_http_nodelay(c->evcon, &c->nodelay_fd); /* a new connection's socket exists once the request is queued */
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
    } else if (now - lp->stop_at > lp->run->cfg->drain_ns) {
        lp->stuck = lp->active;
        event_base_loopbreak(lp->base);
    }
}

static void *loop_main(void *arg)
{
    loop_t *lp = arg;
    const run_t *r = lp->run;
    uint64_t now = kvr_bench_now_ns(), iv = r->cfg->interval_ns;
    for (size_t i = 0; i < lp->n_clients; i++) {
        kvr_lg_client_t *c = &lp->clients[i];
        /* paced clients start spread over one interval */
        c->next_at = r->start_ns + iv / r->cfg->clients * c->index;
        if (c->next_at > now + 2000)
            wake_at(c, c->next_at - now);
        else
            send_req(c);
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
        free(lp->clients[i].state);
    }
    free(lp->clients);
    if (lp->tick)
        event_free(lp->tick);
    if (lp->base)
        event_base_free(lp->base);
    free(lp->ns);
}

static bool client_init(loop_t *lp, kvr_lg_client_t *c, size_t index)
{
    const kvr_lg_config_t *cfg = lp->run->cfg;
    c->lp = lp;
    c->index = index;
    if (cfg->per_client > 0) {
        c->bodies = cfg->bodies + index * cfg->per_client;
        c->n_bodies = cfg->per_client;
    } else {
        c->bodies = cfg->bodies;
        c->n_bodies = cfg->n_bodies;
        c->next = index * cfg->n_bodies / cfg->clients;
    }
    c->nodelay_fd = -1;
    c->state = cfg->drv->state_bytes ? calloc(1, cfg->drv->state_bytes) : NULL;
    c->evcon = evhttp_connection_base_new(lp->base, NULL, cfg->addr, cfg->port);
    c->wake = evtimer_new(lp->base, wake_cb, c);
    if (c->evcon == NULL || c->wake == NULL || (cfg->drv->state_bytes && c->state == NULL))
        return false;
    struct timeval timeout = {cfg->timeout_s, 0};
    evhttp_connection_set_timeout_tv(c->evcon, &timeout);
    evhttp_connection_set_retries(c->evcon, 0);
    /* libevent writes at most 16 KB per loop iteration by default: a 128K-token body
     * (~900 KB) would take 55 writes and as many epoll round trips */
    struct bufferevent *bev = evhttp_connection_get_bufferevent(c->evcon);
    if (bev != NULL) {
        bufferevent_set_max_single_write(bev, cfg->max_single_io);
        bufferevent_set_max_single_read(bev, cfg->max_single_io);
    }
    return true;
}

static bool loop_init(loop_t *lp, run_t *r, size_t first, size_t n)
{
    memset(lp, 0, sizeof *lp);
    lp->run = r;
    /* The changelist folds evhttp's per-request read/write interest toggles into one
     * epoll_ctl per change that survives the loop iteration (6 syscalls a request without). */
    struct event_config *ec = event_config_new();
    if (ec != NULL) {
        int flags = EVENT_BASE_FLAG_NOLOCK | EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST;
        /* Pacing needs exact wake-ups (timerfd, CLOCK_MONOTONIC): with the default coarse
         * clock every due client fires on the same 4 ms tick, and the bursts queue. */
        if (r->cfg->interval_ns > 0)
            flags |= EVENT_BASE_FLAG_PRECISE_TIMER;
        event_config_set_flag(ec, flags);
        lp->base = event_base_new_with_config(ec);
        event_config_free(ec);
    }
    lp->clients = calloc(n, sizeof *lp->clients);
    if (lp->base == NULL || lp->clients == NULL)
        return false;
    lp->n_clients = n;
    lp->active = n;
    struct timeval tick = {0, (suseconds_t)r->cfg->tick_ms * 1000};
    lp->tick = event_new(lp->base, -1, EV_PERSIST, tick_cb, lp);
    if (lp->tick == NULL || event_add(lp->tick, &tick) != 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!client_init(lp, &lp->clients[i], first + i))
            return false;
    return true;
}

static void sleep_until(uint64_t ns)
{
    for (uint64_t now = kvr_bench_now_ns(); now < ns; now = kvr_bench_now_ns()) {
        uint64_t d = ns - now;
        struct timespec ts = {(time_t)(d / 1000000000u), (long)(d % 1000000000u)};
        nanosleep(&ts, NULL);
    }
}

/* The loops' figures into res. false when a loop ran out of memory for its samples. */
static bool collect(loop_t *loops, size_t n_loops, kvr_lg_result_t *res)
{
    size_t n = 0;
    for (size_t l = 0; l < n_loops; l++)
        n += loops[l].n_ns;
    res->ns = malloc((n ? n : 1) * sizeof *res->ns);
    if (res->ns == NULL)
        return false;
    bool ok = true;
    for (size_t l = 0; l < n_loops; l++) {
        loop_t *lp = &loops[l];
        if (lp->n_ns > 0)
            memcpy(res->ns + res->n_ns, lp->ns, lp->n_ns * sizeof *res->ns);
        res->n_ns += lp->n_ns;
        res->sum_ns += lp->sum_ns;
        res->units += lp->units;
        res->events += lp->events;
        res->followups += lp->followups;
        res->stuck += lp->stuck;
        /* a run cut short, or one without a single answer, reports every phase's errors */
        kvr_lg_errs_merge(&res->errs, res->aborted || n == 0 ? &lp->errs_all : &lp->errs);
        ok = ok && !lp->oom;
    }
    return ok;
}

bool kvr_lg_run(const kvr_lg_config_t *cfg, const char *who, kvr_lg_result_t *res)
{
    memset(res, 0, sizeof *res);
    size_t n_loops = cfg->threads < cfg->clients ? cfg->threads : cfg->clients;
    loop_t *loops = calloc(n_loops ? n_loops : 1, sizeof *loops);
    run_t *r = calloc(1, sizeof *r);
    bool ok = loops && r && n_loops > 0;
    if (ok) {
        r->cfg = cfg;
        atomic_init(&r->done, 0);
        atomic_init(&r->stop, false);
        atomic_init(&r->end_ns, 0);
        atomic_init(&r->aborted, false);
        r->start_ns = kvr_bench_now_ns();
        r->measure_start = r->start_ns + (uint64_t)(cfg->warmup_s * 1e9);
        r->measure_end =
            cfg->requests > 0 ? UINT64_MAX : r->measure_start + (uint64_t)(cfg->duration_s * 1e9);
    }
    for (size_t l = 0, first = 0; ok && l < n_loops; l++) {
        size_t n = cfg->clients / n_loops + (l < cfg->clients % n_loops);
        ok = loop_init(&loops[l], r, first, n);
        first += n;
    }
    if (!ok) {
        fprintf(stderr, "%s: cannot set up %zu clients (out of memory or file descriptors?)\n", who,
                cfg->clients);
        goto out;
    }
    for (size_t l = 0; l < n_loops && ok; l++) {
        ok = pthread_create(&loops[l].th, NULL, loop_main, &loops[l]) == 0;
        loops[l].started = ok;
    }
    if (ok && cfg->at_window != NULL) {
        sleep_until(r->measure_start);
        cfg->at_window(cfg->window_arg, false);
        sleep_until(r->measure_end);
        cfg->at_window(cfg->window_arg, true);
    } else if (!ok) {
        atomic_store(&r->stop, true);
        fprintf(stderr, "%s: cannot start %zu threads\n", who, n_loops);
    }
    for (size_t l = 0; l < n_loops; l++)
        if (loops[l].started)
            pthread_join(loops[l].th, NULL);
    if (!ok)
        goto out;
    res->aborted = atomic_load(&r->aborted);
    if (!collect(loops, n_loops, res)) {
        fprintf(stderr, "%s: out of memory for latency samples\n", who);
        free(res->ns);
        res->ns = NULL;
        ok = false;
        goto out;
    }
    uint64_t end = cfg->requests > 0 ? atomic_load(&r->end_ns) : r->measure_end;
    if (res->aborted || (cfg->requests > 0 && end == 0)) /* stopped before the window's end */
        end = kvr_bench_now_ns();
    res->window_ns = end > r->measure_start ? (double)(end - r->measure_start) : NAN;
out:
    for (size_t l = 0; loops && l < n_loops; l++)
        loop_deinit(&loops[l]);
    free(loops);
    free(r);
    return ok;
}
