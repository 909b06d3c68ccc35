/*
 * bench_route.c: `kvrouter bench route`: a closed-loop HTTP load generator for a running
 * router's `POST /v1/route`, measuring requests per second and the latency one client sees.
 * It shares the machine with the router, so its own cost (below) bounds what it can show.
 *
 * How: the benchmarks' one load generator (bench/loadgen.h): --clients keep-alive connections
 * spread over --threads event loops, each client with one request outstanding at all times
 * (closed loop). Latency is one CLOCK_MONOTONIC interval
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
 * Invariants: a point's bodies are made before its runs and freed after them; a run's verdict
 * is the load generator's (loadgen.h). The target is parsed and probed by http/client.h.
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
#include "loadgen.h"
#include "http/http.h"

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
#define ROUTE_MAX_SINGLE_IO ((size_t)4 << 20) /* bytes per read or write call */
#define ROUTE_MAX_ID 256
#define ROUTE_FAIL_FRACTION 0.01
#define ROUTE_ABORT_ERRORS 1000 /* errors (and 10 x the successes) that end a run early */

/* The driver's own error kind (loadgen.h has the others). */
#define KIND_NO_ID (-2) /* 2xx route response without a usable request_id */
enum { TAG_ROUTE = 0, TAG_DELETE = 1 };
static const char *const TAG_NAMES[] = {"route", "delete"};

static const char *driver_kind(int code)
{
    return code == KIND_NO_ID ? "no-request_id" : "connect";
}

/* ---- the target ------------------------------------------------------------------------- */

typedef struct target {
    kvr_http_target_t h;    /* host, Host header, numeric address (http/client.h) */
    char route_path[512];
    char delete_prefix[512];
    bool update_state; /* book, then DELETE (--update-state) */
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

static bool make_body(kvr_lg_body_t *b, const uint32_t *tok, size_t n, bool update_state)
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
        p = kvr_lg_put_u32(p, tok[i]);
    }
    size_t tl = strlen(tail);
    memcpy(p, tail, tl);
    kvr_lg_body_done(b, p + tl);
    return true;
}

/* Bodies per client that fit the budget (at least 1, at most ROUTE_MAX_BODIES). */
static size_t bodies_per_client(uint64_t clients, uint64_t tokens)
{
    size_t one = (size_t)tokens * 7 + 64;
    size_t k = ROUTE_BODY_BUDGET / (one * (size_t)clients);
    return k < 1 ? 1 : k > ROUTE_MAX_BODIES ? ROUTE_MAX_BODIES : k;
}

static bool route_body(kvr_lg_body_t *b, const uint32_t *tok, size_t n, void *arg)
{
    return make_body(b, tok, n, *(const bool *)arg);
}

/* clients * per bodies; client c owns [c * per, (c + 1) * per). */
static kvr_lg_body_t *make_bodies(const kvr_bench_opts_t *o, uint64_t clients, uint64_t tokens,
                                  size_t per)
{
    bool update_state = o->update_state;
    return kvr_lg_make_bodies(o->seed ^ kvr_bench_mix64(tokens ^ 0x70a7eu), tokens, o->prefix_share,
                              ROUTE_N_PREFIXES, ROUTE_MAX_TOKEN, (size_t)clients * per, route_body,
                              &update_state);
}

/* ---- the driver: route, then (with --update-state) DELETE the booking ------------------- */

