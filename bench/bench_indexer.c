/*
 * bench_indexer.c: `kvrouter bench indexer`: the standalone indexer and routers using it, as
 * real processes on loopback, three figures:
 *
 *   query    an indexer (`kvrouter indexer` child) holding --pairs (1M) (worker, block) pairs
 *            of --workers (64) engines: this process runs the engines' publishers (ZeroMQ
 *            PUB, events/kv_publisher.c), each storing --prompts-per-worker prompts of --blocks
 *            (512) blocks drawn from a pool of shared prompts (so a prompt has several
 *            holders). Then closed-loop POST /query_by_hash of whole 512-block prompts from
 *            --clients (32) keep-alive connections (bench/loadgen.c, one thread) for
 *            --duration s: queries/s and latency p50/p99/p999 (the indexer answers on one
 *            thread, one core; the load generator has the other).
 *   route    the decision's cost with a remote index: router L (its own index, fed by the same
 *            publishers) and router R (--remote-indexer the indexer), the same workers by id;
 *            one client, POST /v1/route (update_state false) of the same prompts, closed loop:
 *            p50 of each and R - L (the added cost: an HTTP round trip and the answer).
 *   peers    a second indexer started with --peers the first: from its spawn to its
 *            "listening" line (the dump fetched, read twice, applied), and its pairs = the
 *            first's.
 * Targets (the issue's): query >= 20,000/s with p99 <= 500 us; route adds <= 150 us p50;
 * peer recovery of 1M pairs <= 3 s. The numbers are this machine's, printed as measured.
 * Threads: main (setup, publishing, polling), the load generator's.
 * Children: the indexers and routers (apps/child.h), stopped at the end.
 * Invariants: every child started is stopped before the benchmark returns (in reverse order).
 * Memory: prompts, bodies and samples are owned here. Cost: the setup's publishing dominates
 * the wall time; the measured windows are the children's.
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "apps/child.h"
#include "apps/cli.h"
#include "bench.h"
#include "loadgen.h"
#include "events/kv_publisher.h"
#include "wire/kv_encode.h"

#define BS 16
#define MAX_WORKERS 256
#define VOCAB 150000
#define PAIRS_SAMPLE "kvr_indexer_pairs{model_name=\"default\",routing_group=\"default\"}"

typedef struct ix_args {
    uint64_t pairs, workers, blocks, clients;
    double duration_s;
} ix_args_t;

typedef struct env {
    char dir[512];
    kvr_child_t kids[6];
    size_t n_kids;
    void *zctx;
    kvr_kv_pub_t *pub[MAX_WORKERS];
    int ev_port[MAX_WORKERS];
    size_t n_pub;
    uint64_t n_prompts, per_worker;
    uint32_t *tokens; /* n_prompts x blocks x BS */
} env_t;

static kvr_child_t *spawn(env_t *e, const char *what, char **argv)
{
    kvr_child_t *c = &e->kids[e->n_kids];
    if (!kvr_bench_spawn(c, e->dir, what, argv, "kvrouter bench indexer"))
        return NULL;
    e->n_kids++;
    return c;
}

static const uint32_t *prompt_tokens(const env_t *e, const ix_args_t *a, uint64_t p)
{
    return e->tokens + p * a->blocks * BS;
}

/* The engines and the pool of prompts (each worker stores per_worker of them, the pool
 * spread evenly so each prompt has workers * per_worker / n_prompts holders). */
static int engines_start(env_t *e, const ix_args_t *a)
{
    e->per_worker = a->pairs / a->workers / a->blocks;
    e->per_worker = e->per_worker ? e->per_worker : 1;
    e->n_prompts = a->workers * e->per_worker / 8 ? a->workers * e->per_worker / 8 : 1;
    e->tokens = malloc(e->n_prompts * a->blocks * BS * sizeof *e->tokens);
    if (e->tokens == NULL)
        return 1;
    for (uint64_t i = 0; i < e->n_prompts * a->blocks * BS; i++)
        e->tokens[i] = (uint32_t)(kvr_bench_mix64(i + 1) % VOCAB);
    e->zctx = zmq_ctx_new();
    for (size_t w = 0; w < a->workers; w++) {
        char ev[64], err[300];
        e->ev_port[w] = kvr_free_port();
        snprintf(ev, sizeof ev, "tcp://*:%d", e->ev_port[w]);
        kvr_kv_pub_config_t pc = {.endpoint = ev, .buffer_steps = 16, .hwm = 1000000};
        int st;
        if ((e->pub[w] = kvr_kv_pub_new(e->zctx, &pc, &st, err, sizeof err)) == NULL) {
            fprintf(stderr, "kvrouter bench indexer: engine %zu: %s\n", w, err);
            return 1;
        }
        e->n_pub++;
    }
    return 0;
}

static void engines_stop(env_t *e)
{
    for (size_t w = 0; w < e->n_pub; w++)
        kvr_kv_pub_free(e->pub[w]);
    if (e->zctx != NULL)
        zmq_ctx_term(e->zctx);
    free(e->tokens);
}

/* Waits until every publisher has subscribers (a SUB connected before the first batch). */
static bool engines_subscribed(env_t *e, size_t want, double timeout_s)
{
    double t0 = kvr_child_now_s();
    while (kvr_child_now_s() - t0 < timeout_s) {
        size_t ok = 0;
        for (size_t w = 0; w < e->n_pub; w++) {
            kvr_kv_pub_poll_subscriptions(e->pub[w]);
            kvr_kv_pub_stats_t ps;
            kvr_kv_pub_get_stats(e->pub[w], &ps);
            ok += ps.subscribers >= want;
        }
        if (ok == e->n_pub)
            return true;
        usleep(5000);
    }
    return false;
}

/* Each worker stores its prompts, one event of `blocks` blocks each. */
static int engines_publish(env_t *e, const ix_args_t *a)
{
    int st;
    kvr_kv_enc_config_t ec = {.format = KVR_KV_FMT_VLLM_ARRAY};
    kvr_kv_enc_t *enc = kvr_kv_enc_new(&ec, &st);
    uint64_t *hashes = malloc(a->blocks * sizeof *hashes);
    int rc = enc != NULL && hashes != NULL ? 0 : 1;
    for (size_t w = 0; w < a->workers && rc == 0; w++) {
        for (uint64_t k = 0; k < e->per_worker && rc == 0; k++) {
            uint64_t p = (w * e->per_worker + k) % e->n_prompts;
            for (uint64_t b = 0; b < a->blocks; b++) /* the engine's own block ids */
                hashes[b] = kvr_bench_mix64((w + 1) * 1000003 + p * 65537 + b);
            kvr_kv_enc_stored_t s = {.hashes = hashes,
                                     .n_hashes = a->blocks,
                                     .tokens = prompt_tokens(e, a, p),
                                     .n_tokens = a->blocks * BS,
                                     .block_size = BS,
                                     .medium = "GPU"};
            const uint8_t *bytes;
            size_t len;
            if (kvr_kv_enc_begin_batch(enc, 1789095808.0 + (double)k, false, 0) != KVR_OK ||
                kvr_kv_enc_add_stored(enc, &s) != KVR_OK ||
                kvr_kv_enc_end_batch(enc, &bytes, &len) != KVR_OK ||
                kvr_kv_pub_publish(e->pub[w], bytes, len, NULL) != KVR_OK)
                rc = 1;
        }
    }
    kvr_kv_enc_free(enc);
    free(hashes);
    return rc;
}

/* Polls sample on c until it reaches want (or timeout_s): the last value. */
static double wait_metric(const kvr_child_t *c, const char *sample, double want, double timeout_s)
{
    double t0 = kvr_child_now_s(), v = NAN;
    while (kvr_child_now_s() - t0 < timeout_s) {
        v = kvr_child_metric(c, sample);
        if (v >= want)
            break;
        usleep(20000);
    }
    return v;
}