static void delete_done(struct evhttp_request *req, void *arg)
{
    int code = req ? evhttp_request_get_response_code(req) : 0;
    kvr_lg_followup_done(arg, req, code >= 200 && code <= 299, TAG_DELETE);
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
static int send_delete(kvr_lg_client_t *c, struct evhttp_request *resp)
{
    const target_t *t = kvr_lg_arg(c);
    struct evbuffer *in = evhttp_request_get_input_buffer(resp);
    size_t n = evbuffer_get_length(in);
    const char *s = (const char *)evbuffer_pullup(in, -1);
    char id[ROUTE_MAX_ID];
    if (s == NULL || !find_request_id(s, n, id, sizeof id))
        return KIND_NO_ID;
    char *enc = evhttp_uriencode(id, -1, 0);
    char path[ROUTE_MAX_ID * 3 + 600];
    snprintf(path, sizeof path, "%s%s", t->delete_prefix, enc ? enc : id);
    free(enc);
    struct evhttp_request *req = evhttp_request_new(delete_done, c);
    if (req == NULL)
        return KVR_LG_CONN;
    evhttp_request_set_error_cb(req, kvr_lg_on_error);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", t->h.host_hdr);
    if (evhttp_make_request(kvr_lg_conn(c), req, EVHTTP_REQ_DELETE, path) != 0)
        return KVR_LG_CONN; /* evhttp freed req */
    return 0;
}

static int route_check(kvr_lg_client_t *c, struct evhttp_request *req, uint64_t *units,
                       uint64_t *events)
{
    (void)units, (void)events;
    int code = evhttp_request_get_response_code(req);
    if (code < 200 || code > 299)
        return code;
    const target_t *t = kvr_lg_arg(c);
    if (!t->update_state)
        return KVR_LG_GOOD;
    int kind = send_delete(c, req);
    if (kind == 0)
        return KVR_LG_LATER;
    /* the route was good; the booking could not be freed */
    kvr_lg_count_error(c, kind == KVR_LG_CONN ? TAG_DELETE : TAG_ROUTE, kind);
    return KVR_LG_GOOD;
}

static const kvr_lg_driver_t ROUTE_DRIVER = {.check = route_check};

typedef struct run_result {
    double per_s, p50_us, p99_us, p999_us, concurrency, window_s;
    uint64_t ok, deletes;
    kvr_lg_errs_t errs;
    uint64_t stuck;
    bool aborted;
} run_result_t;

/* One run of one point. false on a setup failure (message printed). */
static bool run_once(const kvr_bench_opts_t *o, const target_t *t, size_t clients,
                     const kvr_lg_body_t *bodies, size_t per, run_result_t *res)
{
    memset(res, 0, sizeof *res);
    kvr_lg_config_t cfg = {
        .drv = &ROUTE_DRIVER,
        .drv_arg = (void *)t,
        .addr = t->h.addr,
        .host_hdr = t->h.host_hdr,
        .port = t->h.port,
        .path = t->route_path,
        .clients = clients,
        .threads = o->threads,
        .bodies = bodies,
        .n_bodies = clients * per,
        .per_client = per,
        .warmup_s = o->warmup_s,
        .duration_s = o->duration_s,
        .requests = o->requests,
        .interval_ns = o->rate_per_s > 0 ? (uint64_t)((double)clients * 1e9 / o->rate_per_s) : 0,
        .timeout_s = ROUTE_TIMEOUT_S,
        .tick_ms = ROUTE_TICK_MS,
        .retry_ms = ROUTE_RETRY_MS,
        .drain_ns = ROUTE_DRAIN_NS,
        .abort_errors = ROUTE_ABORT_ERRORS,
        .max_single_io = ROUTE_MAX_SINGLE_IO,
    };
    kvr_lg_result_t lg;
    if (!kvr_lg_run(&cfg, "kvrouter bench route", &lg))
        return false;
    kvr_bench_lat_t lat;
    kvr_bench_summarize(lg.ns, lg.n_ns, &lat);
    free(lg.ns);
    res->aborted = lg.aborted;
    res->errs = lg.errs;
    res->stuck = lg.stuck;
    res->deletes = lg.followups;
    res->ok = lg.n_ns;
    res->window_s = lg.window_ns / 1e9;
    res->p50_us = lat.p50_us;
    res->p99_us = lat.p99_us;
    res->p999_us = lat.p999_us;
    res->per_s = lg.aborted ? NAN : (double)lg.n_ns / (lg.window_ns / 1e9);
    res->concurrency = lg.aborted ? NAN : lg.sum_ns / lg.window_ns;
    return true;
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
                     uint64_t tokens, double *per_s_out)
{
    size_t per = bodies_per_client(clients, tokens);
    kvr_lg_body_t *bodies = make_bodies(o, clients, tokens, per);
    double *fig = malloc((size_t)o->runs * 5 * sizeof *fig);
    if (bodies == NULL || fig == NULL) {
        fprintf(stderr, "kvrouter bench route: out of memory for %llu x %zu bodies of %llu "
                        "tokens\n", (unsigned long long)clients, per, (unsigned long long)tokens);
        kvr_lg_free_bodies(bodies, (size_t)clients * per);
        free(fig);
        return 1;
    }
    double *r_per_s = fig, *r50 = fig + o->runs, *r99 = r50 + o->runs, *r999 = r99 + o->runs;
    double *rconc = r999 + o->runs;
    uint64_t ok_total = 0, stuck = 0;
    kvr_lg_errs_t errs;
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
        kvr_lg_errs_merge(&errs, &res.errs);
        kvr_lg_verdict_in_t v = {.run = runs, .aborted = res.aborted, .ok = res.ok,
                                 .errors = res.errs.total,
                                 .attempts = (double)(res.ok + res.deletes + res.errs.total),
                                 .window_s = res.window_s, .fail_fraction = ROUTE_FAIL_FRACTION};
        if (kvr_lg_run_failed(&v, why, sizeof why)) {
            rc = 1;
            break;
        }
    }
    char kinds[1024];
    kvr_lg_errs_format(&errs, TAG_NAMES, driver_kind, kinds, sizeof kinds);
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
    kvr_lg_report_stuck("kvrouter bench route", stuck, ROUTE_DRAIN_NS);
    double med_per_s = runs ? kvr_bench_median(r_per_s, runs) : NAN;
    if (per_s_out != NULL)
        *per_s_out = med_per_s;
    if (o->rate_per_s > 0 && med_per_s < 0.97 * o->rate_per_s)
        fprintf(stderr, "kvrouter bench route: --rate %.0f not sustained (%.0f/s): the router "
                        "or the generator is saturated\n", o->rate_per_s, med_per_s);
    if (why[0])
        fprintf(stderr, "kvrouter bench route: FAILED against %s: %s\n", o->url, why);
    kvr_lg_free_bodies(bodies, (size_t)clients * per);
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
    t.update_state = o->update_state;
    kvr_bench_print_header(o, COLS, N_COLS);
    for (size_t ti = 0; ti < tokens->n; ti++)
        for (size_t ci = 0; ci < clients->n; ci++) {
            int rc = one_point(o, &t, clients->v[ci], tokens->v[ti], NULL);
            if (rc != 0)
                return rc;
        }
    return 0;
}

int kvr_bench_route_point(const kvr_bench_opts_t *o, uint64_t clients, uint64_t tokens,
                          double *per_s)
{
    target_t t;
    char why[512];
    *per_s = NAN;
    if (!parse_url(o->url, &t, why, sizeof why)) {
        fprintf(stderr, "kvrouter bench: --url: %s\n", why);
        return 2;
    }
    if (!probe(&t))
        return 1;
    t.update_state = o->update_state;
    return one_point(o, &t, clients, tokens, per_s);
}