/* CPU seconds (user + system) the process has used: /proc/PID/stat fields 14 and 15. */
static double cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command may hold spaces */
    unsigned long long ut = 0, st = 0;
    if (p == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return NAN;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* ---- the load ------------------------------------------------------------------------- */

static int ok_check(kvr_lg_client_t *c, struct evhttp_request *req, uint64_t *units,
                    uint64_t *events)
{
    (void)c, (void)units, (void)events;
    int code = evhttp_request_get_response_code(req);
    return code == 200 ? KVR_LG_GOOD : code;
}

static const kvr_lg_driver_t OK_DRIVER = {.check = ok_check};

/* A MessagePack string / unsigned integer (the bodies are written by hand: fixed shapes). */
static uint8_t *mp_str(uint8_t *p, const char *s)
{
    size_t n = strlen(s);
    *p++ = (uint8_t)(0xa0 | n); /* fixstr: the keys here are short */
    memcpy(p, s, n);
    return p + n;
}

static uint8_t *mp_u64(uint8_t *p, uint64_t v)
{
    *p++ = 0xcf;
    for (int i = 7; i >= 0; i--)
        *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

/* n /query_by_hash bodies in MessagePack: {"block_hashes": [u64...], "model_name": "default"}. */
static kvr_lg_body_t *make_mp_bodies(const env_t *e, const ix_args_t *a, size_t n)
{
    kvr_lg_body_t *b = calloc(n, sizeof *b);
    uint64_t *lbh = malloc(a->blocks * sizeof *lbh);
    for (size_t i = 0; b != NULL && lbh != NULL && i < n; i++) {
        long m = kvr_hash_blocks(prompt_tokens(e, a, i % e->n_prompts), a->blocks * BS, BS, NULL,
                                 lbh, a->blocks);
        uint8_t *p = (uint8_t *)(b[i].data = malloc(64 + a->blocks * 9));
        if (p == NULL || m < 0) {
            kvr_lg_free_bodies(b, n);
            b = NULL;
            break;
        }
        *p++ = 0x82;
        p = mp_str(p, "block_hashes");
        *p++ = 0xdd; /* array32 */
        for (int k = 3; k >= 0; k--)
            *p++ = (uint8_t)((uint64_t)m >> (8 * k));
        for (long k = 0; k < m; k++)
            p = mp_u64(p, lbh[k]);
        p = mp_str(p, "model_name");
        p = mp_str(p, "default");
        kvr_lg_body_done(&b[i], (const char *)p);
    }
    free(lbh);
    return b;
}

/* n bodies over the prompt pool: /query_by_hash (the prompt's local block hashes) or
 * /v1/route (its tokens, update_state false). */
static kvr_lg_body_t *make_bodies(const env_t *e, const ix_args_t *a, size_t n, bool by_hash)
{
    kvr_lg_body_t *b = calloc(n, sizeof *b);
    uint64_t *lbh = malloc(a->blocks * sizeof *lbh);
    for (size_t i = 0; b != NULL && lbh != NULL && i < n; i++) {
        const uint32_t *t = prompt_tokens(e, a, i % e->n_prompts);
        size_t cap = 64 + a->blocks * BS * 12 + a->blocks * 22;
        char *p = b[i].data = malloc(cap);
        if (p == NULL) {
            kvr_lg_free_bodies(b, n);
            b = NULL;
            break;
        }
        if (by_hash) {
            long m = kvr_hash_blocks(t, a->blocks * BS, BS, NULL, lbh, a->blocks);
            p += sprintf(p, "{\"model_name\":\"default\",\"block_hashes\":[");
            for (long k = 0; k < m; k++)
                p += sprintf(p, "%s%lld", k ? "," : "", (long long)lbh[k]);
            p += sprintf(p, "]}");
        } else {
            p += sprintf(p, "{\"update_state\":false,\"tokens\":[");
            for (size_t k = 0; k < a->blocks * BS; k++) {
                if (k)
                    *p++ = ',';
                p = kvr_lg_put_u32(p, t[k]);
            }
            p += sprintf(p, "]}");
        }
        kvr_lg_body_done(&b[i], p);
    }
    free(lbh);
    return b;
}

typedef struct load_result {
    double per_s;
    kvr_bench_lat_t lat;
    uint64_t ok, errors;
    pid_t server;       /* its CPU is sampled at the window's edges */
    double cpu0, cpu_s; /* the server's CPU seconds in the window */
} load_result_t;

static double cpu_s(pid_t pid);

static void at_window(void *arg, bool end)
{
    load_result_t *r = arg;
    double c = cpu_s(r->server);
    if (end)
        r->cpu_s = c - r->cpu0;
    else
        r->cpu0 = c;
}

static bool load(const kvr_child_t *c, const char *path, const char *ctype, size_t clients,
                 double duration_s, const kvr_lg_body_t *bodies, size_t n_bodies,
                 load_result_t *out)
{
    char host_hdr[160];
    snprintf(host_hdr, sizeof host_hdr, "%s", c->addr);
    const char *colon = strrchr(c->addr, ':');
    kvr_lg_config_t cfg = {.drv = &OK_DRIVER,
                           .addr = "127.0.0.1",
                           .host_hdr = host_hdr,
                           .port = (uint16_t)atoi(colon ? colon + 1 : "0"),
                           .path = path,
                           .content_type = ctype,
                           .clients = clients,
                           .threads = 1,
                           .bodies = bodies,
                           .n_bodies = n_bodies,
                           .warmup_s = 1.0,
                           .duration_s = duration_s,
                           .timeout_s = 10,
                           .tick_ms = 50,
                           .retry_ms = 50,
                           .drain_ns = 5000000000ull,
                           .abort_errors = 1000,
                           .at_window = at_window,
                           .window_arg = out};
    out->server = c->pid;
    kvr_lg_result_t lg;
    if (!kvr_lg_run(&cfg, "kvrouter bench indexer", &lg))
        return false;
    kvr_bench_summarize(lg.ns, lg.n_ns, &out->lat);
    free(lg.ns);
    out->ok = lg.n_ns;
    out->errors = lg.errs.total;
    out->per_s = lg.aborted ? NAN : (double)lg.n_ns / (lg.window_ns / 1e9);
    return !lg.aborted;
}

/* ---- the parts ------------------------------------------------------------------------ */

/* "1=tcp://127.0.0.1:P,2=..." for the indexer, or the routers' --worker flags. */
static char *workers_list(const env_t *e)
{
    char *s = malloc(e->n_pub * 40 + 1), *p = s;
    for (size_t w = 0; s != NULL && w < e->n_pub; w++)
        p += sprintf(p, "%s%zu=tcp://127.0.0.1:%d", w ? "," : "", w + 1, e->ev_port[w]);
    return s;
}

static int part_query(env_t *e, const ix_args_t *a, kvr_child_t **out_ix, double *pairs)
{
    char *workers = workers_list(e), budget[32];
    snprintf(budget, sizeof budget, "%llu", (unsigned long long)(a->pairs * 2));
    char *argv[] = {"kvrouter",  "indexer",      "--port", "0",           "--log-level",
                    "warn",      "--block-size", "16",     "--max-pairs", budget,
                    "--max-total-pairs", budget, "--workers", workers,    NULL};
    kvr_child_t *ix = workers ? spawn(e, "indexer", argv) : NULL;
    free(workers);
    if (ix == NULL || !engines_subscribed(e, 1, 30) || engines_publish(e, a) != 0)
        return 1;
    double want = (double)(a->workers * e->per_worker * a->blocks);
    double t0 = kvr_child_now_s();
    *pairs = wait_metric(ix, PAIRS_SAMPLE, want, 120);
    double load_s = kvr_child_now_s() - t0;
    printf("== query: an indexer holding %.0f pairs of %llu workers (%llu prompts of %llu "
           "blocks, %llu holders each); applied in %.2f s\n",
           *pairs, (unsigned long long)a->workers, (unsigned long long)e->n_prompts,
           (unsigned long long)a->blocks,
           (unsigned long long)(a->workers * e->per_worker / e->n_prompts), load_s);
    fflush(stdout);
    if (!(*pairs >= want))
        return 1;
    for (int form = 0; form < 2; form++) {
        kvr_lg_body_t *bodies =
            form == 0 ? make_bodies(e, a, e->n_prompts, true) : make_mp_bodies(e, a, e->n_prompts);
        load_result_t r;
        bool ok =
            bodies != NULL && load(ix, "/query_by_hash", form == 0 ? NULL : "application/msgpack",
                                   a->clients, a->duration_s, bodies, e->n_prompts, &r);
        kvr_lg_free_bodies(bodies, e->n_prompts);
        if (!ok)
            return 1;
        printf("query_by_hash  body %s  blocks %llu  clients %llu  per_s %.0f  (target >= 20000)  "
               "p50_us %.0f  p99_us %.0f  (target <= 500)  p999_us %.0f  errors %llu  "
               "indexer_cpu_us_per_query %.1f\n",
               form == 0 ? "json" : "msgpack", (unsigned long long)a->blocks,
               (unsigned long long)a->clients, r.per_s, r.lat.p50_us, r.lat.p99_us, r.lat.p999_us,
               (unsigned long long)r.errors, r.cpu_s / (double)(r.ok ? r.ok : 1) * 1e6);
        fflush(stdout);
    }
    *out_ix = ix;
    return 0;
}

static kvr_child_t *router(env_t *e, const char *what, const char *remote, double pairs)
{
    char *argv[8 + 2 * MAX_WORKERS + 4], spec[MAX_WORKERS][64], budget[32];
    size_t k = 0;
    const char *fixed[] = {"kvrouter",     "serve", "--http-port",      "0", "--log-level", "warn",
                           "--block-size", "16",    "--index-max-pairs"};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
        argv[k++] = (char *)fixed[i];
    snprintf(budget, sizeof budget, "%.0f", pairs * 2 + 1024);
    argv[k++] = budget;
    if (remote != NULL) {
        argv[k++] = "--remote-indexer";
        argv[k++] = (char *)remote;
    }
    for (size_t w = 0; w < e->n_pub; w++) {
        if (remote != NULL)
            snprintf(spec[w], sizeof spec[w], "id=%zu", w + 1);
        else
            snprintf(spec[w], sizeof spec[w], "id=%zu,events=tcp://127.0.0.1:%d", w + 1,
                     e->ev_port[w]);
        argv[k++] = "--worker";
        argv[k++] = spec[w];
    }
    argv[k] = NULL;
    return spawn(e, what, argv);
}

static int part_route(env_t *e, const ix_args_t *a, const kvr_child_t *ix, double pairs)
{
    char url[160];
    snprintf(url, sizeof url, "http://%s", ix->addr);
    kvr_child_t *l = router(e, "router-local", NULL, pairs);
    kvr_child_t *r = router(e, "router-remote", url, pairs);
    if (l == NULL || r == NULL || !engines_subscribed(e, 2, 30) || engines_publish(e, a) != 0)
        return 1;
    double held = wait_metric(l, "kvr_index_pairs", pairs, 120);
    kvr_lg_body_t *bodies = make_bodies(e, a, e->n_prompts, false);
    load_result_t rl, rr;
    bool ok = bodies != NULL && held >= pairs &&
              load(l, "/v1/route", NULL, 1, a->duration_s, bodies, e->n_prompts, &rl) &&
              load(r, "/v1/route", NULL, 1, a->duration_s, bodies, e->n_prompts, &rr);
    kvr_lg_free_bodies(bodies, e->n_prompts);
    if (!ok)
        return 1;
    double answered = kvr_child_metric(r, "kvr_remote_indexer_answered_total");
    double failed = kvr_child_metric(r, "kvr_remote_indexer_failures_total{cause=\"timeout\"}") +
                    kvr_child_metric(r, "kvr_remote_indexer_failures_total{cause=\"connect\"}");
    printf("== route: POST /v1/route (%llu-token prompts, update_state false), one client; "
           "router L holds %.0f pairs itself, router R asks the indexer\n",
           (unsigned long long)(a->blocks * BS), held);
    printf("route  local_p50_us %.0f  remote_p50_us %.0f  added_p50_us %.0f  (target <= 150)  "
           "local_p99_us %.0f  remote_p99_us %.0f  remote_answered %.0f  remote_failed %.0f\n",
           rl.lat.p50_us, rr.lat.p50_us, rr.lat.p50_us - rl.lat.p50_us, rl.lat.p99_us,
           rr.lat.p99_us, answered, failed);
    return 0;
}

static int part_peers(env_t *e, const kvr_child_t *ix, double pairs)
{
    char peer[160];
    snprintf(peer, sizeof peer, "http://%s", ix->addr);
    char budget[32];
    snprintf(budget, sizeof budget, "%.0f", pairs * 2 + 1024);
    char *argv[] = {"kvrouter",          "indexer", "--port",  "0",  "--log-level", "warn",
                    "--max-pairs",       budget,    "--max-total-pairs", budget,
                    "--peers",           peer,      NULL};
    double t0 = kvr_child_now_s();
    kvr_child_t *b = spawn(e, "indexer-peer", argv);
    double ready_s = kvr_child_now_s() - t0;
    if (b == NULL)
        return 1;
    double got = wait_metric(b, PAIRS_SAMPLE, pairs, 5); /* its first state snapshot */
    double events = kvr_child_metric(
        b, "kvr_indexer_recovered_events_total{model_name=\"default\",routing_group=\"default\"}");
    printf("== peers: a new indexer with --peers the first (%.0f pairs)\n", pairs);
    printf("peers  pairs %.0f  listening_s %.2f  (target <= 3, from spawn to listening)  "
           "recovered_pairs %.0f  recovered_events %.0f  equal %s\n",
           pairs, ready_s, got, events, got == pairs ? "yes" : "NO");
    return got == pairs ? 0 : 1;
}

/* ---- the command ----------------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out, "usage: kvrouter bench indexer [--pairs N] [--workers N] [--blocks N] "
                 "[--clients N] [--duration S]\n\n"
                 "The standalone indexer: POST /query_by_hash of --blocks (512)-block prompts\n"
                 "against --pairs (1000000) pairs of --workers (64) engines from --clients (32)\n"
                 "connections for --duration (5) s; a router's decision with a remote indexer\n"
                 "against its own index; a new indexer recovering from a peer.\n");
}

static int parse_option(kvr_cli_t *c, void *arg)
{
    ix_args_t *a = arg;
    if (kvr_cli_is(c, "--pairs"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1024, 100000000, &a->pairs);
    if (kvr_cli_is(c, "--workers"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, MAX_WORKERS, &a->workers);
    if (kvr_cli_is(c, "--blocks"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, 4096, &a->blocks);
    if (kvr_cli_is(c, "--clients"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, 1024, &a->clients);
    if (kvr_cli_is(c, "--duration"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->duration_s);
    return -1;
}

int kvr_bench_indexer(int argc, char **argv)
{
    ix_args_t a = {.pairs = 1048576, .workers = 64, .blocks = 512, .clients = 32, .duration_s = 5};
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter bench indexer", argc, argv);
    int rc = kvr_cli_parse(&c, parse_option, &a, usage);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    signal(SIGPIPE, SIG_IGN);
    env_t e = {.n_kids = 0};
    if (!kvr_bench_workdir(e.dir, sizeof e.dir, "bench-indexer", "kvrouter bench indexer"))
        return 1;
    kvr_child_t *ix = NULL;
    double pairs = 0;
    rc = engines_start(&e, &a);
    if (rc == 0)
        rc = part_query(&e, &a, &ix, &pairs);
    if (rc == 0)
        rc = part_route(&e, &a, ix, pairs);
    if (rc == 0)
        rc = part_peers(&e, ix, pairs);
    kvr_bench_children_stop(e.kids, e.n_kids);
    engines_stop(&e);
    kvr_bench_workdir_end(e.dir, rc, "kvrouter bench indexer");
    return rc;
}
